# GPU Workbench: `make run` starts the hub, `make test` runs every test.
# Both create and reuse .venv and node_modules; nothing needs installing by hand.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The PyTorch the local backend's servers use. The default is the CPU wheel
# that lies on this machine kind's disk; on a CUDA workstation pick a CUDA
# build, e.g. make run TORCH="torch==2.7.1 --index-url https://download.pytorch.org/whl/cu126"
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: run test test-unit test-images install clean

run: install
	$(BIN)/jupyterhub -f hub/jupyterhub_config.py

test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-unit: install
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

test-images:
	images/build-test-images.sh

install: $(STAMP) node_modules/.bin/configurable-http-proxy

$(STAMP): pyproject.toml extensions/gpu-monitor/pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e extensions/gpu-monitor
	$(BIN)/pip install --quiet -e ".[singleuser,test]"
	touch $(STAMP)

node_modules/.bin/configurable-http-proxy: package.json
	npm install --no-audit --no-fund
	touch $@

clean:
	rm -rf $(VENV) node_modules
