"""An asyncio event loop on simulated time, for replaying the hub's own async code without waiting.

``virtual_loop()`` returns a loop whose ``time()`` is a simulated clock in seconds. Whenever
nothing is ready to run, the loop jumps its clock to the next timer instead of sleeping, so
``asyncio.sleep(300)``, ``asyncio.wait_for(..., 2.0)`` and every ``call_later`` of unchanged
code take no wall-clock time, in the order they would have happened. ``asyncio.to_thread``
runs the function at once on the loop's thread (an inline default executor): a database call
takes no simulated time, and no thread can finish "later" while the clock jumps ahead.

Used by ``class_day.py`` to drive the real wait list, placement and idle reclaim loop (their
``asyncio.wait_for`` re-checks, queue timeouts and reclaim passes) through a 2-hour class in
seconds. Only for code that does no real I/O: a socket read would never be waited for.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import selectors
from collections.abc import Callable
from typing import Any


class InlineExecutor(concurrent.futures.ThreadPoolExecutor):
    """Runs each submitted call at once, on the caller's thread (asyncio needs a ThreadPoolExecutor)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine, as a thread's would be
            future.set_exception(exc)
        return future


class _JumpingSelector(selectors.SelectSelector):
    """Polls the real selector (the loop's self-pipe) and, when nothing is ready, moves the clock."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualTimeLoop | None = None

    def select(self, timeout: float | None = None):
        events = super().select(0)
        if events or timeout == 0:
            return events
        if timeout is None:
            raise RuntimeError("simulation stuck: nothing is scheduled and nothing is ready")
        assert self.loop is not None
        self.loop.now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self, start: float = 0.0) -> None:
        selector = _JumpingSelector()
        super().__init__(selector)
        selector.loop = self
        self.now = start
        self.set_default_executor(InlineExecutor(max_workers=1))

    def time(self) -> float:
        return self.now


def virtual_loop(start: float = 0.0) -> VirtualTimeLoop:
    """A new loop whose clock starts at ``start`` seconds (set it as the current loop to use it)."""
    return VirtualTimeLoop(start)
