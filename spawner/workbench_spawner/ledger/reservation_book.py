"""Reservations as stored: the ``gpu_reservations`` table, reading a request, creating one safely.

The hub's placement, the workbench service's enforcer (preemption) and its
REST API all read this one table, so what an admin reserved is what is
enforced. A new reservation is checked (``reservations.check_feasible``)
inside the write transaction that stores it, against every reservation that
transaction sees: two admins cannot together over-book the inventory.
Anything refused raises ``ReservationError`` with a sentence, and nothing
is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, tzinfo
from typing import Any

from sqlalchemy import Boolean, CursorResult, DateTime, Float, Integer, String, delete, select
from sqlalchemy.orm import Mapped, mapped_column

from workbench_spawner.ledger.course_book import CourseRow
from workbench_spawner.ledger.store import AllocationStore, Base, _aware, utcnow
from workbench_spawner.rules.course import RUNNING, dates_phase
from workbench_spawner.rules.reservations import (
    DEFAULT_GRACE_MINUTES,
    DEFAULT_WARN_MINUTES,
    Reservation,
    check_feasible,
)
from workbench_spawner.rules.window import ReservationError, parse_window

# What a request body may hold (the service's ReservationBody schema says the same; a test compares them).
MAX_GROUP = 255
FIELDS = ("group", "gpus", "model", "window", "grace_minutes", "preempt", "warn_minutes")


class ReservationRow(Base):
    __tablename__ = "gpu_reservations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    group: Mapped[str] = mapped_column(String(255), index=True)
    gpus: Mapped[int] = mapped_column(Integer)
    model: Mapped[str | None] = mapped_column(String(64), nullable=True)
    window: Mapped[str] = mapped_column(String(64))
    grace_minutes: Mapped[float] = mapped_column(Float)
    preempt: Mapped[bool] = mapped_column(Boolean, default=False)
    warn_minutes: Mapped[float] = mapped_column(Float)
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    created_by: Mapped[str] = mapped_column(String(255), default="")


@dataclass(frozen=True)
class StoredReservation:
    reservation: Reservation
    created: datetime
    created_by: str

    def to_json(self) -> dict[str, Any]:
        r = self.reservation
        return {
            "id": r.id,
            "group": r.group,
            "gpus": r.gpus,
            "model": r.model,
            "window": r.window.text(),
            "weekly": r.window.weekly,
            "grace_minutes": r.grace_minutes,
            "preempt": r.preempt,
            "warn_minutes": r.warn_minutes,
            "created": self.created.isoformat(),
            "created_by": self.created_by,
        }


def reservation_from_body(body: Mapping[str, Any], models: list[str]) -> Reservation:
    """The reservation a request body asks for; raise ReservationError (a sentence) for what its
    schema cannot say.

    ``body`` has passed the service's ``ReservationBody`` schema (``openapi.validate_body``: fields,
    types, bounds, lengths). Here: the window must parse (``window.parse_window``), the model
    must be one of the inventory's ``models`` (any case; written as the inventory writes it), and
    missing or null minutes take their defaults. Whether it fits is ``ReservationBook.create``'s.
    """
    model = body.get("model")
    if model is not None:
        known = {m.lower(): m for m in models}
        if model.lower() not in known:
            raise ReservationError(f"this hub has no {model} GPUs; its models are {', '.join(models) or 'none'}")
        model = known[model.lower()]

    def minutes(key: str, default: float) -> float:
        value = body.get(key)
        return default if value is None else float(value)

    return Reservation(
        group=body["group"],
        gpus=int(body["gpus"]),
        window=parse_window(body["window"]),
        model=model,
        grace_minutes=minutes("grace_minutes", DEFAULT_GRACE_MINUTES),
        preempt=bool(body.get("preempt", False)),
        warn_minutes=minutes("warn_minutes", DEFAULT_WARN_MINUTES),
    )


def _from_row(row: ReservationRow) -> StoredReservation:
    res = Reservation(
        group=row.group,
        gpus=row.gpus,
        window=parse_window(row.window),
        model=row.model,
        grace_minutes=row.grace_minutes,
        preempt=bool(row.preempt),
        warn_minutes=row.warn_minutes,
        id=row.id,
    )
    return StoredReservation(res, _aware(row.created), row.created_by or "")


class ReservationBook:
    """Create, list and delete reservations; each call one transaction (blocking: use a worker thread)."""

    def __init__(self, store: AllocationStore):
        self.store = store

    def all(self) -> list[StoredReservation]:
        with self.store.reads()() as session:
            return [_from_row(r) for r in session.scalars(select(ReservationRow).order_by(ReservationRow.id))]

    def reservations(self) -> list[Reservation]:
        return [s.reservation for s in self.all()]

    def in_force(self, now: datetime, tz: tzinfo) -> list[Reservation]:
        """The reservations that count on ``now``'s day (in the hub's zone ``tz``): all but those of a course
        (a reservation for the course's hub group) before its start date or after its end date."""
        today = now.astimezone(tz).date()
        query = (
            select(ReservationRow, CourseRow.name, CourseRow.starts, CourseRow.ends)
            .outerjoin(CourseRow, CourseRow.name == ReservationRow.group)
            .order_by(ReservationRow.id)
        )
        with self.store.reads()() as session:  # one read: each reservation with its course's dates, if any
            rows = session.execute(query).all()
        return [
            _from_row(row).reservation
            for row, course, starts, ends in rows
            if course is None or dates_phase(starts, ends, today) == RUNNING
        ]

    def open_at(self, now: datetime, tz: tzinfo) -> list[Reservation]:
        """The reservations in force whose window is open at ``now`` (in the hub's zone ``tz``)."""
        return [r for r in self.in_force(now, tz) if r.window.current(now, tz) is not None]

    def get(self, rid: int) -> StoredReservation | None:
        with self.store.reads()() as session:
            row = session.get(ReservationRow, rid)
            return _from_row(row) if row is not None else None

    def create(
        self, res: Reservation, inventory: Mapping[str, int], now: datetime, tz: tzinfo, by: str = ""
    ) -> StoredReservation:
        """Store ``res`` if it fits beside every other; else ReservationError and nothing stored."""
        with self.store.writes().begin() as session:
            existing = [_from_row(r).reservation for r in session.scalars(select(ReservationRow))]
            check_feasible(res, existing, inventory, now, tz)
            row = ReservationRow(
                group=res.group,
                gpus=res.gpus,
                model=res.model,
                window=res.window.text(),
                grace_minutes=res.grace_minutes,
                preempt=res.preempt,
                warn_minutes=res.warn_minutes,
                created=utcnow(),
                created_by=by[:255],
            )
            session.add(row)
            session.flush()
            return _from_row(row)

    def delete(self, rid: int) -> bool:
        with self.store.writes().begin() as session:
            result: CursorResult[Any] = session.execute(delete(ReservationRow).where(ReservationRow.id == rid))
            return result.rowcount > 0
