"""Where idle reclaim keeps its state: per-GPU idle clocks and the exempt groups.

The pure rules live in ``workbench_spawner.rules.idle``; this module only stores
what they need between passes, in the allocation store's database, so a
restart of the workbench service keeps every clock (a GPU idle for 25 of 30
minutes is still idle for 25 after a restart) and the fleet page, in any
process, shows the same idle times. Every call is one transaction: call it
through ``asyncio.to_thread`` from the event loop.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import DateTime, Float, Integer, String, Text, UniqueConstraint, delete, select
from sqlalchemy.orm import Mapped, mapped_column

from workbench_spawner.ledger.store import AllocationStore, Base, _aware, utcnow
from workbench_spawner.rules.idle import GpuTrack

GROUP_PATTERN = re.compile(r"^[^\x00-\x1f/]{1,255}$")
# The longest reason an exemption's request body may give (the service's IdleExemptionBody schema
# checks it; a test compares the two).
MAX_REASON = 500


class IdleTrackRow(Base):
    __tablename__ = "gpu_idle_tracks"
    __table_args__ = (UniqueConstraint("node", "gpu_uuid", name="one_track_per_gpu"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node: Mapped[str] = mapped_column(String(255), default="")
    gpu_uuid: Mapped[str] = mapped_column(String(128))
    user: Mapped[str] = mapped_column(String(255), index=True)
    server: Mapped[str] = mapped_column(String(255), default="")
    idle_since: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    last_reading: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    utilization: Mapped[float | None] = mapped_column(Float, nullable=True)
    source: Mapped[str] = mapped_column(String(32), default="")


class IdleExemptionRow(Base):
    __tablename__ = "gpu_idle_exemptions"

    group: Mapped[str] = mapped_column(String(255), primary_key=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    created_by: Mapped[str] = mapped_column(String(255), default="")
    # When it ends (migration 0010): a course's staff exempt their course for a session; an admin's has none.
    until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class ExemptionError(ValueError):
    """An exemption that cannot be stored; str(err) says why."""


def _track(row: IdleTrackRow) -> GpuTrack:
    return GpuTrack(
        node=row.node or "",
        gpu_uuid=row.gpu_uuid,
        user=row.user,
        server=row.server or "",
        idle_since=_aware(row.idle_since) if row.idle_since else None,
        last_reading=_aware(row.last_reading) if row.last_reading else None,
        utilization=row.utilization,
        source=row.source or "",
    )


class IdleBook:
    def __init__(self, store: AllocationStore):
        self._writes = store.writes()
        self._reads = store.reads()

    # -- idle clocks --------------------------------------------------------------

    def tracks(self) -> list[GpuTrack]:
        with self._reads() as session:
            return [_track(r) for r in session.scalars(select(IdleTrackRow).order_by(IdleTrackRow.id))]

    def save(self, tracks: Iterable[GpuTrack]) -> None:
        """Replace the whole table with ``tracks`` (the GPUs held now): GPUs given back lose their clock."""
        tracks = list(tracks)
        with self._writes.begin() as session:
            existing = {(r.node or "", r.gpu_uuid): r for r in session.scalars(select(IdleTrackRow))}
            keep = {(t.node, t.gpu_uuid) for t in tracks}
            gone = [r.id for key, r in existing.items() if key not in keep]
            if gone:
                session.execute(delete(IdleTrackRow).where(IdleTrackRow.id.in_(gone)))
            for t in tracks:
                row = existing.get((t.node, t.gpu_uuid))
                if row is None:
                    row = IdleTrackRow(node=t.node, gpu_uuid=t.gpu_uuid)
                    session.add(row)
                row.user, row.server = t.user, t.server
                row.idle_since, row.last_reading = t.idle_since, t.last_reading
                row.utilization, row.source = t.utilization, t.source[:32]

    def forget(self, user: str, server: str) -> None:
        with self._writes.begin() as session:
            session.execute(delete(IdleTrackRow).where(IdleTrackRow.user == user, IdleTrackRow.server == server))

    # -- exempt groups ------------------------------------------------------------

    def exempt_groups(self, now: datetime | None = None) -> dict[str, dict]:
        """The exemptions in force at ``now`` (default: now): one that ended (``until``) counts no more."""
        now = now or utcnow()
        with self._reads() as session:
            return {
                r.group: {
                    "group": r.group,
                    "reason": r.reason or "",
                    "created": _aware(r.created).isoformat(),
                    "created_by": r.created_by or "",
                    "until": _aware(r.until).isoformat() if r.until is not None else None,
                }
                for r in session.scalars(select(IdleExemptionRow).order_by(IdleExemptionRow.group))
                if r.until is None or _aware(r.until) > now
            }

    def exempt(
        self,
        group: str,
        reason: str = "",
        by: str = "",
        now: datetime | None = None,
        until: datetime | None = None,
    ) -> dict:
        """Exempt ``group`` (again); ``until``: when the exemption ends (None: until it is ended by hand)."""
        check_group_name(group)
        now = now or utcnow()
        with self._writes.begin() as session:
            row = session.get(IdleExemptionRow, group)
            if row is None:
                row = IdleExemptionRow(group=group, created=now)
                session.add(row)
            row.reason, row.created_by, row.until = reason, by[:255], until
            made = {
                "group": group,
                "reason": reason,
                "created": _aware(row.created).isoformat(),
                "created_by": row.created_by,
                "until": _aware(until).isoformat() if until is not None else None,
            }
        return made

    def unexempt(self, group: str) -> bool:
        with self._writes.begin() as session:
            result = session.execute(delete(IdleExemptionRow).where(IdleExemptionRow.group == group))
            return bool(result.rowcount)


def check_group_name(group: object) -> str:
    if not isinstance(group, str) or not GROUP_PATTERN.match(group) or group.strip() != group:
        raise ExemptionError(
            "a group name is 1 to 255 characters, with no slash, control character or leading/trailing space"
        )
    return group
