"""The wait list for spawns that find no free GPU: first come, first served, or fair share.

The list is kept in serving order (``queue_order``: ``fifo`` by arrival,
``fair-share`` by GPU-hours used with an aging bound). Only the spawn at the
head of its **class** may take GPUs, so a stream of small requests cannot
starve a large one. A class is what a request may take under the active
reservations (members of a reserved group vs everyone else, and the model):
a non-member held back by a reservation must not block a member behind it
who may take a reserved GPU, so a request may also try when everything
ahead of it is of another class and found nothing on its last try.
Everyone else is told how many are ahead of them, and in fair-share mode
why. A release in this hub wakes the head at once; a periodic re-check
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
from typing import Awaitable, Callable, Generic, Hashable, TypeVar

from .queue_order import DEFAULT_AGING_MINUTES, Waiting, explain, sort_key

T = TypeVar("T")
Report = Callable[[int, str], None]


class WaitTimeout(Exception):
    """Nothing became free before the deadline."""


@dataclass(eq=False)
class Ticket:
    key: str
    count: int
    joined: float = field(default_factory=time.monotonic)
    user: str = ""
    gpu_hours: float = 0.0
    # What this request may take under the active reservations (see the module docstring).
    cls: Hashable = ()
    # The release generation its last fruitless try saw (-1: none yet).
    failed_gen: int = -1

    def as_waiting(self) -> Waiting:
        return Waiting(self.key, self.user or self.key, self.joined, self.gpu_hours)


class WaitList(Generic[T]):
    def __init__(self, recheck_interval: float = 2.0, mode: str = "fifo",
                 aging_minutes: float = DEFAULT_AGING_MINUTES, clock: Callable[[], float] = time.monotonic):
        self.recheck_interval = recheck_interval
        self.mode = mode
        self.aging_minutes = aging_minutes
        self.clock = clock
        self._tickets: list[Ticket] = []
        self._wakers: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._wakers_lock = threading.Lock()
        # Bumped by every release: a ticket whose last try saw the current
        # generation is stuck until something comes free.
        self._generation = 0

    def waiting(self) -> list[Ticket]:
        """The tickets in serving order."""
        now, aging = self.clock(), self.aging_minutes * 60.0
        return sorted(self._tickets, key=lambda t: sort_key(t.as_waiting(), self.mode, now, aging))

    def position(self, ticket: Ticket) -> int:
        """How many tickets are ahead of this one."""
        return self.waiting().index(ticket)

    def may_try(self, ticket: Ticket) -> bool:
        """First in line, or everything ahead is of another class and stuck."""
        ahead = self.waiting()
        ahead = ahead[: ahead.index(ticket)]
        return all(t.cls != ticket.cls and t.failed_gen == self._generation for t in ahead)

    def why(self, ticket: Ticket) -> str:
        """Why this ticket is where it is ("" in fifo mode)."""
        ordered = self.waiting()
        items = [t.as_waiting() for t in ordered]
        return explain(items[ordered.index(ticket)], items, self.mode, self.clock(), self.aging_minutes)

    def notify(self) -> None:
        """Something was released: let the head try again.

        Safe to call from any thread."""
        with self._wakers_lock:
            self._generation += 1
        self._poke()

    def _poke(self) -> None:
        """Wake every waiter to look again (the order or who may try changed; nothing came free)."""
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
        report: Report = lambda ahead, why="": None,
        user: str = "",
        gpu_hours: float = 0.0,
        cls: Hashable = (),
    ) -> T:
        """Take GPUs via ``try_take`` when this ticket may try (``may_try``) and it succeeds.

        ``report(ahead, why)`` is called whenever the number ahead or the
        reason changes, and once when the ticket starts waiting. Raises
        WaitTimeout after ``timeout`` seconds; a cancelled wait leaves the
        list cleanly.
        """
        ticket = Ticket(key, count, self.clock(), user=user, gpu_hours=gpu_hours, cls=cls)
        loop = asyncio.get_running_loop()
        self._tickets.append(ticket)
        deadline = time.monotonic() + timeout
        last_reported: tuple[int, str] | None = None
        try:
            while True:
                # Registered before looking, so a release during try_take is not missed.
                waker = (loop, asyncio.Event())
                with self._wakers_lock:
                    self._wakers.add(waker)
                try:
                    if self.may_try(ticket):
                        generation = self._generation
                        result = await try_take()
                        if result is not None:
                            return result
                        if ticket.failed_gen != generation:
                            ticket.failed_gen = generation
                            self._poke()  # those behind of another class may try now
                    ahead = self.position(ticket)
                    why = self.why(ticket)
                    if (ahead, why) != last_reported:
                        # One-argument reporters (fifo callers of old) still work: why is "" in fifo.
                        report(ahead, why) if why else report(ahead)
                        last_reported = (ahead, why)
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
            self._poke()
