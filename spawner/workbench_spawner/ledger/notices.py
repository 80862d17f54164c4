"""Notices: what the hub side tells a user about their server before and after it acts.

A notice says "your server will be stopped at T because ..." (state
``pending``), and, once the server was stopped, why (state ``done``). The
user's JupyterLab shows pending notices as a notification and a status-bar
countdown. The service **pushes** them: its loop
(``workbench_hub/service/notice_delivery.py``) puts each running server's
pending notices on that server's GPU monitor (``PUT api/gpu/notices``,
through the proxy with the service's own token), and the JupyterLab
extension reads them from its own server (``GET api/gpu/notices``); user
servers never call the service. The spawn page shows the last ``done``
notice so the user learns why the server stopped. A notice that no longer applies (the GPU got busy again)
is ``cleared`` and disappears.

How to post a notice from the workbench service (or any code that holds the
allocation store)::

    from workbench_spawner.ledger.notices import NoticeBook

    notices = NoticeBook(store)                    # store: AllocationStore
    # warn: shown in JupyterLab with a countdown to stop_at
    await asyncio.to_thread(notices.warn, user, server, kind="preempt",
                            message="Your server will be stopped at 10:00 because the GPUs "
                                    "are reserved for ml-course from then.",
                            hint="Save your work; start again on a free GPU after 12:00.",
                            stop_at=start_of_window)
    # withdraw it if the reason went away
    await asyncio.to_thread(notices.clear, user, server, kind="preempt")
    # after stopping the server: the spawn page says why
    await asyncio.to_thread(notices.done, user, server, kind="preempt",
                            message="Your server was stopped at 10:00: the GPUs were reserved for ml-course.")

There is at most one live notice per (user, server, kind): ``warn`` again
updates it (a later stop time, a new sentence), so a loop may call it on
every pass. ``kind`` is a short word naming the rule ("idle", "preempt").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from html import escape
from typing import Any

from sqlalchemy import DateTime, Integer, Row, String, Text, bindparam, delete, select
from sqlalchemy.orm import Mapped, mapped_column

from workbench_spawner.ledger.store import AllocationStore, Base, _aware, utcnow

PENDING, DONE, CLEARED = "pending", "done", "cleared"
KIND_PATTERN_MAX = 32


class NoticeRow(Base):
    __tablename__ = "workbench_notices"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user: Mapped[str] = mapped_column(String(255), index=True)
    server: Mapped[str] = mapped_column(String(255), default="")
    kind: Mapped[str] = mapped_column(String(32))
    state: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text)
    hint: Mapped[str] = mapped_column(Text, default="")
    reason: Mapped[str] = mapped_column(String(64), default="")  # for the usage ledger
    stop_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated: Mapped[datetime] = mapped_column(DateTime(timezone=True))


@dataclass(frozen=True)
class Notice:
    id: int
    user: str
    server: str
    kind: str
    state: str
    message: str
    hint: str
    reason: str
    stop_at: datetime | None
    created: datetime
    updated: datetime

    def to_json(self, now: datetime | None = None) -> dict[str, Any]:
        now = now or utcnow()
        left = None if self.stop_at is None else max(0.0, (self.stop_at - now).total_seconds())
        return {
            "id": self.id,
            "user": self.user,
            "server": self.server,
            "kind": self.kind,
            "state": self.state,
            "message": self.message,
            "hint": self.hint,
            "reason": self.reason,
            "stop_at": self.stop_at.isoformat() if self.stop_at else None,
            "seconds_left": left,
            "created": self.created.isoformat(),
            "updated": self.updated.isoformat(),
        }


def _notice(row: NoticeRow | Row[Any]) -> Notice:
    """An ORM row or a plain one read by the same columns (``last_done``'s statement)."""
    return Notice(
        row.id,
        row.user,
        row.server or "",
        row.kind,
        row.state,
        row.message,
        row.hint or "",
        row.reason or "",
        _aware(row.stop_at) if row.stop_at else None,
        _aware(row.created),
        _aware(row.updated),
    )


# The newest "done" notice of a user (``NoticeBook.last_done``), and of one of their servers.
_LAST_DONE = (
    select(NoticeRow)
    .where(NoticeRow.state == DONE, NoticeRow.user == bindparam("user"))
    .order_by(NoticeRow.id.desc())
    .limit(1)
)
_LAST_DONE_OF = _LAST_DONE.where(NoticeRow.server == bindparam("server"))


class NoticeBook:
    """Notices in the allocation store's database; every call one transaction (call via asyncio.to_thread)."""

    def __init__(self, store: AllocationStore, clock: Callable[[], datetime] = utcnow) -> None:
        self._writes = store.writes()
        self._reads = store.reads()
        self._read_engine = store.read_engine
        self._clock = clock

    def warn(
        self, user: str, server: str, *, kind: str, message: str, hint: str = "", stop_at: datetime | None = None
    ) -> Notice:
        """Post (or update) the pending notice of this kind for this server."""
        if not kind or len(kind) > KIND_PATTERN_MAX:
            raise ValueError(f"kind must be 1 to {KIND_PATTERN_MAX} characters")
        now = self._clock()
        with self._writes.begin() as session:
            row = session.scalar(
                select(NoticeRow).where(
                    NoticeRow.user == user,
                    NoticeRow.server == server,
                    NoticeRow.kind == kind,
                    NoticeRow.state == PENDING,
                )
            )
            if row is None:
                row = NoticeRow(user=user, server=server, kind=kind, state=PENDING, created=now, reason="")
                session.add(row)
            row.message, row.hint, row.stop_at, row.updated = message, hint, stop_at, now
            session.flush()
            return _notice(row)

    def clear(self, user: str, server: str, *, kind: str) -> bool:
        """Withdraw the pending notice (the reason went away); True if there was one."""
        now = self._clock()
        with self._writes.begin() as session:
            rows = list(
                session.scalars(
                    select(NoticeRow).where(
                        NoticeRow.user == user,
                        NoticeRow.server == server,
                        NoticeRow.kind == kind,
                        NoticeRow.state == PENDING,
                    )
                )
            )
            for row in rows:
                row.state, row.updated = CLEARED, now
            return bool(rows)

    def done(self, user: str, server: str, *, kind: str, message: str, hint: str = "", reason: str = "") -> Notice:
        """Record why the server is being stopped, BEFORE asking the hub to stop it.

        The spawn page and the hub's home page show ``message``; the spawner's stop writes ``reason``
        ("reclaimed: GPU idle 30 min") into the usage ledger (``announced``).
        """
        now = self._clock()
        with self._writes.begin() as session:
            for row in session.scalars(
                select(NoticeRow).where(
                    NoticeRow.user == user, NoticeRow.server == server, NoticeRow.state.in_((PENDING, DONE))
                )
            ):
                # One story per server: the older warning and any older "done" give way.
                row.state, row.updated = CLEARED, now
            row = NoticeRow(
                user=user,
                server=server,
                kind=kind,
                state=DONE,
                message=message,
                hint=hint,
                reason=reason[:64],
                stop_at=None,
                created=now,
                updated=now,
            )
            session.add(row)
            session.flush()
            return _notice(row)

    def acknowledge(self, user: str, server: str | None = None) -> int:
        """Forget the ``done`` notices of a user (server None: all); called when a server starts again."""
        now = self._clock()
        with self._writes.begin() as session:
            query = select(NoticeRow).where(NoticeRow.user == user, NoticeRow.state == DONE)
            if server is not None:
                query = query.where(NoticeRow.server == server)
            rows = list(session.scalars(query))
            for row in rows:
                row.state, row.updated = CLEARED, now
            return len(rows)

    def announced(self, user: str, server: str, since: datetime) -> Notice | None:
        """The ``done`` notice that explains a stop of this server, posted after ``since`` (its lease's or its
        start's time), if any: the workbench service's announcement ("reclaimed: ..."), or the end a first
        release already told. Its ``reason`` goes into the usage ledger."""
        with self._reads() as session:
            row = session.scalar(
                select(NoticeRow)
                .where(
                    NoticeRow.user == user, NoticeRow.server == server, NoticeRow.state == DONE, NoticeRow.reason != ""
                )
                .order_by(NoticeRow.id.desc())
                .limit(1)
            )
            if row is None or _aware(row.created) < since:
                return None
            return _notice(row)

    def pending(self, user: str | None = None, server: str | None = None) -> list[Notice]:
        return self._select(PENDING, user, server)

    def last_done(self, user: str, server: str | None = None) -> Notice | None:
        """The newest ``done`` notice of ``user`` (of ``server``, if given): one row read, not all of them.
        Every spawn form asks: a statement built once, a plain row, no ORM session."""
        query, params = (
            (_LAST_DONE, {"user": user}) if server is None else (_LAST_DONE_OF, {"user": user, "server": server})
        )
        with self._read_engine.connect() as conn:
            row = conn.execute(query, params).first()
        return _notice(row) if row is not None else None

    def prune(self, older_than: datetime) -> int:
        """Delete cleared notices last touched before ``older_than`` (the table stays small)."""
        with self._writes.begin() as session:
            result = session.execute(
                delete(NoticeRow).where(NoticeRow.state == CLEARED, NoticeRow.updated < older_than)
            )
            return int(result.rowcount or 0)

    def _select(self, state: str, user: str | None, server: str | None) -> list[Notice]:
        with self._reads() as session:
            query = select(NoticeRow).where(NoticeRow.state == state).order_by(NoticeRow.id)
            if user is not None:
                query = query.where(NoticeRow.user == user)
            if server is not None:
                query = query.where(NoticeRow.server == server)
            return [_notice(r) for r in session.scalars(query)]


def render_stop_notice(notice: Notice | None) -> str:
    """The spawn page's box that says why the last server stopped ('' when nothing to say)."""
    if notice is None:
        return ""
    # A hint may hold the last lines of the server's log: kept as lines.
    hint = (
        f'<p class="workbench-stop-hint" style="white-space: pre-wrap">{escape(notice.hint)}</p>' if notice.hint else ""
    )
    return (
        f'<div class="alert alert-warning workbench-stopped" role="status" data-kind="{escape(notice.kind)}">'
        f"<p><strong>{escape(notice.message)}</strong></p>{hint}</div>"
    )
