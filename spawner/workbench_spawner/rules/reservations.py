"""Reservations: N GPUs held for a group's members during a window. Pure rules, no I/O.

A reservation names a JupyterHub group, a number of GPUs (optionally of one
model) and a window in the hub's time zone, either one-off
(``2026-12-08 10:00-12:00``) or weekly (``Tue 10:00-12:00``). A window whose
end is not after its start crosses midnight (``Tue 22:00-01:00`` ends on
Wednesday). Reservations count GPUs, they do not pin UUIDs: during the
window a non-member may take a free GPU only while enough free GPUs stay
behind for the members who have not taken theirs yet, so whichever GPUs the
members end up on, the count is what is protected.

The rules, each a function of the reservations, the holdings and ``now``
(every caller passes its clock, so tables can test any instant):

* **held for members** (``held_for_members``): all N from the window's start
  until ``start + grace``; after the grace period only what members hold or
  wait for (the rest "nobody asked for" goes back to everyone); 0 outside.
* **who may take what** (``takeable``): members of a reservation may take
  any free GPU; everyone else only what leaves every other active
  reservation's remaining need coverable (per model and in total).
* **preemption** (``preemption_phase``, ``preemption_plan``): a reservation
  with ``preempt`` warns the non-members who hold the GPUs it will need
  ``warn_minutes`` before its start and stops them at the start (newest
  servers first, only as many as the shortfall); without ``preempt`` they
  keep their GPUs and the reservation fills as they stop.
* **feasibility** (``check_feasible``): a new reservation must fit the
  inventory at every instant it overlaps others, per model and in total.

Time zone: every window is wall-clock time in the hub's zone
(``WORKBENCH_TIME_ZONE``); a weekly window keeps its local time across DST.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from itertools import pairwise

from workbench_devices.mig import is_profile_name
from workbench_spawner.rules.window import ReservationError, Window, utc

Clock = Callable[[], datetime]
DEFAULT_GRACE_MINUTES = 15.0
DEFAULT_WARN_MINUTES = 10.0
MAX_MINUTES = 24 * 60.0
# How far ahead overlaps are looked for (weekly windows repeat; one-offs are
# refused further out than this, so the check is complete).
HORIZON = timedelta(days=400)


def gpus_text(count: int, kind: str | None) -> str:
    """ "1 GPU", "3 H100-80GB GPUs", "1 1g.18gb slice", "2 H200-141GB 1g.18gb slices": how requests and
    reservations name what they ask for (``kind``: a model, or a request's ``SpawnRequest.kind``)."""
    noun = "slice" if kind and is_profile_name(kind.split(" ")[-1]) else "GPU"
    return f"{count} {kind + ' ' if kind else ''}{noun}{'s' if count != 1 else ''}"


@dataclass(frozen=True)
class Reservation:
    group: str
    gpus: int
    window: Window
    model: str | None = None
    grace_minutes: float = DEFAULT_GRACE_MINUTES
    preempt: bool = False
    warn_minutes: float = DEFAULT_WARN_MINUTES
    id: int = 0

    def describe(self) -> str:
        weekly = "weekly " if self.window.weekly else ""
        return f"{gpus_text(self.gpus, self.model)} for {self.group}, {weekly}{self.window.text()}"

    def in_pool(self, model: str | None) -> bool:
        return self.model is None or (model or "").lower() == self.model.lower()


@dataclass(frozen=True)
class Holding:
    """One server's GPUs, with the groups its user was in when it started."""

    user: str
    server: str
    gpus: tuple[str, ...]
    groups: frozenset[str]
    since: datetime


def is_member(res: Reservation, groups: Iterable[str]) -> bool:
    return res.group in set(groups)


def demand_by_group(asking: Iterable[tuple[Iterable[str], int]]) -> dict[str, int]:
    """GPUs asked for per group, from (the asker's groups, GPUs) of every request waiting now."""
    demand: dict[str, int] = {}
    for groups, count in list(asking):
        for group in groups:
            demand[group] = demand.get(group, 0) + count
    return demand


def held_for_members(res: Reservation, now: datetime, tz: tzinfo, member_demand: int) -> int:
    """GPUs the reservation keeps for its members now (see the module docstring)."""
    occurrence = res.window.current(now, tz)
    if occurrence is None:
        return 0
    if utc(now) < occurrence[0] + timedelta(minutes=res.grace_minutes):
        return res.gpus
    return min(res.gpus, max(0, member_demand))


def _member_use(res: Reservation, holdings: Sequence[Holding], models: Mapping[str, str]) -> int:
    return sum(1 for h in holdings if res.group in h.groups for u in h.gpus if res.in_pool(models.get(u)))


def remaining_needs(
    reservations: Sequence[Reservation],
    holdings: Sequence[Holding],
    models: Mapping[str, str],
    now: datetime,
    tz: tzinfo,
    waiting: Mapping[str, int] | None = None,
    exclude_groups: Iterable[str] = (),
) -> list[tuple[Reservation, int]]:
    """Active reservations (other than the caller's groups') and the free GPUs each still needs kept."""
    skip = set(exclude_groups)
    needs = []
    for res in reservations:
        if res.group in skip:
            continue
        used = _member_use(res, holdings, models)
        keep = held_for_members(res, now, tz, used + (waiting or {}).get(res.group, 0)) - used
        if keep > 0:
            needs.append((res, keep))
    return needs


def deficit(free_models: Mapping[str, int], needs: Sequence[tuple[Reservation, int]]) -> int:
    """How many kept GPUs the free ones cannot cover: per model, plus in total (any-model needs use the rest)."""
    by_model: Counter = Counter()
    for res, keep in needs:
        if res.model:
            by_model[res.model.lower()] += keep
    lowered: Counter = Counter()
    for model, n in free_models.items():
        lowered[(model or "").lower()] += n
    per_model = sum(max(0, n - lowered[m]) for m, n in by_model.items())
    return per_model + max(0, sum(keep for _, keep in needs) - sum(free_models.values()))


def takeable(
    free: Sequence[str], models: Mapping[str, str], count: int, needs: Sequence[tuple[Reservation, int]]
) -> list[str]:
    """Up to ``count`` of the ``free`` GPUs (in order) a user may take without leaving a need uncovered.

    ``needs`` are those of reservations the user is not a member of
    (``remaining_needs(..., exclude_groups=user's groups)``). A GPU may be
    taken only if the deficit does not grow, so when a non-member kept
    reserved GPUs at the start, GPUs that come free go to the members first.
    Fewer than ``count`` back means the request must wait."""
    left = Counter(models.get(u, "") for u in free)
    short = deficit(left, needs)
    chosen: list[str] = []
    for uuid in free:
        if len(chosen) == count:
            break
        model = models.get(uuid, "")
        left[model] -= 1
        if deficit(left, needs) <= short:
            chosen.append(uuid)
        else:
            left[model] += 1
    return chosen


def preemption_phase(res: Reservation, now: datetime, tz: tzinfo) -> tuple[str, datetime] | None:
    """("warn", start) within warn_minutes before a start; ("stop", start) from the start to the end of
    the grace period; None otherwise or without ``preempt``."""
    if not res.preempt:
        return None
    now = utc(now)
    current = res.window.current(now, tz)
    if current is not None and now < current[0] + timedelta(minutes=max(res.grace_minutes, 1.0)):
        return "stop", current[0]
    upcoming = res.window.next_start(now, tz)
    if upcoming is not None and upcoming[0] - timedelta(minutes=res.warn_minutes) <= now < upcoming[0]:
        return "warn", upcoming[0]
    return None


def preemption_plan(
    res: Reservation, holdings: Sequence[Holding], free: Sequence[str], models: Mapping[str, str]
) -> list[Holding]:
    """The non-member servers to stop (newest first) so that ``res.gpus`` of its pool are free or members'."""
    have = sum(1 for u in free if res.in_pool(models.get(u))) + _member_use(res, holdings, models)
    shortfall = res.gpus - have
    plan = []
    for holding in sorted(holdings, key=lambda h: h.since, reverse=True):
        if shortfall <= 0:
            break
        if res.group in holding.groups:
            continue
        in_pool = sum(1 for u in holding.gpus if res.in_pool(models.get(u)))
        if in_pool:
            plan.append(holding)
            shortfall -= in_pool
    return plan


def check_feasible(
    new: Reservation, existing: Sequence[Reservation], inventory: Mapping[str, int], now: datetime, tz: tzinfo
) -> None:
    """Raise ReservationError (a sentence) unless ``new`` fits beside ``existing`` at every instant.

    ``inventory`` maps model -> GPUs of that model."""
    total = sum(inventory.values())
    if new.gpus < 1:
        raise ReservationError("a reservation needs at least 1 GPU")
    pool = total if new.model is None else inventory.get(new.model, 0)
    what = "GPUs" if new.model is None else f"{new.model} GPUs"
    if new.gpus > pool:
        raise ReservationError(f"{new.gpus} {what} is more than this hub has ({pool}); reserve at most {pool}")
    now = utc(now)
    mine = new.window.occurrences(now, now + HORIZON, tz)
    if not mine:
        when = "is past" if new.window.day and new.window._at(new.window.day, tz)[1] <= now else "is too far ahead"
        raise ReservationError(
            f"the window {new.window.text()} {when}: a one-off window must end after now "
            f"and start within {HORIZON.days} days"
        )
    for begin, finish in mine:
        overlapping = [(r, b, f) for r in existing for b, f in r.window.occurrences(begin, finish, tz)]
        if not overlapping:
            continue
        points = sorted(
            {begin, finish, *(max(b, begin) for _, b, _ in overlapping), *(min(f, finish) for _, _, f in overlapping)}
        )
        for a, b in pairwise(points):
            present = [r for r, rb, rf in overlapping if rb < b and rf > a]
            by_model: Counter = Counter()
            for r in [new, *present]:
                if r.model:
                    by_model[r.model] += r.gpus
            demand = sum(r.gpus for r in [new, *present])
            short = [m for m, n in by_model.items() if n > inventory.get(m, 0)]
            if demand > total or short:
                others = "; ".join(f"{r.describe()} ({r.gpus})" for r in present)
                have = f"{total} GPUs" if not short else f"{inventory.get(short[0], 0)} {short[0]} GPUs"
                need = demand if not short else by_model[short[0]]
                raise ReservationError(
                    f"it overlaps {others} from {a:%Y-%m-%d %H:%M} UTC: together {need} GPUs are reserved but this "
                    f"hub has {have}; reserve fewer, pick another time, or delete the other reservation"
                )


def next_occurrence(res: Reservation, now: datetime, tz: tzinfo) -> tuple[datetime, datetime] | None:
    """The occurrence in progress, else the next one (None: a one-off that is over)."""
    current = res.window.current(now, tz)
    if current is not None:
        return current
    if res.window.weekly:
        return res.window.next_start(now, tz)
    found = res.window.occurrences(now, now + HORIZON, tz)
    return found[0] if found else None


def _clock_text(when: datetime, now: datetime, tz: tzinfo) -> str:
    local = when.astimezone(tz)
    return f"{local:%H:%M}" if local.date() == utc(now).astimezone(tz).date() else f"{local:%a %H:%M}"


def reserved_now(
    reservations: Sequence[Reservation],
    now: datetime,
    tz: tzinfo,
    inventory: Mapping[str, int],
    groups: Iterable[str] = (),
    *,
    holdings: Sequence[Holding] | None = None,
    models: Mapping[str, str] | None = None,
    waiting: Mapping[str, int] | None = None,
) -> list[str]:
    """Sentences for the spawn form, one per open window: what it holds for its members **now**.

    During the grace period that is the whole reservation: "8 of 16 GPUs
    reserved for ml-course until 12:00". After it, only what members hold or
    wait for is kept (``held_for_members``), and the sentence says so: "3 of
    16 GPUs reserved for ml-course until 12:00 (5 of its 8 went back to
    everyone at 10:15: no member asked for them)". That needs the demand:
    ``holdings`` (every lease now), ``models`` (GPU UUID -> model) and
    ``waiting`` (group -> GPUs its members wait for). A caller without them
    gets the bound ("up to 8 of 16 ...") and when it stopped being a
    promise, never an overstatement. A member reads that the GPUs are theirs
    to take; everyone else how many are kept from them."""
    mine = set(groups)
    lines = []
    for res in reservations:
        current = res.window.current(now, tz)
        if current is None:
            continue
        when = _clock_text(current[1], now, tz)
        total = inventory.get(res.model, 0) if res.model else sum(inventory.values())
        gpus = f"{total} {res.model + ' ' if res.model else ''}GPUs"
        grace_end = current[0] + timedelta(minutes=res.grace_minutes)
        details = []
        if utc(now) < grace_end:
            held = f"{res.gpus}"
        elif holdings is None:
            held = f"up to {res.gpus}"
            details.append(f"since {_clock_text(grace_end, now, tz)} only as many as members use or wait for")
        else:
            used = _member_use(res, holdings, models or {})
            kept = held_for_members(res, now, tz, used + (waiting or {}).get(res.group, 0))
            held = f"{kept}"
            if kept < res.gpus:
                back = res.gpus - kept
                details.append(
                    f"{'all' if kept == 0 else f'{back} of its'} {res.gpus} went back to everyone at "
                    f"{_clock_text(grace_end, now, tz)}: no member asked for them"
                )
        if res.group in mine:
            details.append("you are a member: you may use them")
        line = f"{held} of {gpus} reserved for {res.group} until {when}"
        lines.append(line + (f" ({'; '.join(details)})" if details else ""))
    return lines


def gpus_user_may_take(
    free: Sequence[str],
    models: Mapping[str, str],
    count: int,
    user_groups: Iterable[str],
    reservations: Sequence[Reservation],
    holdings: Sequence[Holding],
    now: datetime,
    tz: tzinfo,
    waiting: Mapping[str, int] | None = None,
) -> list[str]:
    """The GPUs of ``free`` (in preference order) this user may take now, at most ``count``.

    What placement does inside its transaction, as one call for replays
    (benchmarks/class_day.py): fewer than ``count`` back means the request waits."""
    groups = list(user_groups)
    needs = remaining_needs(reservations, holdings, models, now, tz, waiting, exclude_groups=groups)
    return takeable(free, models, count, needs)
