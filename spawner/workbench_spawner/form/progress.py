"""Spawn progress events the spawn page shows while a server waits for GPUs.

JupyterHub reads ``Spawner.progress()`` as an async generator while
``start()`` runs. Waiting in line happens inside ``start()``, so the events
are queued here and streamed until the start is past its GPU step; then the
backend's own progress (if any) follows.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable


class SpawnEvents:
    def __init__(self) -> None:
        self._events: list[dict] = []
        self._added = asyncio.Event()

    def reset(self) -> None:
        self._events = []

    def add(self, message: str, progress: int | None = None) -> None:
        event: dict = {"message": message}
        if progress is not None:
            event["progress"] = progress
        self._events.append(event)
        self._added.set()

    def latest(self) -> str:
        """The newest event's words ("" before any): the hub's home page says so of a server still starting
        (an engine's queue in its own words)."""
        return self._events[-1]["message"] if self._events else ""

    async def stream(self, starting: Callable[[], bool]) -> AsyncIterator[dict]:
        """Every event so far and to come, until ``starting()`` turns False."""
        seen = 0
        while True:
            while seen < len(self._events):
                yield self._events[seen]
                seen += 1
            if not starting() and seen:
                return
            self._added.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._added.wait(), 1.0)
