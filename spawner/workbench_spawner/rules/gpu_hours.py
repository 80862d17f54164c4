"""GPU-hours: how much of the GPUs each user held in the rolling last week.

A quota's ``gpu_hours_per_week`` is checked against this count, the admin
page and ``api/usage`` show it, and the fair-share queue orders by it. It is
read from the database (the usage ledger and the leases held now), so a hub
restart loses nothing, and every device counts its share of a GPU as
recorded with its lease: a ``1g`` MIG slice held 7 hours is 1 GPU-hour.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from workbench_spawner.ledger.store import AllocationStore, _aware, utcnow

WEEK = timedelta(days=7)


def gpu_hours_by_user(
    store: AllocationStore, now: datetime | None = None, window: timedelta = WEEK, user: str | None = None
) -> dict[str, float]:
    """GPU-hours per user in the rolling window ending ``now``.

    Finished leases come from the usage ledger (one row per GPU), clipped to
    the window; leases held now count from their start (or the window's
    start) until ``now``. Both live in the database, so a hub restart loses
    nothing. Every device's hours count its share of a GPU, recorded when
    its lease was made: a ``1g`` MIG slice held 7 hours is 1 GPU-hour.
    """
    now = now or utcnow()
    cutoff = now - window
    seconds: dict[str, float] = {}
    for row in store.usage(since=cutoff, user=user):
        start = max(_aware(row.started), cutoff)
        end = min(_aware(row.ended), now)
        if end > start:
            share = row.share if row.share is not None else 1.0
            seconds[row.user] = seconds.get(row.user, 0.0) + share * (end - start).total_seconds()
    for lease in store.leases():
        if user is not None and lease.user != user:
            continue
        start = max(lease.since, cutoff)
        if now > start:
            seconds[lease.user] = seconds.get(lease.user, 0.0) + lease.gpu_share * (now - start).total_seconds()
    return {name: value / 3600.0 for name, value in seconds.items()}


def gpu_hours_used(store: AllocationStore, user: str, now: datetime | None = None, window: timedelta = WEEK) -> float:
    return gpu_hours_by_user(store, now, window, user=user).get(user, 0.0)
