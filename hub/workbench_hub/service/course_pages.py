"""The course pages: ``courses`` (those the caller may see) and ``courses/{course}`` (one course, run in the browser).

A course's page shows its staff and any reader of every course (the API's
rules, ``course_handlers.CourseAccess``): its dates and ceiling, its students
with their quota in force and where it comes from, GPUs held, servers, and
GPU-hours of the last 7 days as bars against the ceiling's weekly budget (or
the largest use), how their servers ended this week, and a CSV download of
the table. While the course has not ended, its staff (and admins) get the
controls: stop a student's server (after a confirmation), set or remove a
student's quota within the ceiling, import a roster, book or cancel the
course's reservations within its allowance, and exempt it from idle reclaim
for a session. The controls call the
REST API (``static/course.js``), so the page refuses exactly what the API
refuses, in the same sentences. A refusal or an unknown course is a page
that says why.
"""

from __future__ import annotations

import asyncio
from typing import NoReturn

from tornado import web

from workbench_hub.service import scopes
from workbench_hub.service.course_handlers import CourseAccess
from workbench_hub.service.page_handlers import PageHandler
from workbench_hub.service.reservation_handlers import hub_time, reservation_json
from workbench_spawner.ledger.idle_book import IdleBook
from workbench_spawner.ledger.reservation_book import ReservationBook
from workbench_spawner.rules.course import ENDED, phase


class CoursePages(CourseAccess, PageHandler):
    def require_caller(self) -> dict:
        return self.caller or {}

    def fail(self, status: int, message: str) -> NoReturn:
        self.page("refusal.html", status, name=(self.caller or {}).get("name", ""), sentence=message)
        raise web.Finish()

    def xsrf_value(self) -> str:
        token = self.xsrf_token
        return token.decode() if isinstance(token, bytes) else token


class CourseListPageHandler(CoursePages):
    @web.authenticated
    async def get(self):
        await self.wait_for_settings()
        caller = self.require_caller()
        if not self.reads_own():
            self.fail(403, scopes.own_data_refusal(self.caller, "opening the course pages"))
        if self.can_read():
            found = await asyncio.to_thread(self.courses.all)
        else:
            found = await asyncio.to_thread(self.courses.staffed_by, caller.get("name", ""), await self.caller_groups())
        self.page("courses.html", courses=[self.view(c) for c in found], xsrf=self.xsrf_value())


class CoursePageHandler(CoursePages):
    @web.authenticated
    async def get(self, course: str):
        found = await self.require_course_read(course)
        report = await self.students_report(found)
        acts = phase(found, self.today()) != ENDED and (self.is_admin() or await self.staffs(found))
        budget = found.ceiling.gpu_hours_per_week
        most = max([s["gpu_hours_week"] for s in report["students"]] + [budget or 0, 0.001])
        clock, tz, zone_name = hub_time(self.fleet)

        def sessions():
            stored = ReservationBook(self.fleet.store).all()
            mine = [reservation_json(s, clock, tz) for s in stored if s.reservation.group == found.name]
            return mine, IdleBook(self.fleet.store).exempt_groups().get(found.name)

        reservations, exemption = await asyncio.to_thread(sessions)
        self.page(
            "course.html",
            report=report,
            course=report["course"],
            acts=acts,
            scale=most,
            models=self.fleet.models(),
            reservations=reservations,
            exemption=exemption,
            time_zone=zone_name,
            xsrf=self.xsrf_value(),
        )
