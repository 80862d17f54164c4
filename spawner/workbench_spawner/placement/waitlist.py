"""The wait list for spawns that find no free GPU: first come, first served, or fair share.

The list is kept in serving order (``queue_order``: ``fifo`` by arrival,
``fair-share`` by GPU-hours used with an aging bound). Only the spawn at the
head of its **class** may take GPUs, so a stream of small requests cannot
starve a large one. A class is what a request may take under the active
reservations (members of a reserved group vs everyone else, and the model):
a non-member held back by a reservation must not block a member behind it
who may take a reserved GPU, so a request may also try when everything
ahead of it is of another class and found nothing on its last try. Classes
change when reservation windows open or close: the caller hands the new
ones in with ``reclassify``. Everyone else is told how many are ahead of
them, and in fair-share mode why.

**Arrival across retries.** A spawn refused at the queue timeout, or
cancelled, is remembered (per key, i.e. user and server) for
``rejoin_minutes`` (``queue_order.REJOIN_MINUTES``, 15): a new wait for the
same key within that time keeps the arrival of the first one, so the aging
bound counts the whole time the user has been asking. Being served forgets
it.

**Wake-ups.** A release in this hub (``notify``) and a fruitless try wake
only the waiters that may try now (the head of each class), so the cost of
a release does not grow with the line. A change of places (a waiter joining
or leaving, a class change, the order moving by itself at the aging bound)
wakes the heads at once and everyone else, since each must tell its user a
new place, at most every ``place_refresh`` seconds (0.5) however many
changes land meanwhile: a class cancelling 100 waits at once, or ten GPUs
coming free in a burst, costs one wake-up of the rest, not 100 or ten. A
waiter that may try also looks again every ``recheck_interval`` seconds,
which covers what the hub does not see: releases by another process, a
reservation's grace period ending. The others look when woken, at their
deadline, and every ``idle_recheck_interval`` as a safety net. The order,
who may try and every reason are computed once per change of the line and
shared by all waiters.

**Looking again.** A waiter that may not try yet can still learn that it
never will: host placement gives a user's other spawn a GPU, and this one
is now over the user's quota (``ledger.lease_limits``). ``ask_recheck``
marks such tickets and wakes them; each runs its ``recheck`` once, and an
exception from it ends that wait (the ticket leaves the line as on a
timeout). An exception from ``try_take`` ends the wait the same way.

**Cancelling.** A wait that is cancelled (JupyterHub's DELETE of a pending
spawn, the hub shutting down) leaves the line at once and never takes a
GPU afterwards. Its pause is ``asyncio.timeout``, not ``asyncio.wait_for``:
on Python 3.11 ``wait_for`` swallows a cancel that lands just after the
awaited event was set, and the cancelled spawn would carry on in line.

Releases happen in worker threads (the database write runs in
``asyncio.to_thread``), and asyncio objects may only be touched from their
own loop's thread, so ``notify`` hands each wake-up to the waiters' loop with
``call_soon_threadsafe`` instead of setting the events itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import threading
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from workbench_spawner.rules.queue_order import DEFAULT_AGING_MINUTES, REJOIN_MINUTES, Waiting, explain_all, sort_key

T = TypeVar("T")
# ``report(ahead, why)``, or ``report(ahead)`` in fifo order (one-argument reporters of old): see ``wait_for``.
Report = Callable[..., None]


class WaitTimeoutError(Exception):
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
    # Asked to run its ``recheck`` at its next wake-up (``WaitList.ask_recheck``).
    recheck_asked: bool = False

    def as_waiting(self) -> Waiting:
        return Waiting(self.key, self.user or self.key, self.joined, self.gpu_hours)


@dataclass
class _Line:
    """The line as of one change: order, who may try, reasons (computed lazily)."""

    version: int
    valid_until: float  # the clock time at which the order changes by itself (aging)
    ordered: list[Ticket]
    index: dict[int, int]
    trying: set[int]
    reasons: list[str] | None = None


class WaitList(Generic[T]):
    def __init__(
        self,
        recheck_interval: float = 2.0,
        mode: str = "fifo",
        aging_minutes: float = DEFAULT_AGING_MINUTES,
        clock: Callable[[], float] = time.monotonic,
        rejoin_minutes: float = REJOIN_MINUTES,
        idle_recheck_interval: float | None = None,
        place_refresh: float = 0.5,
    ):
        self.recheck_interval = recheck_interval
        self.idle_recheck_interval = 10 * recheck_interval if idle_recheck_interval is None else idle_recheck_interval
        self.mode = mode
        # How often, at most, a change of places wakes everyone in line (``_poke``).
        self.place_refresh = place_refresh
        self.aging_minutes = aging_minutes
        self.rejoin_minutes = rejoin_minutes
        self.clock = clock
        self._tickets: list[Ticket] = []
        # id(ticket) -> (its loop, the event its pause waits on), while it waits or tries.
        self._wakers: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Event]] = {}
        self._wakers_lock = threading.Lock()
        # Loops with a wake-up of everyone already scheduled (``_poke``).
        self._poke_pending: set[asyncio.AbstractEventLoop] = set()
        # Bumped by every release: a ticket whose last try saw the current
        # generation is stuck until something comes free.
        self._generation = 0
        # Bumped by every change of the line (join, leave, failed try, release, class).
        self._version = 0
        self._line: _Line | None = None
        # key -> (first arrival, when its last wait ended unserved): see "Arrival across retries".
        self._asked: dict[str, tuple[float, float]] = {}

    # -- the line -------------------------------------------------------------------

    def _current(self) -> _Line:
        now = self.clock()
        line = self._line
        version = self._version
        if line is not None and line.version == version and now < line.valid_until:
            return line
        aging = self.aging_minutes * 60.0
        tickets = list(self._tickets)
        ordered = sorted(tickets, key=lambda t: sort_key(t.as_waiting(), self.mode, now, aging))
        valid_until = math.inf
        if self.mode == "fair-share":
            # The next instant a ticket reaches the bound; never "now" itself (rounding), so time moves on.
            valid_until = max(
                now + 1e-6, min((t.joined + aging for t in tickets if now - t.joined < aging), default=math.inf)
            )
        trying: set[int] = set()
        seen: set = set()
        all_stuck = True
        generation = self._generation
        for t in ordered:
            # May try: everything ahead is of another class and stuck at this generation.
            if all_stuck and t.cls not in seen:
                trying.add(id(t))
            seen.add(t.cls)
            all_stuck = all_stuck and t.failed_gen == generation
        self._line = _Line(version, valid_until, ordered, {id(t): i for i, t in enumerate(ordered)}, trying)
        if line is not None and line.version == version and (line.ordered != ordered or line.trying != trying):
            self._poke()  # only the clock moved the order: everyone's place may have changed
        return self._line

    def _changed(self) -> None:
        with self._wakers_lock:  # notify() bumps it from other threads
            self._version += 1

    def waiting(self) -> list[Ticket]:
        """The tickets in serving order."""
        return list(self._current().ordered)

    def position(self, ticket: Ticket) -> int:
        """How many tickets are ahead of this one."""
        return self._current().index[id(ticket)]

    def may_try(self, ticket: Ticket) -> bool:
        """First in line, or everything ahead is of another class and stuck."""
        return id(ticket) in self._current().trying

    def why(self, ticket: Ticket) -> str:
        """Why this ticket is where it is ("" in fifo mode)."""
        line = self._current()
        if line.reasons is None:
            line.reasons = explain_all(
                [t.as_waiting() for t in line.ordered], self.mode, self.clock(), self.aging_minutes
            )
        return line.reasons[line.index[id(ticket)]]

    def reclassify(self, classify: Callable[[Ticket], Hashable]) -> int:
        """Give every waiting ticket its class again (reservations opened or closed); wakes them if any
        changed. Call it on the loop's thread. Returns how many changed."""
        changed = 0
        for t in list(self._tickets):
            cls = classify(t)
            if cls != t.cls:
                t.cls = cls
                changed += 1
        if changed:
            self._changed()
            self._poke()
        return changed

    # -- wake-ups ---------------------------------------------------------------------

    def notify(self) -> None:
        """Something was released: let the head(s) try again (not everyone: see the module docstring).

        Safe to call from any thread."""
        with self._wakers_lock:
            self._generation += 1
            self._version += 1
            loops = {loop for loop, _ in self._wakers.values()}
        for loop in loops:
            self._call(loop, functools.partial(self._wake_heads, loop))

    @staticmethod
    def _call(loop: asyncio.AbstractEventLoop, callback: Callable[[], object]) -> None:
        with contextlib.suppress(RuntimeError):  # that loop is closed: nobody is waiting on it any more
            loop.call_soon_threadsafe(callback)

    def _wake_heads(self, loop: asyncio.AbstractEventLoop, skip: int | None = None) -> None:
        """On ``loop``: wake its waiters that may try now (the head of each class), but ``skip``."""
        trying = self._current().trying - {skip}
        with self._wakers_lock:
            events = [event for key, (owner, event) in self._wakers.items() if key in trying and owner is loop]
        for event in events:
            event.set()

    def _poke(self) -> None:
        """Places or who may try changed: wake those who may try now, and everyone else to tell their users
        their new place at most every ``place_refresh`` seconds, however many changes land meanwhile."""
        with self._wakers_lock:
            every = {loop for loop, _ in self._wakers.values()}
            later = every - self._poke_pending
            self._poke_pending |= later
        for loop in every:
            self._call(loop, functools.partial(self._wake_heads, loop))
        for loop in later:
            self._call(loop, functools.partial(loop.call_later, self.place_refresh, self._wake_all, loop))

    def _wake_all(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._wakers_lock:
            self._poke_pending.discard(loop)
            events = [event for owner, event in self._wakers.values() if owner is loop]
        for event in events:
            event.set()

    def ask_recheck(self, which: Callable[[Ticket], bool]) -> int:
        """Have the waiting tickets ``which`` picks run their ``recheck`` now (see "Looking again"); call it on
        the loop's thread. Returns how many were asked."""
        asked = [t for t in self._tickets if which(t)]
        for t in asked:
            t.recheck_asked = True
        with self._wakers_lock:
            events = [self._wakers[id(t)] for t in asked if id(t) in self._wakers]
        for loop, event in events:
            self._call(loop, event.set)
        return len(asked)

    def _join(self, ticket: Ticket) -> None:
        now = self.clock()
        window = self.rejoin_minutes * 60.0
        for key, (_, left) in list(self._asked.items()):
            if now - left > window:
                del self._asked[key]
        remembered = self._asked.pop(ticket.key, None)
        if remembered is not None:
            ticket.joined = min(ticket.joined, remembered[0])
        self._tickets.append(ticket)
        self._changed()

    def _leave(self, ticket: Ticket, served: bool) -> None:
        self._tickets.remove(ticket)
        if not served:
            self._asked[ticket.key] = (ticket.joined, self.clock())
        self._changed()
        self._poke()

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
        recheck: Callable[[], Awaitable[object]] | None = None,
    ) -> T:
        """Take GPUs via ``try_take`` when this ticket may try (``may_try``) and it succeeds.

        ``report(ahead, why)`` is called whenever the number ahead or the
        reason changes, and once when the ticket starts waiting. Raises
        WaitTimeoutError after ``timeout`` seconds; a cancelled wait leaves the
        list cleanly. Either way the key's first arrival is remembered for
        ``rejoin_minutes`` (the module docstring). ``recheck``: run when
        ``ask_recheck`` picks this ticket; what it raises, like what
        ``try_take`` raises, ends the wait and leaves the line.
        """
        ticket = Ticket(key, count, self.clock(), user=user, gpu_hours=gpu_hours, cls=cls)
        loop = asyncio.get_running_loop()
        self._join(ticket)
        deadline = self.clock() + timeout
        last_reported: tuple[int, str] | None = None
        served = False
        try:
            while True:
                # Registered before looking, so a release during try_take is not missed.
                event = asyncio.Event()
                with self._wakers_lock:
                    self._wakers[id(ticket)] = (loop, event)
                try:
                    if ticket.recheck_asked:
                        ticket.recheck_asked = False
                        if recheck is not None:
                            await recheck()
                    if self.may_try(ticket):
                        generation = self._generation
                        result = await try_take()
                        if result is not None:
                            served = True
                            return result
                        if ticket.failed_gen != generation:
                            ticket.failed_gen = generation
                            self._changed()
                            # Those behind of another class may try now (not this one again: it just did).
                            self._call(loop, functools.partial(self._wake_heads, loop, skip=id(ticket)))
                    ahead = self.position(ticket)
                    why = self.why(ticket)
                    if (ahead, why) != last_reported:
                        # One-argument reporters (fifo callers of old) still work: why is "" in fifo.
                        report(ahead, why) if why else report(ahead)
                        last_reported = (ahead, why)
                    now = self.clock()
                    remaining = deadline - now
                    if remaining <= 0:
                        raise WaitTimeoutError(f"no GPU became free within {timeout:g} s")
                    pause = self.recheck_interval if self.may_try(ticket) else self.idle_recheck_interval
                    changes_at = self._current().valid_until - now  # the order changes by itself then
                    try:
                        # Not asyncio.wait_for: it may swallow a cancel (the module docstring).
                        async with asyncio.timeout(max(0.0, min(pause, remaining, changes_at))):
                            await event.wait()
                    except TimeoutError:
                        pass
                finally:
                    with self._wakers_lock:
                        self._wakers.pop(id(ticket), None)
        finally:
            self._leave(ticket, served)
