"""Give kernels time to save when the Jupyter server stops: SIGTERM, a grace period, then SIGKILL.

jupyter_client's own shutdown of a kernel (``KernelManager.shutdown_kernel``) starts with
an *interrupt* (SIGINT): a training loop gets ``KeyboardInterrupt`` mid-step and its state
is lost before any save can run. Then a ``shutdown_request``, ``shutdown_wait_time / 2``
(2.5 s) of waiting, SIGTERM, another 2.5 s and SIGKILL. That suits a student who presses
"Shut Down Kernel", not a server the hub stops while a model trains.

So when the *server* stops (SIGTERM from the spawner, ``POST api/shutdown``, the idle
shutdown: all go through ``ServerApp._cleanup`` -> ``cleanup_kernels`` ->
``kernel_manager.shutdown_all()``), ``GracefulKernelManager.shutdown_all`` first sends every
kernel SIGTERM (to its process group, as jupyter_client does), which runs the callbacks of
``workbench_gpu_monitor.on_stop`` in the kernel and ends it; it waits up to
``stop_grace_seconds`` for the kernels to exit, then lets jupyter_client finish: immediately
(SIGKILL) for a kernel still running after the grace, the usual way for the others. A
kernel's own shutdown or restart from the lab is untouched.

images/singleuser/jupyter_server_config.py selects this class and sets the grace from
``WORKBENCH_KERNEL_GRACE`` (seconds, default 30), which the spawner passes; the engine's own
stop timeout (``docker stop -t``, a pod's ``terminationGracePeriodSeconds``, Slurm's
``KillWait``) must be longer, or the engine kills everything first.
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import time
from collections.abc import Mapping
from typing import cast

from jupyter_client.manager import AsyncKernelManager
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
from traitlets import Float

GRACE_ENV = "WORKBENCH_KERNEL_GRACE"
DEFAULT_GRACE_SECONDS = 30.0
MAX_GRACE_SECONDS = 3600.0


def grace_from_env(environ: Mapping[str, str], log: logging.Logger | None = None) -> float:
    """``WORKBENCH_KERNEL_GRACE`` as seconds (0 turns the grace off); a bad value is logged and ignored."""
    raw = environ.get(GRACE_ENV, "").strip()
    if not raw:
        return DEFAULT_GRACE_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (0 <= value <= MAX_GRACE_SECONDS):  # also refuses nan and inf
        (log or logging.getLogger("ServerApp")).warning(
            "%s=%r is not a number of seconds from 0 to %d: kernels get the default %g s to stop",
            GRACE_ENV,
            raw,
            MAX_GRACE_SECONDS,
            DEFAULT_GRACE_SECONDS,
        )
        return DEFAULT_GRACE_SECONDS
    return value


class GracefulKernelManager(AsyncMappingKernelManager):
    """jupyter_server's kernel manager, except that a server stop gives kernels SIGTERM and a grace period."""

    stop_grace_seconds = Float(
        DEFAULT_GRACE_SECONDS,
        config=True,
        help="""Seconds a kernel gets after SIGTERM, when the server stops, before it is killed.

        In that time ``workbench_gpu_monitor.on_stop`` callbacks save checkpoints. 0 keeps
        jupyter_client's usual shutdown (interrupt first). Set from WORKBENCH_KERNEL_GRACE by
        images/singleuser/jupyter_server_config.py; example:
        ``c.GracefulKernelManager.stop_grace_seconds = 60``.
        """,
    )

    # jupyter_client types MultiKernelManager.shutdown_all as its synchronous wrapper; the async manager's is a
    # coroutine, as this one.
    async def shutdown_all(self, now: bool = False) -> None:  # type: ignore[override]
        if not now and self.stop_grace_seconds > 0 and self.list_kernel_ids():
            still_running = await self.terminate_with_grace(self.stop_grace_seconds)
            # The grace is spent: what still runs is killed now, not given jupyter_client's 5 s more.
            now = bool(still_running)
        await super().shutdown_all(now=now)

    async def terminate_with_grace(self, grace: float) -> list[str]:
        """SIGTERM every kernel, wait up to ``grace`` seconds for them to exit; the ids still running."""
        managers: dict[str, AsyncKernelManager] = {}
        for kernel_id in self.list_kernel_ids():
            # get_kernel is typed for the synchronous KernelManager: this manager's kernels are async ones.
            km = cast(AsyncKernelManager, self.get_kernel(kernel_id))
            if not km.has_kernel:
                continue
            km.stop_restarter()  # or the restarter would start the kernel again once it exits
            try:
                await km.signal_kernel(signal.SIGTERM)
            except (OSError, RuntimeError) as exc:
                self.log.warning("Kernel %s: cannot send SIGTERM: %s", kernel_id, exc)
                continue
            managers[kernel_id] = km
        if not managers:
            return []
        self.log.info("Server stopping: %d kernel(s) got SIGTERM and up to %g s to save", len(managers), grace)
        started = time.monotonic()
        running = list(managers)
        while running and time.monotonic() - started < grace:
            await asyncio.sleep(0.1)
            running = [kid for kid in running if await managers[kid].is_alive()]
        took = time.monotonic() - started
        if running:
            self.log.warning("%d kernel(s) still running %.1f s after SIGTERM: killing them", len(running), took)
        else:
            self.log.info("Every kernel stopped %.1f s after SIGTERM", took)
        return running
