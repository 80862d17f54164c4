"""The server extension as a jupyter_server ``ExtensionApp``, so the sampler stops with the server.

jupyter_server 2 runs shutdown hooks only for ``ExtensionApp`` instances: on
SIGTERM, on ``POST api/shutdown``, on ``shutdown_no_activity_timeout`` and on a
confirmed Ctrl-C in a terminal, ``ServerApp._cleanup`` awaits
``ExtensionManager.stop_all_extensions()``, which awaits ``stop_extension()`` of
each ExtensionApp and of nothing else; a plain module extension has no such
hook.  (A SIGINT without a terminal ends the event loop with KeyboardInterrupt
and no cleanup at all; then only the monitor's atexit hook removes the
snapshot file, and the daemon sampler thread dies with the process.)
"""

from __future__ import annotations

from jupyter_server.extension.application import ExtensionApp

from .handlers import (
    MEMORY_KEY,
    SETTINGS_KEY,
    GPUMetricsHandler,
    GPUMonitorServer,
    GPUStreamHandler,
    MemoryCgroupHandler,
)
from .memory_cgroup import MemoryWatcher
from .notices import GPUNoticesHandler, write_for_kernels
from .saves import SAVES_KEY, GPUSavesHandler, SaveRounds


class GPUMonitorApp(ExtensionApp):
    """Adds ``{base_url}api/gpu/metrics``, ``stream``, ``notices``, ``saves``, ``memory``; owns the one sampler.

    Configuration stays on ``GPUMonitorServer`` (``c.GPUMonitorServer.<trait>``
    in any ``jupyter_server_config`` file); this class only ties the monitor's
    life cycle to the server's.
    """

    name = "workbench_gpu_monitor"
    description = "GPU Workbench GPU monitor: live GPU memory and utilization."

    monitor: GPUMonitorServer | None = None
    memory: MemoryWatcher | None = None

    def initialize_settings(self):
        # The ServerApp is the monitor's parent: its config (c.GPUMonitorServer.*),
        # runtime dir, log and kernel manager.
        self.monitor = GPUMonitorServer(serverapp=self.serverapp)
        self.settings[SETTINGS_KEY] = self.monitor
        self.settings[SAVES_KEY] = SaveRounds()
        self.memory = MemoryWatcher.for_this_server()
        self.settings[MEMORY_KEY] = self.memory

    def initialize_handlers(self):
        # ExtensionApp prepends the server's base_url.
        self.handlers.extend(
            [
                ("api/gpu/metrics", GPUMetricsHandler),
                ("api/gpu/stream", GPUStreamHandler),
                ("api/gpu/notices", GPUNoticesHandler),
                ("api/gpu/saves", GPUSavesHandler),
                ("api/gpu/memory", MemoryCgroupHandler),
            ]
        )

    # ExtensionApp.initialize takes no argv, unlike JupyterApp's (jupyter_server ignores the same override).
    def initialize(self) -> None:  # type: ignore[override]
        super().initialize()
        # ExtensionApp.initialize ran initialize_settings, which made both.
        assert self.monitor is not None
        assert self.memory is not None
        # Sample before the first request can arrive, as soon as the extension is loaded.
        io_loop = getattr(self.serverapp, "io_loop", None)
        self.monitor.start(getattr(io_loop, "asyncio_loop", None))
        self.memory.start()
        # A file left by the previous server in this runtime dir (a home that persists) may
        # say "stopping": kernels of this server must not act on it.
        try:
            write_for_kernels([])
        except OSError as exc:
            self.log.warning("GPU monitor: cannot write the notices for kernels: %s", exc)

    async def stop_extension(self):
        if self.monitor is not None:
            self.monitor.stop()
        if self.memory is not None:
            self.memory.stop()
