"""How many spawns may wait, how many servers may start at once, and JupyterHub's own limit above both.

A class starts at 9:00: 200 students press Start in the same minute. Most of
them wait in the GPU line, which costs a coroutine and a row in a list, not a
server start. JupyterHub counts every pending spawn the same, and past its
``concurrent_spawn_limit`` (100 by default) it answers 429 "Too many users
trying to log in right now" before our code runs: half a class got that
instead of a place in line. So the limits are ours, and derived here from
the inventory:

* ``max_waiting`` (``WORKBENCH_MAX_WAITING``, default 1000): spawns that may
  wait at once, for a GPU, for the engine, or for a start slot. Past it a
  spawn is refused with a 503 that says how many are waiting.
* ``max_starting`` (``WORKBENCH_MAX_STARTING``, 0 = derived): servers this
  host starts at once, from their GPUs to their first answer. Starting a
  JupyterLab costs a few CPU-seconds, and 200 at once on one host make each
  of them miss JupyterHub's ``http_timeout``. Derived: one per device a
  server can hold (GPUs, MIG slices, time-sliced shares) plus ``EXTRA``, so
  every free GPU can start its server at once and CPU-only servers still
  start beside them, but at most ``PER_CORE`` per CPU core of the hub's
  host, and never fewer than ``EXTRA``.
* ``concurrent_spawn_limit``: JupyterHub's own, set to ``max_waiting`` plus
  twice ``max_starting`` (the spawns starting, plus as many again between
  pressing Start and joining the line, or between answering and the proxy
  route). It is a backstop: our 503 comes first.

Pure functions, tested with a table (tests/unit/test_spawn_limits.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_MAX_WAITING = 1000
# Start slots beyond one per device: CPU-only servers start beside the GPU ones.
EXTRA = 4
# At most this many servers start at once per CPU core of the hub's host: a JupyterLab's start is
# mostly CPU (imports, extension discovery), some disk; two per core keep the cores busy without
# making every start, and the hub beside them, wait on the others.
PER_CORE = 2


@dataclass(frozen=True)
class SpawnLimits:
    """The limits in force; ``describe()`` is the hub's start-up line."""

    max_waiting: int
    max_starting: int
    concurrent_spawn_limit: int
    derived_starting: bool = True

    def describe(self) -> str:
        how = " (derived from the GPUs and cores)" if self.derived_starting else ""
        return (
            f"up to {self.max_waiting} spawns wait in line, {self.max_starting} servers start at once{how}; "
            f"JupyterHub's concurrent_spawn_limit {self.concurrent_spawn_limit}"
        )


def derive_spawn_limits(
    devices: int,
    cores: int | None = None,
    max_waiting: int = DEFAULT_MAX_WAITING,
    max_starting: int = 0,
) -> SpawnLimits:
    """The limits for ``devices`` server places (a GPU, a slice, each share of a time-sliced GPU).

    ``max_starting`` 0 derives it (see the module docstring); ``cores`` is
    the hub host's CPU count (``os.cpu_count()`` when None)."""
    if max_waiting < 1:
        raise ValueError(f"WORKBENCH_MAX_WAITING must be at least 1, not {max_waiting}")
    if max_starting < 0:
        raise ValueError(f"WORKBENCH_MAX_STARTING must be 0 (derive it) or more, not {max_starting}")
    derived = max_starting == 0
    if derived:
        cores = max(1, cores if cores is not None else os.cpu_count() or 1)
        max_starting = max(EXTRA, min(max(0, devices) + EXTRA, PER_CORE * cores))
    return SpawnLimits(max_waiting, max_starting, max_waiting + 2 * max_starting, derived)
