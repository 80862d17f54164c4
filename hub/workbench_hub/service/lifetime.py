"""How the workbench service starts and ends: one port, quiet stops, never outliving its hub.

* **Port in use**: if the service cannot listen (typically an old service of
  a hub that was killed still holds the port), it says so in one sentence on
  stderr, which the hub's log shows, naming the address and what to do, and
  exits 1.
* **SIGINT / SIGTERM** (Ctrl-C of ``make run``, the hub stopping its
  services): one log line, exit 0, no traceback.
* **The hub dies**: the hub's launcher asks the kernel for a signal when the
  parent dies (PR_SET_PDEATHSIG); in addition the service checks every few
  seconds that its parent is still the process that started it, so it never
  outlives the hub even where that signal is not delivered (a launcher
  without it, a parent that exec'd).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
from typing import Callable

from tornado import web
from tornado.httpserver import HTTPServer

log = logging.getLogger("workbench.service")

PARENT_CHECK_SECONDS = 2.0


class CannotListen(Exception):
    """The port could not be bound; str() is the sentence for the operator."""


def listen(app: web.Application, port: int, ip: str, **server_options) -> HTTPServer:
    """Listen on ip:port, or CannotListen with a sentence naming the address and the likely cause."""
    try:
        return app.listen(port, ip, **server_options)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise CannotListen(
                f"cannot start: port {port} on {ip} is in use, probably by a workbench service left from a hub "
                f"that was killed; stop it (`fuser -k {port}/tcp`) or set WORKBENCH_SERVICE_PORT"
            ) from None
        raise CannotListen(f"cannot start: cannot listen on {ip} port {port}: {exc.strerror or exc}") from None


async def run_until_stopped(parent: int, on_stop: Callable[[], None] | None = None,
                            parent_check_seconds: float = PARENT_CHECK_SECONDS) -> str:
    """Serve until SIGINT, SIGTERM or the death of ``parent``; returns why it stopped.

    ``parent`` is the parent's pid as read when the process began, not now: start-up
    (listening, the first database read) takes seconds on a busy host, and a parent that
    died meanwhile would otherwise be mistaken for init or a subreaper, and never missed.
    """
    loop = asyncio.get_running_loop()
    stopped: asyncio.Future[str] = loop.create_future()

    def stop(reason: str) -> None:
        if not stopped.done():
            stopped.set_result(reason)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop, signal.Signals(sig).name)

    async def watch_parent() -> None:
        while True:
            if os.getppid() != parent:
                stop(f"its hub (pid {parent}) is gone")
                return
            await asyncio.sleep(parent_check_seconds)

    watcher = asyncio.create_task(watch_parent())
    try:
        reason = await stopped
    finally:
        watcher.cancel()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    if on_stop is not None:
        on_stop()
    return reason
