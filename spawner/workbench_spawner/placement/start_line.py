"""The line in front of the host: how many spawns may wait, and how many servers start at once.

Two counts, one object per GPU policy (one per hub process and configuration),
used on the hub's event loop only (no locks):

* **In line**: every spawn from the moment ``start()`` begins until it holds
  a start slot (host placement) or its ``start()`` ends (engine placement),
  whatever it waits for: a GPU, the engine's queue, a start slot. ``join``
  refuses past ``max_waiting`` (``LineFullError``: the spawner answers 503 with
  how many are waiting), so a hub under a storm says no in one sentence
  instead of JupyterHub's 429 "Too many users trying to log in right now".
* **Starting**: servers this host is starting, from their GPUs to their
  first answer. At most ``max_starting`` hold a slot; the others wait first
  come, first served, and are told how many servers are ahead of theirs
  ("starting 8 servers ahead of yours"). A slot is held until the server
  answers and the hub has routed it (``hold_until``: JupyterHub's spawn is no
  longer pending), or the start fails or is cancelled. JupyterLab's start is
  what loads the host; the GPU line already lets through only as many GPU
  spawns as there are free GPUs, so the slots bind CPU-only servers,
  time-shared GPUs and a host with many MIG slices and few cores.

Limits are derived in ``policy/spawn_limits.py``. Pauses use
``asyncio.timeout`` around a shielded future: a cancel never loses a slot
handed over at the same instant (it is given back), and never leaves a
waiter behind (it leaves the line).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable


class LineFullError(Exception):
    """``max_waiting`` spawns wait already."""

    def __init__(self, waiting: int):
        who = "1 student is" if waiting == 1 else f"{waiting} students are"
        super().__init__(
            f"The hub is full: {who} already waiting for a server, the most it lets wait at once. Please try "
            "again in a few minutes."
        )
        self.waiting = waiting


class SlotTimeoutError(Exception):
    """No start slot came free before the deadline."""


class Slot:
    """One server's place among those starting (or waiting to start)."""

    __slots__ = ("granted", "released")

    def __init__(self) -> None:
        self.granted: asyncio.Future | None = None
        self.released = False


class StartLine:
    def __init__(self, max_waiting: int, max_starting: int, refresh: float = 1.0):
        self.max_waiting = max(1, int(max_waiting))
        self.max_starting = max(1, int(max_starting))
        # How often a waiter for a slot looks at its place again (its user is told when it changed).
        self.refresh = refresh
        self._in_line: set[object] = set()
        self._starting: set[Slot] = set()
        self._queue: deque[Slot] = deque()
        self._holds: set[asyncio.Task] = set()

    # -- in line -----------------------------------------------------------------------

    @property
    def in_line(self) -> int:
        return len(self._in_line)

    def join(self) -> object:
        """A token for a spawn joining the line; ``LineFullError`` past ``max_waiting``."""
        if len(self._in_line) >= self.max_waiting:
            raise LineFullError(len(self._in_line))
        token = object()
        self._in_line.add(token)
        return token

    def leave(self, token: object) -> None:
        """The spawn is out of the line (started, refused, cancelled); twice is harmless."""
        self._in_line.discard(token)

    # -- starting -----------------------------------------------------------------------

    @property
    def starting(self) -> int:
        return len(self._starting)

    @property
    def waiting_to_start(self) -> int:
        return len(self._queue)

    def _ahead_of(self, slot: Slot) -> int:
        return len(self._starting) + self._queue.index(slot)

    async def start_slot(self, deadline: float, report: Callable[[int], None]) -> Slot:
        """A slot to start one server, first come, first served; ``report(n)`` tells the user how many
        servers start ahead of theirs, whenever that changed. ``SlotTimeoutError`` at ``deadline``
        (``time.monotonic()``)."""
        slot = Slot()
        if len(self._starting) < self.max_starting and not self._queue:
            self._starting.add(slot)
            return slot
        slot.granted = asyncio.get_running_loop().create_future()
        self._queue.append(slot)
        told = -1
        try:
            while not slot.granted.done():
                ahead = self._ahead_of(slot)
                if ahead != told:
                    report(ahead)
                    told = ahead
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    still = "server still starts" if ahead == 1 else "servers still start"
                    raise SlotTimeoutError(f"{ahead} {still} ahead of this one")
                try:
                    async with asyncio.timeout(min(self.refresh, remaining)):
                        await asyncio.shield(slot.granted)
                except TimeoutError:
                    pass
            return slot
        except BaseException:
            if slot.granted.done():
                self.release(slot)  # handed over just as the wait ended: pass it on
            else:
                slot.granted.cancel()
                self._queue.remove(slot)
            raise

    def release(self, slot: Slot) -> None:
        """The server is up, or its start failed or was cancelled: the next waiter may start."""
        if slot.released:
            return
        slot.released = True
        self._starting.discard(slot)
        while self._queue and len(self._starting) < self.max_starting:
            nxt = self._queue.popleft()
            if nxt.granted is None or nxt.granted.done():
                continue
            self._starting.add(nxt)
            nxt.granted.set_result(None)

    def hold_until(self, slot: Slot, answered: Callable[[], bool], limit: float, every: float = 0.25) -> None:
        """Keep ``slot`` until ``answered()`` (the hub no longer waits for the server), at most ``limit``
        seconds, then release it; in the background, so ``start()`` can return its URL to the hub."""

        async def hold() -> None:
            try:
                end = time.monotonic() + limit
                while not answered() and time.monotonic() < end:
                    await asyncio.sleep(every)
            finally:
                self.release(slot)

        task = asyncio.ensure_future(hold())
        self._holds.add(task)
        task.add_done_callback(self._holds.discard)
