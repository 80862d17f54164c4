"""A course's staff book GPUs for their course and exempt it from idle reclaim for a session.

* ``api/courses/{course}/reservations``: the course's reservations (those
  for its hub group); its staff book one (``POST``: GPUs, window, model,
  grace; the group is the course) within the course's allowance
  (``reservation_gpus``, set by a hub admin; 0 means only an admin books
  for it), never one that preempts others' servers, and only where it fits
  beside every other reservation (the same check as an admin's);
* ``api/courses/{course}/reservations/{id}``: cancel one of the course's;
* ``api/courses/{course}/idle-exemption``: exempt the course's students
  from idle reclaim for a session of at most ``MAX_EXEMPT_HOURS`` hours (a
  lab where GPUs sit idle while the instructor talks); it ends by itself.
  An admin's exemption of the course (no end) is theirs: staff neither
  shorten nor end it.

Who may: as every course write (``course_handlers.CourseAccess``): a hub
admin, or the course's staff while it has not ended; readers of every
course read the list. Refusals are 403s with a sentence.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

from workbench_hub.service.course_handlers import CourseAPIHandler
from workbench_hub.service.reservation_handlers import hub_time, reservation_json
from workbench_spawner.ledger.idle_book import IdleBook
from workbench_spawner.ledger.reservation_book import ReservationBook, reservation_from_body
from workbench_spawner.ledger.store import utcnow
from workbench_spawner.rules.course import reservation_refusal
from workbench_spawner.rules.window import ReservationError

MAX_EXEMPT_HOURS = 12.0  # a session: the longest exemption a course's staff may give
MIN_EXEMPT_HOURS = 0.25  # and the shortest (less ends before idle reclaim's next check would notice it)


class CourseReservationsHandler(CourseAPIHandler):
    async def get(self, course: str):
        found = await self.require_course_read(course)
        clock, tz, name = hub_time(self.fleet)
        stored = await asyncio.to_thread(ReservationBook(self.fleet.store).all)
        mine = [reservation_json(s, clock, tz) for s in stored if s.reservation.group == found.name]
        self.send({"course": found.name, "time_zone": name, "reservations": mine})

    async def post(self, course: str):
        found = await self.require_course_staff(course, "book GPUs for the course")
        body = self.valid_body("CourseReservationBody", "invalid reservation")
        try:
            reservation = reservation_from_body({**body, "group": found.name}, self.fleet.models())
        except ReservationError as exc:
            self.fail(400, f"invalid reservation: {exc}")
        refusal = None if self.is_admin() else reservation_refusal(found, reservation.gpus, reservation.preempt)
        if refusal:
            self.fail(403, refusal)
        clock, tz, _ = hub_time(self.fleet)
        counts = self.fleet.inventory.count_by_model()
        book = ReservationBook(self.fleet.store)
        try:
            stored = await asyncio.to_thread(book.create, reservation, counts, clock(), tz, self.caller_name())
        except ReservationError as exc:
            self.fail(400, f"invalid reservation: {exc}")
        self.send(reservation_json(stored, clock, tz), 201)


class CourseReservationHandler(CourseAPIHandler):
    async def delete(self, course: str, rid: str):
        found = await self.require_course_staff(course, "cancel the course's reservations")
        book = ReservationBook(self.fleet.store)
        ok = rid.isascii() and rid.isdigit() and len(rid) < 12
        stored = await asyncio.to_thread(book.get, int(rid)) if ok else None
        if stored is None or stored.reservation.group != found.name:
            self.fail(404, f"the course {found.name} has no reservation {rid[:40]}; GET its reservations lists them")
        await asyncio.to_thread(book.delete, stored.reservation.id)
        self.set_status(204)
        self.finish()


class CourseIdleExemptionHandler(CourseAPIHandler):
    async def put(self, course: str):
        found = await self.require_course_staff(course, "exempt the course from idle reclaim")
        body = self.valid_body("CourseExemptionBody", "invalid exemption")
        book = IdleBook(self.fleet.store)
        now = utcnow()
        current = (await asyncio.to_thread(book.exempt_groups, now)).get(found.name)
        if current and current["until"] is None and not self.is_admin():
            self.fail(409, f"a hub admin exempted {found.name} from idle reclaim without an end; ask them to change it")
        hours = float(body["hours"])
        until = now + timedelta(hours=hours)
        reason = body.get("reason") or f"a session of {found.name}"
        made = await asyncio.to_thread(book.exempt, found.name, reason, self.caller_name(), now, until)
        self.send(made)

    async def delete(self, course: str):
        found = await self.require_course_staff(course, "end the course's idle exemption")
        book = IdleBook(self.fleet.store)
        current = (await asyncio.to_thread(book.exempt_groups)).get(found.name)
        if current is None:
            self.fail(404, f"{json.dumps(found.name)} is not exempt from idle reclaim now")
        if current["until"] is None and not self.is_admin():
            self.fail(409, f"a hub admin exempted {found.name} from idle reclaim without an end; ask them to end it")
        await asyncio.to_thread(book.unexempt, found.name)
        self.set_status(204)
        self.finish()
