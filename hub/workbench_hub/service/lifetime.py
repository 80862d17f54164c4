"""How the workbench service starts and ends: one port, quiet stops, never outliving its hub.

* **Port in use**: if the service cannot listen (typically an old service of
  a hub that was killed still holds the port), it says so in one sentence on
  stderr, which the hub's log shows, naming the address and what to do, and
  exits 1.
* **SIGINT / SIGTERM** (Ctrl-C of ``make run``, the hub stopping its
  services): one log line, exit 0, no traceback, however early it comes
  (``__main__`` catches signals from its first line, ``Lifetime`` takes
  over before the service listens).
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
from collections.abc import Callable, Sequence

from tornado import web
from tornado.httpserver import HTTPServer

log = logging.getLogger("workbench.service")

PARENT_CHECK_SECONDS = 2.0


class CannotListenError(Exception):
    """The port could not be bound; str() is the sentence for the operator."""


def listen(app: web.Application, port: int, ip: str, **server_options) -> HTTPServer:
    """Listen on ip:port, or CannotListenError with a sentence naming the address and the likely cause."""
    try:
        return app.listen(port, ip, **server_options)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise CannotListenError(
                f"cannot start: port {port} on {ip} is in use, probably by a workbench service left from a hub "
                f"that was killed; stop it (`fuser -k {port}/tcp`) or set WORKBENCH_SERVICE_PORT"
            ) from None
        raise CannotListenError(f"cannot start: cannot listen on {ip} port {port}: {exc.strerror or exc}") from None


class Lifetime:
    """When the service should stop: SIGINT, SIGTERM or the death of ``parent``, from the first moment.

    Made at the very start of ``serve``, before listening and the first
    database read: the hub stops services with SIGINT however soon after
    starting them (a Ctrl-C right after ``make run``), and a signal that came
    before the handlers were in place would be lost. ``early`` holds the
    names of signals ``__main__`` caught before the event loop existed.
    ``parent`` is the parent's pid as read when the process began.
    """

    def __init__(self, parent: int, early: Sequence[str] = (), parent_check_seconds: float = PARENT_CHECK_SECONDS):
        self._loop = asyncio.get_running_loop()
        self._stopped: asyncio.Future[str] = self._loop.create_future()
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._loop.add_signal_handler(sig, self.stop, signal.Signals(sig).name)
        if early:  # checked after the handlers are in place: no signal falls between the two
            self.stop(early[0])
        self._watcher = asyncio.create_task(self._watch(parent, parent_check_seconds))

    def stop(self, reason: str) -> None:
        if not self._stopped.done():
            self._stopped.set_result(reason)

    async def _watch(self, parent: int, every: float) -> None:
        while True:
            if os.getppid() != parent:
                self.stop(f"its hub (pid {parent}) is gone")
                return
            await asyncio.sleep(every)

    async def wait(self, on_stop: Callable[[], None] | None = None) -> str:
        """Serve until stopped; returns why."""
        try:
            reason = await self._stopped
        finally:
            self._watcher.cancel()
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._loop.remove_signal_handler(sig)
        if on_stop is not None:
            on_stop()
        return reason
