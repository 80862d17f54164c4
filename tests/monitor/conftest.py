"""Fixtures for the GPU monitor tests (helpers live in monitor_support.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import missing as skip_or_fail  # skip, or fail in CI
from tests.monitor.monitor_support import (
    ARTIFACTS,
    EXTENSION_DIR,
    RunningServer,
    start_server,
    stop_server,
)


@pytest.fixture(scope="module")
def pinned_server(tmp_path_factory):
    """Four simulated GPUs on the machine; this server owns only the third."""
    tmp = tmp_path_factory.mktemp("pinned")
    server = start_server(tmp, {"WORKBENCH_SIMULATED_GPUS": "4", "WORKBENCH_GPUS": "GPU-sim-02-h100-80gb"})
    yield server
    stop_server(server)


@pytest.fixture
def server_factory(tmp_path):
    started = []

    def factory(env: dict, **kwargs) -> RunningServer:
        sub = tmp_path / f"s{len(started)}"
        sub.mkdir()
        server = start_server(sub, env, **kwargs)
        started.append(server)
        return server

    yield factory
    for server in started:
        stop_server(server)


@pytest.fixture
def artifacts_dir() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@pytest.fixture
def labextension_built() -> None:
    """The browser tests need the JupyterLab extension's frontend, built in the checkout or installed."""
    built = EXTENSION_DIR / "workbench_gpu_monitor" / "labextension" / "package.json"
    installed = Path(sys.prefix) / "share" / "jupyter" / "labextensions" / "workbench-gpu-monitor" / "package.json"
    if not (built.exists() or installed.exists()):
        skip_or_fail("the labextension is neither built (jlpm build in extensions/gpu-monitor) nor installed")
