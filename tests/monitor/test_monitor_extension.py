"""The server extension's life cycle: loading starts one sampler thread, unloading stops it."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

pytest.importorskip("jupyter_server")

from tornado import web  # noqa: E402
from traitlets.config import Configurable  # noqa: E402

from tests.monitor import monitor_support  # noqa: E402,F401  (puts the extension on sys.path)
import workbench_gpu_monitor  # noqa: E402
from workbench_gpu_monitor.handlers import monitor_of  # noqa: E402
from workbench_gpu_monitor.sampler import SNAPSHOT_ENV  # noqa: E402


class FakeServerApp(Configurable):
    """What the extension uses of a ServerApp: its web app, loop, kernels and runtime dir."""

    def __init__(self, runtime_dir: str, loop: asyncio.AbstractEventLoop):
        super().__init__()
        self.web_app = web.Application(base_url="/")
        self.io_loop = type("Loop", (), {"asyncio_loop": loop})()
        self.kernel_manager = None
        self.runtime_dir = runtime_dir


def sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "gpu-monitor-sampler"]


def test_unload_stops_the_sampler_thread_and_removes_the_snapshot(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_SIMULATED_GPUS", "2")
    monkeypatch.setenv(SNAPSHOT_ENV, "")  # restored after the test; load sets it
    loop = asyncio.new_event_loop()
    serverapp = FakeServerApp(str(tmp_path), loop)
    before = set(sampler_threads())
    try:
        workbench_gpu_monitor._load_jupyter_server_extension(serverapp)
        monitor = monitor_of(serverapp)
        assert monitor is not None and len(set(sampler_threads()) - before) == 1
        assert os.path.exists(monitor.snapshot_path)

        workbench_gpu_monitor._unload_jupyter_server_extension(serverapp)
        assert set(sampler_threads()) - before == set(), "the sampler thread outlived the server"
        assert not os.path.exists(monitor.snapshot_path)
        workbench_gpu_monitor._unload_jupyter_server_extension(serverapp)  # a second unload is harmless
    finally:
        loop.close()


def test_unload_without_load_does_nothing(tmp_path):
    loop = asyncio.new_event_loop()
    try:
        workbench_gpu_monitor._unload_jupyter_server_extension(FakeServerApp(str(tmp_path), loop))
    finally:
        loop.close()
