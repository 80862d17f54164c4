"""One-time sign-up links: the ``workbench_invites`` table (migration 0010) and the :class:`InviteBook` over it.

A course's roster (``workbench course import``) makes hub users for a hub
whose accounts are NativeAuthenticator's sign-ups. Such a user still needs a
password of their own; an admin's authorization of 300 sign-ups one by one is
what rosters are for avoiding, and authorizing a name in advance would give
the account to whoever signs up with it first. So each new student gets a
link, ``/hub/signup?invite=TOKEN``, printed for the instructor to hand out (no
e-mail leaves the host): the hub's sign-up page authorizes a sign-up at once
when its name is the invite's, the invite is unused and not expired
(``workbench_hub.auth``). The link works once: after it, the name has an
account. Only a hash of the token is stored.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

from sqlalchemy import DateTime, String, select
from sqlalchemy.orm import Mapped, mapped_column

from workbench_spawner.ledger.store import AllocationStore, Base, _aware, utcnow

VALID_DAYS = 30  # how long a sign-up link works


class InviteRow(Base):
    __tablename__ = "workbench_invites"

    username: Mapped[str] = mapped_column(String(255), primary_key=True)
    course: Mapped[str] = mapped_column(String(255))
    token_hash: Mapped[str] = mapped_column(String(64))
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    used: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    created_by: Mapped[str] = mapped_column(String(255), default="")


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class InviteBook:
    """Sign-up links; every call one transaction (blocking: call it from a worker thread)."""

    def __init__(self, store: AllocationStore):
        self._sessions = store.writes()
        self._reads = store.reads()

    def issue(self, usernames: list[str], course: str, by: str = "") -> dict[str, str]:
        """A new token for each of ``usernames`` that has no invite yet, in one transaction: name -> token.
        A name invited before keeps its link (a roster imported twice changes nothing)."""
        now = utcnow()
        made: dict[str, str] = {}
        with self._sessions.begin() as session:
            known = set(session.scalars(select(InviteRow.username).where(InviteRow.username.in_(usernames))))
            for name in usernames:
                if name in known or name in made:
                    continue
                token = secrets.token_urlsafe(24)
                session.add(
                    InviteRow(
                        username=name,
                        course=course,
                        token_hash=_hash(token),
                        created=now,
                        expires=now + timedelta(days=VALID_DAYS),
                        created_by=by[:255],
                    )
                )
                made[name] = token
        return made

    def pending(self, usernames: list[str]) -> dict[str, datetime]:
        """Of ``usernames``, those with an unused invite: name -> when it expires."""
        with self._reads() as session:
            rows = session.scalars(select(InviteRow).where(InviteRow.username.in_(usernames), InviteRow.used.is_(None)))
            return {r.username: _aware(r.expires) for r in rows}

    def use(self, username: str, token: str) -> bool:
        """Whether ``token`` is ``username``'s unused, unexpired invite; if so it is used up now."""
        if not username or not token:
            return False
        with self._sessions.begin() as session:
            row = session.get(InviteRow, username)
            if row is None or row.used is not None or _aware(row.expires) < utcnow():
                return False
            if not secrets.compare_digest(row.token_hash, _hash(token)):
                return False
            row.used = utcnow()
            return True

    def valid(self, username: str, token: str) -> bool:
        """``use`` without using it up (the sign-up page's check before the account is made)."""
        if not username or not token:
            return False
        with self._reads() as session:
            row = session.get(InviteRow, username)
            return (
                row is not None
                and row.used is None
                and _aware(row.expires) >= utcnow()
                and secrets.compare_digest(row.token_hash, _hash(token))
            )
