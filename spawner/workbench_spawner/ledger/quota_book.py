"""Quotas as stored: the ``gpu_quotas`` and ``gpu_session_limits`` tables and the :class:`QuotaBook` over them.

The rules (what a quota allows, how the effective quota of a user is chosen,
how an admin's body becomes a quota) are ``workbench_spawner.rules.quota``,
pure functions of their inputs; this module is where they meet the
allocation store's database, so that the hub and the workbench service see
the same numbers. Each book call is one transaction.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import date, datetime
from typing import Any

from sqlalchemy import (
    Boolean,
    DateTime,
    Float,
    Integer,
    String,
    Text,
    UniqueConstraint,
    and_,
    bindparam,
    case,
    delete,
    or_,
    select,
    true,
)
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Mapped, mapped_column

from workbench_spawner.ledger.course_book import CourseRow
from workbench_spawner.ledger.store import AllocationStore, Base, _aware, utcnow
from workbench_spawner.rules.course import RUNNING, dates_phase
from workbench_spawner.rules.quota import KINDS, EffectiveQuota, Quota, effective_quota


class QuotaRow(Base):
    """A quota an admin set for one user or one group."""

    __tablename__ = "gpu_quotas"
    __table_args__ = (UniqueConstraint("kind", "name", name="one_quota_per_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(8))  # "user" | "group"
    name: Mapped[str] = mapped_column(String(255))
    max_gpus: Mapped[int] = mapped_column(Integer)
    gpu_hours_per_week: Mapped[float | None] = mapped_column(Float, nullable=True)
    allowed_models: Mapped[str | None] = mapped_column(Text, nullable=True)  # JSON list
    max_session_hours: Mapped[float | None] = mapped_column(Float, nullable=True)
    gpu_idle_minutes: Mapped[float | None] = mapped_column(Float, nullable=True)  # migration 0003
    gpu_idle_threshold: Mapped[float | None] = mapped_column(Float, nullable=True)  # percent
    whole_gpus: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())  # migration 0005
    allowed_profiles: Mapped[str | None] = mapped_column(Text, nullable=True)  # JSON list; null: any
    shared_gpus: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())  # migration 0006
    updated: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_by: Mapped[str] = mapped_column(String(255), default="")
    # The course whose staff set it (migration 0010): it applies only while that course runs.
    course: Mapped[str | None] = mapped_column(String(255), nullable=True)


class SessionLimitRow(Base):
    """The session length in force when a server started (for the service to enforce)."""

    __tablename__ = "gpu_session_limits"
    __table_args__ = (UniqueConstraint("user", "server", name="one_limit_per_server"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user: Mapped[str] = mapped_column(String(255), index=True)
    server: Mapped[str] = mapped_column(String(255), default="")
    max_session_hours: Mapped[float] = mapped_column(Float)
    recorded: Mapped[datetime] = mapped_column(DateTime(timezone=True))


def _row_to_quota(row: Any) -> Quota:
    """An ORM row or a plain one read by the same columns (``effective``'s statement)."""
    models = json.loads(row.allowed_models) if row.allowed_models is not None else None
    profiles = json.loads(row.allowed_profiles) if row.allowed_profiles is not None else None
    return Quota(
        max_gpus=row.max_gpus,
        gpu_hours_per_week=row.gpu_hours_per_week,
        allowed_models=tuple(models) if models is not None else None,
        max_session_hours=row.max_session_hours,
        gpu_idle_minutes=row.gpu_idle_minutes,
        gpu_idle_threshold=row.gpu_idle_threshold,
        whole_gpus=bool(row.whole_gpus) if row.whole_gpus is not None else True,
        allowed_profiles=tuple(profiles) if profiles is not None else None,
        shared_gpus=bool(row.shared_gpus) if row.shared_gpus is not None else True,
    )


@dataclass(frozen=True)
class StoredQuota:
    kind: str
    name: str
    quota: Quota
    updated: datetime
    updated_by: str = ""
    course: str | None = None  # set by this course's staff: in force only while the course runs

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            **self.quota.to_json(),
            "updated": self.updated.isoformat(),
            "updated_by": self.updated_by,
            "course": self.course,
        }


class QuotaBook:
    """Quotas in the allocation store's database; every call one transaction.

    ``today`` (the hub's date in its time zone, by its clock; None: courses are not looked at) decides which
    courses run: a course's group quota, and a quota its staff set for a student, are in force only from the
    course's start date to its end date (``rules.course``)."""

    def __init__(self, store: AllocationStore, today: Callable[[], date] | None = None):
        self.store = store
        self.today = today
        self._sessions = store.writes()
        self._reads = store.reads()

    def get(self, kind: str, name: str) -> StoredQuota | None:
        with self._reads() as session:
            row = session.scalar(select(QuotaRow).where(QuotaRow.kind == kind, QuotaRow.name == name))
            return self._stored(row) if row else None

    def all(self, kind: str | None = None) -> list[StoredQuota]:
        with self._reads() as session:
            query = select(QuotaRow).order_by(QuotaRow.kind, QuotaRow.name)
            if kind:
                query = query.where(QuotaRow.kind == kind)
            return [self._stored(r) for r in session.scalars(query)]

    def set(self, kind: str, name: str, quota: Quota, by: str = "", course: str | None = None) -> StoredQuota:
        """Store a quota (``course``: the course whose staff set it; its end takes the quota away)."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}")
        with self._sessions.begin() as session:
            row = session.scalar(select(QuotaRow).where(QuotaRow.kind == kind, QuotaRow.name == name))
            if row is None:
                row = QuotaRow(kind=kind, name=name)
                session.add(row)
            row.max_gpus = quota.max_gpus
            row.gpu_hours_per_week = quota.gpu_hours_per_week
            row.allowed_models = json.dumps(list(quota.allowed_models)) if quota.allowed_models is not None else None
            row.max_session_hours = quota.max_session_hours
            row.gpu_idle_minutes = quota.gpu_idle_minutes
            row.gpu_idle_threshold = quota.gpu_idle_threshold
            row.whole_gpus = quota.whole_gpus
            row.allowed_profiles = (
                json.dumps(list(quota.allowed_profiles)) if quota.allowed_profiles is not None else None
            )
            row.shared_gpus = quota.shared_gpus
            row.updated = utcnow()
            row.updated_by = by[:255]
            row.course = course
            session.flush()
            return self._stored(row)

    def delete(self, kind: str, name: str) -> bool:
        with self._sessions.begin() as session:
            result = session.execute(delete(QuotaRow).where(QuotaRow.kind == kind, QuotaRow.name == name))
            return bool(result.rowcount)

    def effective(self, user: str, groups: Iterable[str], default: Quota) -> EffectiveQuota:
        """The quota in force for ``user`` in ``groups``: one read of the rows that may apply, the user's
        own and those of the user's groups, never every group's (a hub may have a group per course).
        Every spawn form and every spawn asks: a statement built once, plain rows, no ORM session."""
        groups = list(groups)
        own: Quota | None = None
        group_rows: dict[str, Quota] = {}
        own_course: str | None = None
        with self.store.read_engine.connect() as conn:
            rows = list(conn.execute(_QUOTAS_OF_USER, {"user": user, "groups": sorted(set(groups))}))
        # Each row comes with the course it belongs to, if any (its group's, or the course whose staff set it).
        asleep: set[str] = set()
        running: dict[str, str] = {}
        today = self.today() if self.today is not None else None
        for row in rows:
            if row.course_name is None or today is None:
                continue
            if dates_phase(row.course_starts, row.course_ends, today) == RUNNING:
                running[row.course_name] = row.course_title
            else:
                asleep.add(row.course_name)
        for row in rows:
            if row.kind == "user" and row.course not in asleep:
                own, own_course = _row_to_quota(row), row.course
            elif row.kind == "group" and row.name not in asleep:
                group_rows[row.name] = _row_to_quota(row)
        found = effective_quota(own, {g: group_rows[g] for g in groups if g in group_rows}, default)
        return _with_course(found, own_course, running)

    def effective_many(self, users: Mapping[str, Iterable[str]], default: Quota) -> dict[str, EffectiveQuota]:
        """The effective quota of many users (name -> their groups) from ONE query.

        The admin page, ``api/usage`` and the metrics show every user: one
        read of ``gpu_quotas`` for all of them, not two per user.
        """
        own: dict[str, Quota] = {}
        own_course: dict[str, str | None] = {}
        group_rows: dict[str, Quota] = {}
        stored_all = self.all()
        with self.store.read_engine.connect() as conn:
            asleep, running = self._courses(conn, [s.name if s.kind == "group" else s.course for s in stored_all])
        for stored in stored_all:
            if (stored.name if stored.kind == "group" else stored.course) in asleep:
                continue
            (own if stored.kind == "user" else group_rows)[stored.name] = stored.quota
            if stored.kind == "user":
                own_course[stored.name] = stored.course
        return {
            name: _with_course(
                effective_quota(own.get(name), {g: group_rows[g] for g in groups if g in group_rows}, default),
                own_course.get(name),
                running,
            )
            for name, groups in users.items()
        }

    # -- session limits ---------------------------------------------------------

    def record_session_limit(self, user: str, server: str, hours: float | None) -> None:
        """Remember the session length in force for this start (None: no limit)."""
        with self._sessions.begin() as session:
            session.execute(
                delete(SessionLimitRow).where(SessionLimitRow.user == user, SessionLimitRow.server == server)
            )
            if hours is not None:
                session.add(SessionLimitRow(user=user, server=server, max_session_hours=hours, recorded=utcnow()))

    def session_limits(self) -> dict[tuple[str, str], float]:
        with self._reads() as session:
            return {(r.user, r.server): r.max_session_hours for r in session.scalars(select(SessionLimitRow))}

    @staticmethod
    def _stored(row: QuotaRow) -> StoredQuota:
        return StoredQuota(
            row.kind, row.name, _row_to_quota(row), _aware(row.updated), row.updated_by or "", row.course
        )

    def _courses(self, conn: Connection, names: Collection[str | None]) -> tuple[frozenset[str], dict[str, str]]:
        """Of ``names``, the courses that do not run today (not started, or ended: their quotas sleep), and the
        titles of those that run."""
        wanted = sorted({n for n in names if n})
        if self.today is None or not wanted:
            return frozenset(), {}
        today = self.today()
        asleep: set[str] = set()
        running: dict[str, str] = {}
        for r in conn.execute(_COURSE_DATES, {"names": wanted}):
            if dates_phase(r.starts, r.ends, today) == RUNNING:
                running[r.name] = r.title
            else:
                asleep.add(r.name)
        return frozenset(asleep), running


# The dates and titles of some courses (``QuotaBook._courses``).
_COURSE_DATES = select(CourseRow.name, CourseRow.title, CourseRow.starts, CourseRow.ends).where(
    CourseRow.name.in_(bindparam("names", expanding=True))
)


def _with_course(found: EffectiveQuota, own_course: str | None, running: Mapping[str, str]) -> EffectiveQuota:
    """``found`` with the running course it comes from: its group's quota, or one its staff set for the user."""
    course = own_course if found.source == "user" else found.group if found.source == "group" else None
    if course is None or course not in running:
        return found
    return replace(found, course=course, course_title=running[course])


# The quota rows that may apply to one user (``QuotaBook.effective``): their own and their groups', each with
# the course it belongs to (a group's course of the same name; a user quota's course, the one whose staff set it).
_QUOTAS_OF_USER = (
    select(
        QuotaRow,
        CourseRow.name.label("course_name"),
        CourseRow.title.label("course_title"),
        CourseRow.starts.label("course_starts"),
        CourseRow.ends.label("course_ends"),
    )
    .outerjoin(CourseRow, CourseRow.name == case((QuotaRow.kind == "group", QuotaRow.name), else_=QuotaRow.course))
    .where(
        or_(
            and_(QuotaRow.kind == "user", QuotaRow.name == bindparam("user")),
            and_(QuotaRow.kind == "group", QuotaRow.name.in_(bindparam("groups", expanding=True))),
        )
    )
)
