"""Helpers for the GPU monitor tests: a real ``jupyter server`` / ``jupyter lab`` on loopback.

The server runs as a subprocess with simulated GPUs, the extension enabled by
a throw-away config dir, and the sources of the extension and of
workbench-devices on ``PYTHONPATH`` so the tests work from a checkout as well
as against installed wheels.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ARTIFACTS as ARTIFACTS  # re-exported for the monitor tests
from tests.conftest import free_port

requests = pytest.importorskip("requests")

REPO = Path(__file__).resolve().parents[2]
EXTENSION_DIR = REPO / "extensions" / "gpu-monitor"
DEVICES_DIR = REPO / "devices"

# The per-GPU keys pinned for `GET api/gpu/metrics` and the stream
# ("Snapshot shape" in extensions/gpu-monitor/README.md).
PINNED_KEYS = {
    "uuid",
    "name",
    "memory_used_bytes",
    "memory_total_bytes",
    "utilization_percent",
    "temperature_c",
    "power_w",
    "processes",
}

for _source in (DEVICES_DIR, EXTENSION_DIR):
    if str(_source) not in sys.path:
        sys.path.insert(0, str(_source))


class RunningServer:
    def __init__(self, proc, url: str, token: str, log: Path, runtime_dir: Path):
        self.proc = proc
        self.url = url
        self.token = token
        self.log = log
        self.runtime_dir = runtime_dir

    def get(self, path: str, auth: bool = True, **kwargs):
        headers = kwargs.pop("headers", {})
        if auth:
            headers["Authorization"] = f"token {self.token}"
        return requests.get(self.url + path, headers=headers, timeout=10, **kwargs)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def start_server(
    tmp_path: Path,
    env_overrides: dict,
    app: str = "server",
    interval: float = 0.25,
    base_url: str = "/",
) -> RunningServer:
    port = free_port()
    token = secrets.token_hex(16)
    config_dir = tmp_path / "config"
    runtime_dir = tmp_path / "runtime"
    root = tmp_path / "root"
    for d in (config_dir, runtime_dir, root):
        d.mkdir(parents=True, exist_ok=True)
    config = {
        "ServerApp": {"jpserver_extensions": {"workbench_gpu_monitor": True}},
        "GPUMonitorServer": {"sample_interval": interval},
    }
    (config_dir / "jupyter_server_config.json").write_text(json.dumps(config))
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("WORKBENCH_GPUS", "CUDA_VISIBLE_DEVICES", "WORKBENCH_SIMULATED_GPUS", "JUPYTERHUB_API_TOKEN")
    }
    env.update(
        JUPYTER_CONFIG_DIR=str(config_dir),
        JUPYTER_RUNTIME_DIR=str(runtime_dir),
        JUPYTER_DATA_DIR=str(tmp_path / "data"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(EXTENSION_DIR), str(DEVICES_DIR), env.get("PYTHONPATH", "")])),
    )
    env.update(env_overrides)
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab" if app == "lab" else "jupyter_server",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--port-retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        f"--ServerApp.base_url={base_url}",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # CI containers often run as root
    if app == "lab":
        # Find the built labextension even when the package is not installed.
        ext = tmp_path / "labextensions"
        ext.mkdir(exist_ok=True)
        built = EXTENSION_DIR / "workbench_gpu_monitor" / "labextension"
        if built.joinpath("package.json").exists():
            (ext / "workbench-gpu-monitor").symlink_to(built)
        cmd.append(f"--LabServerApp.extra_labextensions_path={ext}")
    log = tmp_path / f"{app}.log"
    proc = subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=root)
    url = f"http://127.0.0.1:{port}{base_url}"
    server = RunningServer(proc, url, token, log, runtime_dir)
    deadline = time.time() + 90
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter {app} exited:\n{server.log_text()}")
        try:
            if server.get("api/status").status_code == 200:
                return server
        except requests.ConnectionError:
            pass
        time.sleep(0.3)
    stop_server(server)
    raise RuntimeError(f"jupyter {app} did not start in 90 s:\n{server.log_text()}")


def stop_server(server: RunningServer) -> None:
    if server.proc.poll() is None:
        server.proc.terminate()
        try:
            server.proc.wait(15)
        except subprocess.TimeoutExpired:
            server.proc.kill()
            server.proc.wait(5)


def kernel_ready(server: RunningServer, notebook: str, timeout: float = 90) -> None:
    """Wait until the notebook's kernel is idle and a lab tab is connected to it.

    The page's execution indicator says "idle" before the lab has connected to the kernel; a
    kernel killed, or a cell run, before that is lost on the page. The first connection also
    writes the kernel's language_info into the notebook, which marks it unsaved."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        session = next((s for s in server.get("api/sessions").json() if s["path"].endswith(notebook)), None)
        kernel = session and session["kernel"]
        if kernel and kernel["execution_state"] == "idle" and kernel["connections"] >= 1:
            return
        time.sleep(0.3)
    raise AssertionError(f"the kernel of {notebook} was not idle and connected within {timeout} s")
