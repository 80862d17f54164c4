"""What the reconciler fixed, counted in the GPU database (``workbench_reconcile_fixes``).

The reconciler runs in the hub process (``GPUPolicy.reconcile``); the
workbench service, a separate process, serves ``/metrics``. A counter kept
in the hub's memory would reach nobody and would start again at 0 on every
hub restart, so each fix adds one to a row per kind here, in the same
database the ledger lives in: one truth that the service reads
(``workbench_reconcile_fixes_total{kind}``). Each call is one transaction
(blocking: the reconciler's thread).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Integer, String, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, mapped_column

from workbench_spawner.ledger.store import AllocationStore, Base, utcnow

# A lease whose server is gone was closed (with the backend's reason, or "server gone").
LEASE_CLOSED = "lease_closed"
# A server that ran without a lease got one: its devices were free.
SERVER_ADOPTED = "server_adopted"
# A server that ran without a lease was stopped: its devices are someone else's (or unknown to the hub).
SERVER_STOPPED = "server_stopped"
# The kinds /metrics always writes (0 before the first fix), so a dashboard's rate() has a series from the start.
KINDS = (LEASE_CLOSED, SERVER_ADOPTED, SERVER_STOPPED)


class ReconcileFixRow(Base):
    """How many fixes of one kind the reconcilers of this database made, ever (migration 0007)."""

    __tablename__ = "workbench_reconcile_fixes"

    kind: Mapped[str] = mapped_column(String(64), primary_key=True)
    count: Mapped[int] = mapped_column(Integer, default=0)
    last_fix: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ReconcileBook:
    """Count the reconciler's fixes (the hub) and read the counts (the service's /metrics)."""

    def __init__(self, store: AllocationStore):
        self.store = store

    def count(self, kind: str, retries: int = 5) -> None:
        """Add one fix of ``kind``. Two writers may insert a kind's first row at once: the loser adds again."""
        for attempt in range(retries):
            try:
                with self.store.writes().begin() as session:
                    # One UPDATE that adds in the database: two hubs counting at once on PostgreSQL (READ
                    # COMMITTED) would each read n and write n + 1 with a read-modify-write.
                    added = session.execute(
                        update(ReconcileFixRow)
                        .where(ReconcileFixRow.kind == kind)
                        .values(count=ReconcileFixRow.count + 1, last_fix=utcnow())
                    ).rowcount
                    if not added:
                        session.add(ReconcileFixRow(kind=kind, count=1, last_fix=utcnow()))
                return
            except IntegrityError:
                if attempt == retries - 1:
                    raise

    def counts(self) -> dict[str, int]:
        """Every kind's count: the known ``KINDS`` (0 if never fixed) and any other kind stored."""
        with self.store.reads()() as session:
            stored = {row.kind: int(row.count) for row in session.scalars(select(ReconcileFixRow))}
        return {**dict.fromkeys(KINDS, 0), **stored}
