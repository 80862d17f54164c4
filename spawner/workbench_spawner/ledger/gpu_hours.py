"""GPU-hours: how much of the GPUs each user held in the rolling last week.

A quota's ``gpu_hours_per_week`` is checked against this count, the admin
page and ``api/usage`` show it, and the fair-share queue orders by it. It is
read from the database (the usage ledger and the leases held now), so a hub
restart loses nothing, and every device counts its share of a GPU as
recorded with its lease: a ``1g`` MIG slice held 7 hours is 1 GPU-hour.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta

from sqlalchemy import Connection, bindparam, select

from workbench_spawner.ledger.reasons import reason_kind
from workbench_spawner.ledger.store import (
    _LEASE_COLUMNS,
    AllocationStore,
    Lease,
    LeaseRow,
    UsageRow,
    _aware,
    _group,
    utcnow,
)

WEEK = timedelta(days=7)
# The GPU-hours of leases not ended yet, in ``gpu_hours_by_reason`` (they have no reason yet).
HELD_NOW = "held now"


def gpu_hours_by_user(
    store: AllocationStore,
    now: datetime | None = None,
    window: timedelta = WEEK,
    user: str | None = None,
    *,
    leases: Sequence[Lease] | None = None,
) -> dict[str, float]:
    """GPU-hours per user in the rolling window ending ``now``.

    Finished leases come from the usage ledger (one row per GPU), clipped to
    the window; leases held now count from their start (or the window's
    start) until ``now``. Both live in the database, so a hub restart loses
    nothing. Every device's hours count its share of a GPU, recorded when
    its lease was made: a ``1g`` MIG slice held 7 hours is 1 GPU-hour. ``leases``: the leases held now,
    where the caller read them already for the rest of its answer (held GPUs beside hours).
    """
    seconds: dict[str, float] = {}
    for name, _server, _kind, value in _seconds_in_window(store, now, window, user, leases):
        seconds[name] = seconds.get(name, 0.0) + value
    return {name: value / 3600.0 for name, value in seconds.items()}


def gpu_hours_by_reason(
    store: AllocationStore,
    now: datetime | None = None,
    window: timedelta = WEEK,
    user: str | None = None,
    *,
    leases: Sequence[Lease] | None = None,
) -> dict[str, dict[str, float]]:
    """The same GPU-hours per user, split by why each lease ended (``reasons.reason_kind``: "reclaimed: GPU
    idle 30 min" counts as "reclaimed"); leases still held count under ``HELD_NOW``. An admin reads from it
    how much GPU time ended by a user's Stop, a crash, the idle culler or a node that failed. Each user's
    kinds add up to their ``gpu_hours_by_user`` for the same ``now`` (``leases`` as there)."""
    seconds: dict[str, dict[str, float]] = {}
    for name, _server, kind, value in _seconds_in_window(store, now, window, user, leases):
        kinds = seconds.setdefault(name, {})
        kinds[kind] = kinds.get(kind, 0.0) + value
    return {name: {kind: value / 3600.0 for kind, value in kinds.items()} for name, kinds in seconds.items()}


def gpu_hours_split(
    store: AllocationStore, now: datetime | None = None, window: timedelta = WEEK, user: str | None = None
) -> dict[str, dict[tuple[str, str], float]]:
    """The same GPU-hours per user, split by server (JupyterHub's server name, "" the default one) and by
    reason kind at once: ``api/usage`` sums its split by reason and its split by server from this one read,
    so a student's GPU server and CPU server add up to the total they are charged, whatever ends meanwhile."""
    seconds: dict[str, dict[tuple[str, str], float]] = {}
    for name, server, kind, value in _seconds_in_window(store, now, window, user):
        parts = seconds.setdefault(name, {})
        parts[(server, kind)] = parts.get((server, kind), 0.0) + value
    return {name: {part: value / 3600.0 for part, value in parts.items()} for name, parts in seconds.items()}


def _seconds_in_window(
    store: AllocationStore,
    now: datetime | None,
    window: timedelta,
    user: str | None,
    leases: Sequence[Lease] | None = None,
    within: Connection | None = None,
) -> Iterator[tuple[str, str, str, float]]:
    """(user, server, reason kind, GPU-seconds) of every ledger row and held lease that overlaps the window.

    ``leases``: the leases held now, read already by the caller (the spawn form reads them once per
    render); left out, read here, in the same transaction as the ledger's rows (``_read_window``). The
    ledger's rows are read as plain columns, only those this needs, and with ``user`` only that user's
    (``gpu_usage.user`` is indexed)."""
    now = now or utcnow()
    cutoff = now - window
    rows, leases = _read_window(store, cutoff, user, leases, within)
    for row in rows:
        start = max(_aware(row.started), cutoff)
        end = min(_aware(row.ended), now)
        if end > start:
            share = row.share if row.share is not None else 1.0
            yield row.user, row.server or "", reason_kind(row.reason), share * (end - start).total_seconds()
    for lease in leases:
        if user is not None and lease.user != user:
            continue
        start = max(lease.since, cutoff)
        if now > start:
            yield lease.user, lease.server, HELD_NOW, lease.gpu_share * (now - start).total_seconds()


def _read_window(
    store: AllocationStore,
    cutoff: datetime,
    user: str | None,
    leases: Sequence[Lease] | None,
    within: Connection | None = None,
) -> tuple[list, Sequence[Lease]]:
    """The ledger rows that ended at or after ``cutoff`` (of ``user``, if given), and the leases held now
    unless the caller read them already, from ONE snapshot of the database.

    A release moves a lease into the ledger in one transaction; two separate reads could see it in
    neither (the ledger read before the release, the leases after) or in both, and a lease still held
    accrues time between two reads, so a total and its parts read apart disagree. One read transaction
    sees one state: SQLite's deferred transaction (WAL) keeps the snapshot of its first read; PostgreSQL
    needs REPEATABLE READ for that (at READ COMMITTED each statement sees the newest commit).

    The ledger's rows come as plain rows of the six columns GPU-hours need, as ``store.usage`` selects
    them but without tracked ORM objects (the spawn form and every spawn ask: statements built once)."""
    query, params = (_USAGE, {"cutoff": cutoff}) if user is None else (_USAGE_OF, {"cutoff": cutoff, "user": user})
    if within is not None:  # the caller's open transaction is the snapshot
        rows = list(within.execute(query, params))
        return rows, _group(within.execute(_LEASES)) if leases is None else leases
    with store.read_engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
        with conn.begin():
            rows = list(conn.execute(query, params))
            if leases is None:
                leases = _group(conn.execute(_LEASES))
    return rows, leases


# The ledger's rows in a window (``_usage_in_window``), and one user's.
_USAGE = (
    select(UsageRow.user, UsageRow.server, UsageRow.reason, UsageRow.started, UsageRow.ended, UsageRow.share)
    .where(UsageRow.ended >= bindparam("cutoff"))
    .order_by(UsageRow.id)
)
_USAGE_OF = _USAGE.where(UsageRow.user == bindparam("user"))
# The leases held now, as ``AllocationStore.leases`` reads them.
_LEASES = select(*_LEASE_COLUMNS).order_by(LeaseRow.id)


def gpu_hours_used(
    store: AllocationStore,
    user: str,
    now: datetime | None = None,
    window: timedelta = WEEK,
    *,
    leases: Sequence[Lease] | None = None,
    within: Connection | None = None,
) -> float:
    """``user``'s GPU-hours in the rolling window ending ``now`` (``leases``: the leases held now, if the
    caller read them already). ``within``: the connection of a transaction the caller has open, whose
    snapshot the ledger is read in: the quota check reads the leases and the ledger inside the transaction
    that writes a lease (``AllocationStore._check``), so a release committed meanwhile is seen in both or
    in neither."""
    seconds = 0.0
    for _name, _server, _kind, value in _seconds_in_window(store, now, window, user, leases, within):
        seconds += value
    return seconds / 3600.0
