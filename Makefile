# GPU Workbench: `make run` starts the hub, `make test` runs every test.
# Both create and reuse .venv, node_modules, the workbench-devices and GPU monitor wheels;
# nothing needs installing by hand.

PYTHON ?= python3
VENV   := .venv
BIN    := $(abspath $(VENV)/bin)
# The PyTorch the local backend's servers use. The default is the CPU wheel
# that lies on this machine kind's disk; on a CUDA workstation pick a CUDA
# build, e.g. make run TORCH="torch==2.7.1 --index-url https://download.pytorch.org/whl/cu126"
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

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

.PHONY: run test test-unit test-ts test-images install clean

run: install
	$(BIN)/jupyterhub -f hub/jupyterhub_config.py

test: install
	cd $(MONITOR) && PATH="$(BIN):$$PATH" jlpm test
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-unit: install
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

test-images:
	images/build-test-images.sh

install: $(STAMP) node_modules/.bin/configurable-http-proxy

$(VENV)/.tools:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# jupyterlab brings jlpm (the extension's build tool); build + hatch build the wheel.
	$(BIN)/pip install --quiet jupyterlab==4.6.6 build==1.6.1 hatchling==1.33.0 hatch-jupyter-builder==0.10.0
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

$(STAMP): $(VENV)/.tools $(DEVICES_WHEEL) $(MONITOR_WHEEL) $(SSH_WHEEL) pyproject.toml Makefile
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet --force-reinstall --no-deps $(DEVICES)/dist/*.whl $(MONITOR)/dist/*.whl $(SSH)/dist/*.whl
	$(BIN)/pip install --quiet $(DEVICES)/dist/*.whl $(MONITOR)/dist/*.whl $(SSH)/dist/*.whl
	$(BIN)/pip install --quiet -e ".[singleuser,test]"
	# Kernels answer the GPU monitor's torch-memory question without a %load_ext.
	mkdir -p $(VENV)/etc/ipython
	printf 'c.InteractiveShellApp.extensions = ["workbench_gpu_monitor"]\n' > $(VENV)/etc/ipython/ipython_kernel_config.py
	install -D -m 0644 images/singleuser/overrides.json $(VENV)/share/jupyter/lab/settings/overrides.json  # no Jupyter news prompt
	touch $@

node_modules/.bin/configurable-http-proxy: package.json
	npm install --no-audit --no-fund
	touch $@

clean:
	rm -rf $(VENV) node_modules $(DEVICES)/dist $(MONITOR)/node_modules $(MONITOR)/dist $(MONITOR)/lib
