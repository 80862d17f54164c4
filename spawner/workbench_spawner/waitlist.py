"""A first-come, first-served wait list for spawns that find no free GPU.

Only the spawn at the head of the list may take GPUs, so a stream of small
requests cannot starve a large one. Everyone else is told how many are ahead
of them. A release in this hub wakes the head at once; a periodic re-check
covers releases the hub did not see (another process, a manual database fix).

Releases happen in worker threads (the database write runs in
``asyncio.to_thread``), and asyncio objects may only be touched from their
own loop's thread, so ``notify`` hands each wake-up to the waiter's loop with
``call_soon_threadsafe`` instead of setting the event itself.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Generic, TypeVar

T = TypeVar("T")


class WaitTimeout(Exception):
    """Nothing became free before the deadline."""


@dataclass(eq=False)
class Ticket:
    key: str
    count: int
    joined: float = field(default_factory=time.monotonic)


class WaitList(Generic[T]):
    def __init__(self, recheck_interval: float = 2.0):
        self.recheck_interval = recheck_interval
        self._tickets: list[Ticket] = []
        self._wakers: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._wakers_lock = threading.Lock()

    def waiting(self) -> list[Ticket]:
        return list(self._tickets)

    def position(self, ticket: Ticket) -> int:
        """How many tickets are ahead of this one."""
        return self._tickets.index(ticket)

    def notify(self) -> None:
        """Something was released (or a ticket left): let the head try again.

        Safe to call from any thread."""
        with self._wakers_lock:
            wakers = list(self._wakers)
        for loop, event in wakers:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # that loop is closed: nobody is waiting on it any more
                pass

    async def wait_for(
        self,
        key: str,
        count: int,
        try_take: Callable[[], Awaitable[T | None]],
        timeout: float,
        report: Callable[[int], None] = lambda ahead: None,
    ) -> T:
        """Take GPUs via ``try_take`` when this ticket is first and it succeeds.

        ``report(ahead)`` is called whenever the number ahead changes, and once
        when the ticket starts waiting. Raises WaitTimeout after ``timeout``
        seconds; a cancelled wait leaves the list cleanly.
        """
        ticket = Ticket(key, count)
        loop = asyncio.get_running_loop()
        self._tickets.append(ticket)
        deadline = time.monotonic() + timeout
        last_reported: int | None = None
        try:
            while True:
                # Registered before looking, so a release during try_take is not missed.
                waker = (loop, asyncio.Event())
                with self._wakers_lock:
                    self._wakers.add(waker)
                try:
                    ahead = self.position(ticket)
                    if ahead == 0:
                        result = await try_take()
                        if result is not None:
                            return result
                    if ahead != last_reported:
                        report(ahead)
                        last_reported = ahead
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise WaitTimeout(f"no GPU became free within {timeout:g} s")
                    try:
                        await asyncio.wait_for(waker[1].wait(), min(self.recheck_interval, remaining))
                    except asyncio.TimeoutError:
                        pass
                finally:
                    with self._wakers_lock:
                        self._wakers.discard(waker)
        finally:
            self._tickets.remove(ticket)
            self.notify()
