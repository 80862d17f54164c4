"""The order of the wait list: first come, first served, or fair share. Pure rules, no I/O.

``WORKBENCH_QUEUE_ORDER`` picks one:

* ``fifo`` (the default): by arrival.
* ``fair-share``: the request whose user used the fewest GPU-hours in the
  quota window (the rolling last 7 days, finished and running leases alike)
  goes first; equal GPU-hours go by arrival. **Aging bound**: a request that
  has waited ``aging_minutes`` (``WORKBENCH_QUEUE_AGING_MINUTES``, default
  30) goes ahead of every request that has not, and aged requests keep their
  arrival order among themselves. So once a request has waited the bound,
  nobody who came after it is ever served before it: its wait is at most the
  bound plus what first come, first served would have given it from then on.

GPU-hours are read once when a request joins (in a worker thread, never on
the event loop): a wait is minutes, the week's usage barely moves in it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

QUEUE_ORDERS = ("fifo", "fair-share")
DEFAULT_AGING_MINUTES = 30.0


class QueueOrderError(ValueError):
    """An unknown queue order; str(err) says which ones exist."""


def parse_queue_order(value: str | None) -> str:
    text = (value or "fifo").strip().lower()
    if text not in QUEUE_ORDERS:
        raise QueueOrderError(f"WORKBENCH_QUEUE_ORDER={value!r} is not a queue order; use 'fifo' (first come, "
                              f"first served, the default) or 'fair-share' (fewest GPU-hours this week first)")
    return text


@dataclass(frozen=True)
class Waiting:
    """One waiting request as the order sees it; ``joined`` in seconds on the caller's clock."""

    key: str
    user: str
    joined: float
    gpu_hours: float = 0.0


def sort_key(item: Waiting, mode: str, now: float, aging_seconds: float) -> tuple:
    if mode != "fair-share":
        return (0, item.joined)
    if now - item.joined >= aging_seconds:
        return (0, item.joined, 0.0)
    return (1, round(item.gpu_hours, 6), item.joined)


def order(waiting: Sequence[Waiting], mode: str, now: float,
          aging_minutes: float = DEFAULT_AGING_MINUTES) -> list[Waiting]:
    """The wait list in serving order (stable: equal keys keep their given order)."""
    aging = aging_minutes * 60.0
    return sorted(waiting, key=lambda w: sort_key(w, mode, now, aging))


def explain(item: Waiting, ordered: Sequence[Waiting], mode: str, now: float,
            aging_minutes: float = DEFAULT_AGING_MINUTES) -> str:
    """Why ``item`` is where it is, for the spawn page ("" in fifo mode: the position says it all)."""
    if mode != "fair-share":
        return ""
    ahead = list(ordered[: list(ordered).index(item)])
    aging = aging_minutes * 60.0
    aged = [w for w in ahead if now - w.joined >= aging]
    less = [w for w in ahead if w not in aged and w.gpu_hours < item.gpu_hours]
    users_less = len({w.user for w in less})
    parts = [f"you used {item.gpu_hours:.1f} GPU-hours this week"]
    if users_less:
        parts.append(f"{users_less} user{'s' if users_less != 1 else ''} who used less "
                     f"{'are' if users_less != 1 else 'is'} ahead")
    if aged:
        parts.append(f"{len(aged)} request{'s' if len(aged) != 1 else ''} waiting longer than "
                     f"{aging_minutes:g} minutes {'go' if len(aged) != 1 else 'goes'} first")
    if now - item.joined >= aging:
        parts.append(f"you have waited over {aging_minutes:g} minutes, so nobody who came after you goes first")
    return "; ".join(parts)
