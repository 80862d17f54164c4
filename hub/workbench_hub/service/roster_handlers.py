"""``POST api/courses/{course}/roster``: a course's roster (CSV) makes its accounts, membership and staff at once.

For hubs whose accounts are the hub's own (NativeAuthenticator sign-ups, or
this host's Unix accounts with PAM): where a directory or single sign-on
manages the hub's groups, the directory is the roster and an import is
refused with a sentence.

The file is read whole first (``rules.roster.parse_roster``): one bad line
and nothing is applied, the answer naming every bad line by number. Then,
with three calls to the hub's API whatever the class's size: the names the
hub does not know become hub users; the students join the course's hub group
(made if need be); the TAs and instructors join the course's staff. With
sign-ups, each account this roster made gets a one-time sign-up link
(``ledger.invite_book``), printed for the instructor to hand out: no e-mail
leaves the host. With PAM the students log in with their account on the
host. Importing the same roster again changes nothing and says so per row: an
account that exists, a member already, a link issued before (a link is shown
only once; it stays valid until it is used or expires).

A course's staff may import (a hub admin too) while the course has not
ended; a roster may not name a hub admin.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from datetime import datetime
from urllib.parse import quote

from sqlalchemy.exc import IntegrityError

from workbench_hub.service.course_handlers import CourseAPIHandler
from workbench_hub.service.handlers import groups_from_login
from workbench_spawner.ledger.course_book import CourseBook
from workbench_spawner.ledger.invite_book import InviteBook
from workbench_spawner.rules.roster import STAFF_ROLES, RosterError, RosterRow, parse_roster

# Characters of a roster a request may carry: JSON-escaped however it is written (at most twelve bytes a
# character: one outside the Basic Multilingual Plane is a \uXXXX\uXXXX pair), within the service's body limit
# (app.MAX_BODY); about 2,000 students at 20 characters a line.
MAX_CSV = 40_000


def signs_up() -> bool:
    """Whether the hub's accounts are NativeAuthenticator's sign-ups (the hub passes ``WORKBENCH_SIGN_UPS``)."""
    return os.environ.get("WORKBENCH_SIGN_UPS", "") == "1"


def _issue(store, names: list[str], course: str, by: str) -> dict[str, str]:
    book = InviteBook(store)
    try:
        return book.issue(names, course, by)
    except IntegrityError:  # another import of the same names at the same moment issued some: theirs stand
        return book.issue(names, course, by)


class CourseRosterHandler(CourseAPIHandler):
    async def post(self, course: str):
        found = await self.require_course_staff(course, "import a roster")
        body = self.valid_body("RosterBody", "invalid roster")
        source = groups_from_login()
        if source:
            self.fail(
                409,
                f"this hub's groups come from {source} at each login, so the directory is the course's roster: add "
                f"the students to its group {found.name} there",
            )
        try:
            rows = parse_roster(body["csv"])
        except RosterError as exc:
            self.fail(400, f"the roster was not applied: {exc}")
        users = {u["name"]: u for u in await self.hub.users()}
        admins = [f"line {r.line}: {r.username} is a hub admin" for r in rows if users.get(r.username, {}).get("admin")]
        if admins:
            self.fail(
                403, "the roster was not applied: " + "; ".join(admins) + " (a roster adds students and course staff)"
            )
        new = [r.username for r in rows if r.username not in users]
        if new:
            await self.hub.call("POST", "/users", {"usernames": new})
        students = [r for r in rows if r.role not in STAFF_ROLES]
        group = await self.hub.group(found.name)
        if group is None:
            await self.hub.call("POST", f"/groups/{quote(found.name, safe='')}", {"users": []})
            group = {"users": []}
        members = set(group.get("users") or [])
        joining = [r.username for r in students if r.username not in members]
        if joining:
            await self.hub.call("POST", f"/groups/{quote(found.name, safe='')}/users", {"users": joining})
        staff = [r.username for r in rows if r.role in STAFF_ROLES and r.username not in found.staff]
        if staff:
            updated = replace(found, staff=(*found.staff, *staff))
            await asyncio.to_thread(CourseBook(self.fleet.store).set, updated, self.caller_name())
        invites: dict[str, str] = {}
        pending: dict[str, datetime] = {}
        if signs_up():
            names = [r.username for r in rows]
            invites = await asyncio.to_thread(_issue, self.fleet.store, new, found.name, self.caller_name())
            pending = await asyncio.to_thread(InviteBook(self.fleet.store).pending, names)
        self.send(
            {
                "course": found.name,
                "created": len(new),
                "joined": len(joining),
                "staff_added": len(staff),
                "rows": [self._row(r, r.username in new, r.username in joining, invites, pending) for r in rows],
            }
        )

    def _row(
        self, row: RosterRow, created: bool, joined: bool, invites: dict[str, str], pending: dict[str, datetime]
    ) -> dict:
        name = row.username
        link = f"/hub/signup?invite={invites[name]}" if name in invites else None
        if link:
            first = f"sign up at {link} with the name {name} and a password of your own (the link works once)"
        elif name in pending:
            first = f"the sign-up link given before works until {pending[name]:%Y-%m-%d}"
        elif signs_up():
            first = "log in with your existing account"
        else:
            first = f"log in as {name} with your account on this host"
        return {
            "line": row.line,
            "user": name,
            "role": row.role,
            "account": "created" if created else "existed",
            "membership": ("staff" if row.role in STAFF_ROLES else ("joined" if joined else "member already")),
            "invite": link,
            "first_login": first,
        }
