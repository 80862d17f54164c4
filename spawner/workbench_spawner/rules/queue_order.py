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

**Arrival** is when the user first began asking for this server, not when
the current try joined the line: a spawn refused at the queue timeout
(``WORKBENCH_QUEUE_TIMEOUT``, 300 s by default, shorter than the aging
bound) that is tried again within ``REJOIN_MINUTES`` (15) of the refusal
keeps its first arrival (``placement/waitlist.py``'s ``WaitList`` remembers it per user and
server until the request is served, or stops asking for that long). So the
bound counts across refusals and retries: a heavy user who keeps asking
ages like anyone else, whatever the queue timeout, and nobody starves. The
time between a refusal and the retry counts as waiting (the user still
wanted the GPU); in ``fifo`` the same rule keeps a retry ahead of those who
first asked later.

GPU-hours are read once when a request joins (in a worker thread, never on
the event loop): a wait is minutes, the week's usage barely moves in it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

QUEUE_ORDERS = ("fifo", "fair-share")
DEFAULT_AGING_MINUTES = 30.0
# A retry this soon after a refusal (or a cancelled wait) keeps its first arrival time.
REJOIN_MINUTES = 15.0


class QueueOrderError(ValueError):
    """An unknown queue order; str(err) says which ones exist."""


def parse_queue_order(value: str | None) -> str:
    text = (value or "fifo").strip().lower()
    if text not in QUEUE_ORDERS:
        raise QueueOrderError(
            f"WORKBENCH_QUEUE_ORDER={value!r} is not a queue order; use 'fifo' (first come, "
            f"first served, the default) or 'fair-share' (fewest GPU-hours this week first)"
        )
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


def order(
    waiting: Sequence[Waiting], mode: str, now: float, aging_minutes: float = DEFAULT_AGING_MINUTES
) -> list[Waiting]:
    """The wait list in serving order (stable: equal keys keep their given order)."""
    aging = aging_minutes * 60.0
    return sorted(waiting, key=lambda w: sort_key(w, mode, now, aging))


def explain(
    item: Waiting, ordered: Sequence[Waiting], mode: str, now: float, aging_minutes: float = DEFAULT_AGING_MINUTES
) -> str:
    """Why ``item`` is where it is, for the spawn page ("" in fifo mode: the position says it all)."""
    if mode != "fair-share":
        return ""
    ahead = list(ordered[: list(ordered).index(item)])
    aging = aging_minutes * 60.0
    aged = [w for w in ahead if now - w.joined >= aging]
    less = [w for w in ahead if w not in aged and w.gpu_hours < item.gpu_hours]
    return _words(item, len({w.user for w in less}), len(aged), now - item.joined >= aging, aging_minutes)


def explain_all(
    ordered: Sequence[Waiting], mode: str, now: float, aging_minutes: float = DEFAULT_AGING_MINUTES
) -> list[str]:
    """``explain`` for every request of ``order(...)``'s result at once, in one pass.

    The wait list asks for every waiter's reason whenever the line changes;
    one ``explain`` each would cost the square of the line's length. This
    relies on the order's shape (aged requests first, the rest by rounded
    GPU-hours), so give it what ``order`` returned for the same ``now``."""
    if mode != "fair-share":
        return [""] * len(ordered)
    aging = aging_minutes * 60.0
    out: list[str] = []
    aged_ahead = 0
    earlier_users: set[str] = set()  # not aged, in runs of fewer (rounded) GPU-hours: all used less
    run: list[Waiting] = []  # the current run of equal rounded GPU-hours, so far
    for item in ordered:
        if now - item.joined >= aging:
            out.append(_words(item, 0, aged_ahead, True, aging_minutes))
            aged_ahead += 1
            continue
        if run and round(run[0].gpu_hours, 6) != round(item.gpu_hours, 6):
            earlier_users.update(w.user for w in run)
            run = []
        lighter = [w.user for w in run if w.gpu_hours < item.gpu_hours]  # below the rounding: rare
        users_less = len(earlier_users.union(lighter)) if lighter else len(earlier_users)
        out.append(_words(item, users_less, aged_ahead, False, aging_minutes))
        run.append(item)
    return out


def _words(item: Waiting, users_less: int, aged_ahead: int, item_aged: bool, aging_minutes: float) -> str:
    parts = [f"you used {item.gpu_hours:.1f} GPU-hours this week"]
    if users_less:
        parts.append(
            f"{users_less} user{'s' if users_less != 1 else ''} who used less "
            f"{'are' if users_less != 1 else 'is'} ahead"
        )
    if aged_ahead:
        parts.append(
            f"{aged_ahead} request{'s' if aged_ahead != 1 else ''} waiting longer than "
            f"{aging_minutes:g} minutes {'go' if aged_ahead != 1 else 'goes'} first"
        )
    if item_aged:
        parts.append(f"you have waited over {aging_minutes:g} minutes, so nobody who came after you goes first")
    return "; ".join(parts)
