"""Courses as stored: the ``workbench_courses`` table (migration 0010) and the :class:`CourseBook` over it.

What a course is and the rules its staff act under are
``workbench_spawner.rules.course``; here they meet the GPU database, so the
hub and the workbench service read the same courses. Every call is one
transaction (blocking: call it from a worker thread).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import date, datetime

from sqlalchemy import Date, DateTime, Integer, String, Text, delete, select
from sqlalchemy.orm import Mapped, mapped_column

from workbench_spawner.ledger.store import AllocationStore, Base, utcnow
from workbench_spawner.rules.course import MAX_TITLE, Course, is_staff
from workbench_spawner.rules.quota import Quota


class CourseRow(Base):
    __tablename__ = "workbench_courses"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)  # the hub group of its students
    title: Mapped[str] = mapped_column(String(MAX_TITLE))
    starts: Mapped[date | None] = mapped_column(Date, nullable=True)
    ends: Mapped[date | None] = mapped_column(Date, nullable=True)
    ceiling: Mapped[str] = mapped_column(Text)  # JSON: max_gpus, gpu_hours_per_week, allowed_models
    staff_group: Mapped[str | None] = mapped_column(String(255), nullable=True)
    staff: Mapped[str] = mapped_column(Text, default="[]")  # JSON list of user names
    reservation_gpus: Mapped[int] = mapped_column(Integer, default=0)
    updated: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_by: Mapped[str] = mapped_column(String(255), default="")


def _course(row: CourseRow) -> Course:
    return Course(
        name=row.name,
        title=row.title,
        ceiling=Quota.from_json(json.loads(row.ceiling)),
        starts=row.starts,
        ends=row.ends,
        staff_group=row.staff_group,
        staff=tuple(json.loads(row.staff or "[]")),
        reservation_gpus=row.reservation_gpus or 0,
    )


class CourseBook:
    """The hub's courses; every call one transaction."""

    def __init__(self, store: AllocationStore):
        self._sessions = store.writes()
        self._reads = store.reads()

    def get(self, name: str) -> Course | None:
        with self._reads() as session:
            row = session.get(CourseRow, name)
            return _course(row) if row else None

    def all(self) -> list[Course]:
        with self._reads() as session:
            return [_course(r) for r in session.scalars(select(CourseRow).order_by(CourseRow.name))]

    def staffed_by(self, user: str, groups: Iterable[str]) -> list[Course]:
        """The courses ``user`` (in ``groups``) is an instructor or TA of."""
        groups = list(groups)
        return [c for c in self.all() if is_staff(c, user, groups)]

    def set(self, course: Course, by: str = "") -> Course:
        """Create or replace ``course`` (its name is the key)."""
        with self._sessions.begin() as session:
            row = session.get(CourseRow, course.name)
            if row is None:
                row = CourseRow(name=course.name)
                session.add(row)
            row.title = course.title
            row.starts = course.starts
            row.ends = course.ends
            row.ceiling = json.dumps(course.ceiling.to_json())
            row.staff_group = course.staff_group
            row.staff = json.dumps(list(course.staff))
            row.reservation_gpus = course.reservation_gpus
            row.updated = utcnow()
            row.updated_by = by[:255]
        return course

    def delete(self, name: str) -> bool:
        with self._sessions.begin() as session:
            return bool(session.execute(delete(CourseRow).where(CourseRow.name == name)).rowcount)
