"""The server extension's life cycle: the sampler thread starts with a real server and stops with it.

jupyter_server 2 calls shutdown hooks only on ``ExtensionApp`` instances
(``ServerApp._cleanup`` -> ``cleanup_extensions`` -> ``stop_all_extensions`` ->
``ExtensionApp.stop_extension``), so these tests stop a real ``jupyter server``
(and ``jupyter lab``) the ways a user server is stopped and look at what the
stop path leaves: its log line and the removed snapshot file.
"""

from __future__ import annotations

import itertools
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("jupyter_server")

from tests.monitor.monitor_support import RunningServer, requests, start_server, stop_server

STOPPED_LINE = "GPU monitor: sampler stopped"


def snapshot_file(server: RunningServer) -> Path:
    # GPUMonitorServer.snapshot_path's default: the runtime dir, named after the server's pid.
    return server.runtime_dir / f"gpu-monitor-{server.proc.pid}.json"


def started(tmp_path: Path, app: str = "server") -> RunningServer:
    server = start_server(tmp_path, {"WORKBENCH_SIMULATED_GPUS": "2"}, app=app)
    metrics = server.get("api/gpu/metrics")
    assert metrics.status_code == 200, metrics.text
    assert len(metrics.json()["gpus"]) == 2
    deadline = time.time() + 10
    while not snapshot_file(server).exists() and time.time() < deadline:
        time.sleep(0.1)
    assert snapshot_file(server).exists(), sorted(p.name for p in server.runtime_dir.iterdir())
    assert STOPPED_LINE not in server.log_text()
    return server


def assert_stopped_with_the_server(server: RunningServer) -> None:
    try:
        rc = server.proc.wait(30)
    except subprocess.TimeoutExpired:
        stop_server(server)
        pytest.fail(f"the server did not exit:\n{server.log_text()}")
    log = server.log_text()
    assert rc == 0, log
    assert STOPPED_LINE in log, f"the sampler was not stopped by the server's shutdown:\n{log}"
    # ... by ServerApp.cleanup_extensions(), which logs "Shutting down N extensions" first
    cleanup = re.search(r"Shutting down \d+ extensions?\n", log)
    assert cleanup is not None, log
    assert cleanup.end() <= log.index(STOPPED_LINE), log
    assert not snapshot_file(server).exists()


@pytest.mark.parametrize("app", ["server", "lab"])
def test_sigterm_stops_the_sampler(tmp_path, app):
    server = started(tmp_path, app)
    try:
        server.proc.send_signal(signal.SIGTERM)
        assert_stopped_with_the_server(server)
    finally:
        stop_server(server)


def test_api_shutdown_stops_the_sampler_and_closes_streams(tmp_path):
    server = started(tmp_path)
    try:
        stream = requests.get(
            server.url + "api/gpu/stream",
            headers={"Authorization": f"token {server.token}"},
            stream=True,
            timeout=10,
        )
        assert stream.status_code == 200
        lines = stream.iter_lines()
        assert any(line.startswith(b"data: ") for line in itertools.islice(lines, 5))

        answer = requests.post(
            server.url + "api/shutdown", headers={"Authorization": f"token {server.token}"}, timeout=30
        )
        assert answer.status_code in (200, 204), answer.text
        assert_stopped_with_the_server(server)
        for _ in lines:  # the stream ends (EOF) rather than hanging
            pass
    finally:
        stop_server(server)


def sampler_threads() -> list:
    import threading

    return [t for t in threading.enumerate() if t.name == "gpu-monitor-sampler"]


def test_stop_is_harmless_twice_and_without_a_loaded_monitor(tmp_path, monkeypatch):
    import asyncio

    from traitlets.config import Configurable

    from workbench_gpu_monitor.app import GPUMonitorApp
    from workbench_gpu_monitor.handlers import GPUMonitorServer
    from workbench_gpu_monitor.sampler import SNAPSHOT_ENV

    asyncio.run(GPUMonitorApp().stop_extension())  # the extension failed to load: nothing to stop

    monkeypatch.setenv("WORKBENCH_SIMULATED_GPUS", "1")
    monkeypatch.setenv(SNAPSHOT_ENV, "")  # restored after the test; start() sets it
    parent = Configurable()
    parent.runtime_dir = str(tmp_path)
    loop = asyncio.new_event_loop()
    before = set(sampler_threads())
    try:
        monitor = GPUMonitorServer(serverapp=parent)
        monitor.start(loop)
        assert Path(monitor.snapshot_path).exists()
        assert len(set(sampler_threads()) - before) == 1
        monitor.stop()
        assert not Path(monitor.snapshot_path).exists()
        assert set(sampler_threads()) - before == set(), "the sampler thread outlived stop()"
        monitor.stop()
    finally:
        loop.close()
