# GPU Workbench: `make run` starts the hub, `make test` runs every test.
# Both create and reuse .venv, node_modules, the workbench-devices and GPU monitor wheels;
# nothing needs installing by hand.

PYTHON ?= python3
comma  := ,
VENV   := .venv
BIN    := $(abspath $(VENV)/bin)
# The PyTorch the local backend's servers use. The default is the CPU wheel
# that lies on this machine kind's disk; on a CUDA workstation pick a CUDA
# build, e.g. make run TORCH="torch==2.7.1 --index-url https://download.pytorch.org/whl/cu126"
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed
# Every user server's Jupyter config: no npm registry (jlpm) call, no PyPI, news or update look-ups at
# start. In .venv's sys-prefix config dir, read by its jupyterhub-singleuser (the local backend, and Slurm
# jobs on this .venv); the single-user image installs the same file (images/singleuser/Dockerfile).
SERVER_CONFIG := $(VENV)/etc/jupyter/jupyter_server_config.py
PYTEST_ARGS ?=

# Exact versions of every third-party package, from one lock file made by `make lock`
# (uv pip compile) from pyproject.toml's ranges; .venv, CI and both images install from it.
LOCK        := requirements/lock.txt
# The version matrix: the lowest versions pyproject.toml's ranges allow (uv's --resolution lowest-direct) and the
# newest (uv's --upgrade), for `make test-lowest` and `make test-newest`, each in a venv of its own.
LOWEST_LOCK := requirements/lowest.txt
NEWEST_LOCK := requirements/newest.txt
EXTRAS      := docker,slurm,kubernetes,postgres,singleuser,test,dev
MATRIX_EXTRAS := docker slurm kubernetes postgres singleuser test
LOWEST      := .venv-lowest
NEWEST      := .venv-newest
UV          := $(BIN)/uv
# `make lock LOCK_ARGS=--upgrade` (or --upgrade-package jupyterhub) moves the pins on; without, kept pins stay.
LOCK_ARGS   ?=
# newest.txt always moves to the newest releases the ranges allow; lock-check keeps its pins (an upstream release
# must not fail CI: only a pyproject.toml that newest.txt no longer satisfies does).
NEWEST_ARGS ?= --upgrade

# The GPU inventory (pure Python), which the hub and the monitor both depend on.
DEVICES       := devices
DEVICES_WHEEL := $(DEVICES)/dist/.built
DEVICES_SRC   := $(shell find $(DEVICES)/workbench_devices -type f -not -path '*/__pycache__/*' 2>/dev/null) \
                 $(DEVICES)/pyproject.toml $(DEVICES)/README.md
# SSH through the hub (sshd behind jupyter-server-proxy, the SSH page), pure Python.
SSH           := extensions/ssh
SSH_WHEEL     := $(SSH)/dist/.built
SSH_SRC       := $(shell find $(SSH)/workbench_ssh $(SSH)/jupyter-config -type f -not -path '*/__pycache__/*' 2>/dev/null) \
                 $(SSH)/pyproject.toml $(SSH)/README.md
MONITOR       := extensions/gpu-monitor
MONITOR_WHEEL := $(MONITOR)/dist/.built
MONITOR_SRC   := $(shell find $(MONITOR)/src $(MONITOR)/style $(MONITOR)/workbench_gpu_monitor $(MONITOR)/jupyter-config \
                   -type f -not -path '*/labextension/*' -not -path '*/__pycache__/*' 2>/dev/null) \
                 $(MONITOR)/package.json $(MONITOR)/pyproject.toml $(MONITOR)/yarn.lock

.PHONY: run test test-unit test-ts test-lowest test-newest test-images install lint lock lock-check clean

run: install
	$(BIN)/jupyterhub -f hub/jupyterhub_config.py

# The whole suite: the extension's vitest, then pytest as three lanes side by side (tests/lanes.py: the
# Slurm, Kubernetes and browser tests; the local hubs' and the service's; everything else; each test runs
# once), the version matrix (test-lowest, test-newest) after two of them; WORKBENCH_MATRIX=0 leaves it out.
test: install
	cd $(MONITOR) && PATH="$(BIN):$$PATH" jlpm test
	$(BIN)/python tests/lanes.py $(PYTEST_ARGS)

test-unit: install
	$(BIN)/python -m pytest tests/unit tests/conformance -m "not integration" $(PYTEST_ARGS)

# The version matrix: the unit tests and the conformance suite's fake tiers against the lowest
# (requirements/lowest.txt) and the newest (requirements/newest.txt) versions pyproject.toml's ranges allow,
# each in its own venv (.venv-lowest, .venv-newest; reused). torch is the same local wheel as in .venv.
test-lowest test-newest: test-%: .venv-%/.installed
	.venv-$*/bin/python -m pytest tests/unit tests/conformance -m "not integration" $(PYTEST_ARGS)

$(LOWEST)/.installed $(NEWEST)/.installed: .venv-%/.installed: requirements/%.txt $(VENV)/.devtools \
    $(DEVICES_WHEEL) $(MONITOR_WHEEL) $(SSH_WHEEL) pyproject.toml Makefile
	test -x $(@D)/bin/python || $(PYTHON) -m venv $(@D)
	$(@D)/bin/pip install --quiet "$(TORCH)"
	$(UV) pip install --quiet --python $(@D)/bin/python -r $<
	$(UV) pip install --quiet --python $(@D)/bin/python --reinstall --no-deps \
	  $(DEVICES)/dist/*.whl $(MONITOR)/dist/*.whl $(SSH)/dist/*.whl -e .
	touch $@

# ruff (lint + format) on the Python tree, mypy on the product packages (pyproject.toml's [tool.mypy]), eslint +
# prettier on the GPU monitor's TypeScript; fails on any finding. mypy reads the installed dependencies (SQLAlchemy,
# kubernetes_asyncio, ...) and our own packages, so lint needs the whole .venv ($(STAMP)), not only the tools.
lint: $(STAMP) $(VENV)/.devtools $(MONITOR)/node_modules/.yarn-state.yml
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	cd $(MONITOR) && PATH="$(BIN):$$PATH" jlpm lint:check

$(MONITOR)/node_modules/.yarn-state.yml: $(VENV)/.tools $(MONITOR)/package.json $(MONITOR)/yarn.lock
	cd $(MONITOR) && PATH="$(BIN):$$PATH" jlpm install
	touch $@

# Our own packages are built from the tree, never taken from an index: uv sees their wheels
# (for their dependencies) and the lock names none of them.
UV_COMPILE = $(UV) pip compile --quiet pyproject.toml --universal --python-version 3.11 \
  --find-links $(DEVICES)/dist --find-links $(MONITOR)/dist --find-links $(SSH)/dist \
  --no-emit-package workbench-devices --no-emit-package workbench-gpu-monitor --no-emit-package workbench-ssh \
  --custom-compile-command "make lock" $(LOCK_ARGS)

lock: $(VENV)/.devtools $(DEVICES_WHEEL) $(MONITOR_WHEEL) $(SSH_WHEEL)
	$(UV_COMPILE) $(foreach e,$(subst $(comma), ,$(EXTRAS)),--extra $(e)) -o $(LOCK)
	$(UV_COMPILE) --resolution lowest-direct $(foreach e,$(MATRIX_EXTRAS),--extra $(e)) -o $(LOWEST_LOCK)
	$(UV_COMPILE) $(NEWEST_ARGS) $(foreach e,$(MATRIX_EXTRAS),--extra $(e)) -o $(NEWEST_LOCK)

# Fails when pyproject.toml changed and the lock files were not regenerated (`make lock`). The pins are kept
# (newest.txt's too), so a new upstream release alone does not fail it.
lock-check: $(VENV)/.devtools $(DEVICES_WHEEL) $(MONITOR_WHEEL) $(SSH_WHEEL)
	rm -rf $(VENV)/lock-check && mkdir -p $(VENV)/lock-check
	cp $(LOCK) $(LOWEST_LOCK) $(NEWEST_LOCK) $(VENV)/lock-check/
	$(MAKE) --no-print-directory lock LOCK=$(VENV)/lock-check/lock.txt LOWEST_LOCK=$(VENV)/lock-check/lowest.txt \
	  NEWEST_LOCK=$(VENV)/lock-check/newest.txt NEWEST_ARGS=
	diff -u $(LOCK) $(VENV)/lock-check/lock.txt && diff -u $(LOWEST_LOCK) $(VENV)/lock-check/lowest.txt \
	  && diff -u $(NEWEST_LOCK) $(VENV)/lock-check/newest.txt \
	  || { echo "requirements/ is out of date with pyproject.toml: run make lock" >&2; exit 1; }

test-images:
	images/build-test-images.sh

install: $(STAMP) $(SERVER_CONFIG) node_modules/.bin/configurable-http-proxy

$(SERVER_CONFIG): images/singleuser/jupyter_server_config.py $(VENV)/.tools
	install -D -m 0644 $< $@

$(VENV)/.tools:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# jupyterlab brings jlpm (the extension's build tool); build + hatch build the wheels.
	# Their versions come from the lock.
	$(BIN)/pip install --quiet -c $(LOCK) jupyterlab build hatchling hatch-jupyter-builder
	touch $@

# uv (the lock, the matrix venvs), ruff, mypy and its stubs, at the lock's versions, for lint/lock/test-lowest/
# test-newest without the whole install; $(STAMP) installs them too (the dev extra).
$(VENV)/.devtools: $(VENV)/.tools $(LOCK)
	$(BIN)/pip install --quiet -c $(LOCK) uv ruff mypy types-PyYAML types-requests types-jsonschema types-docker
	touch $@

# workbench-devices is built and installed first: the monitor's wheel and the
# root package depend on it, and pip finds it installed rather than on an index.
$(DEVICES_WHEEL): $(VENV)/.tools $(DEVICES_SRC)
	rm -rf $(DEVICES)/dist
	$(BIN)/python -m build --wheel --no-isolation --outdir $(DEVICES)/dist $(DEVICES)
	$(BIN)/pip install --quiet --force-reinstall --no-deps $(DEVICES)/dist/*.whl
	touch $@

$(SSH_WHEEL): $(VENV)/.tools $(SSH_SRC)
	rm -rf $(SSH)/dist
	$(BIN)/python -m build --wheel --no-isolation --outdir $(SSH)/dist $(SSH)
	touch $@

# The GPU monitor ships as a wheel with the prebuilt JupyterLab extension,
# exactly as the user image installs it.
$(MONITOR_WHEEL): $(VENV)/.tools $(DEVICES_WHEEL) $(MONITOR_SRC)
	rm -rf $(MONITOR)/dist
	cd $(MONITOR) && export PATH="$(BIN):$$PATH" \
	  && jlpm install && jlpm clean:all && python -m build --wheel --no-isolation .
	touch $@

$(STAMP): $(VENV)/.tools $(DEVICES_WHEEL) $(MONITOR_WHEEL) $(SSH_WHEEL) pyproject.toml $(LOCK) Makefile
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet --force-reinstall --no-deps $(DEVICES)/dist/*.whl $(MONITOR)/dist/*.whl $(SSH)/dist/*.whl
	$(BIN)/pip install --quiet -c $(LOCK) $(DEVICES)/dist/*.whl $(MONITOR)/dist/*.whl $(SSH)/dist/*.whl
	$(BIN)/pip install --quiet -c $(LOCK) -e ".[$(EXTRAS)]"
	# Kernels answer the GPU monitor's torch-memory question without a %load_ext.
	mkdir -p $(VENV)/etc/ipython
	printf 'c.InteractiveShellApp.extensions = ["workbench_gpu_monitor"]\n' > $(VENV)/etc/ipython/ipython_kernel_config.py
	install -D -m 0644 images/singleuser/overrides.json $(VENV)/share/jupyter/lab/settings/overrides.json  # no Jupyter news prompt
	touch $@

node_modules/.bin/configurable-http-proxy: package.json
	npm install --no-audit --no-fund
	touch $@

clean:
	rm -rf $(VENV) $(LOWEST) $(NEWEST) node_modules $(DEVICES)/dist $(SSH)/dist $(MONITOR)/node_modules $(MONITOR)/dist $(MONITOR)/lib
