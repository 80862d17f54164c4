"""Courses on the workbench service: a hub admin sets them up, their instructors and TAs run them without being admins.

Routes (under ``/services/workbench/``, each in ``openapi.yaml``):

* ``api/courses``: every course (``custom:workbench:read``), or, for any
  other hub user, the courses they are staff of;
* ``api/courses/{course}``: one course; set (``PUT``) or deleted only by an
  admin (``custom:workbench:admin``): its title, dates, ceiling and staff.
  Deleting a course leaves its hub group, its members' quotas and their
  servers alone;
* ``api/courses/{course}/students``: the course's students (the hub group's
  members less its staff), each with their quota in force and where it comes
  from, the GPUs they hold, their servers, GPU-hours of the last 7 days by
  reason and by server, and how their servers ended in that week;
* ``api/courses/{course}/students/{user}/quota``: a student's own quota, set
  by the course's staff within the course's ceiling, or deleted (the
  student falls back to their groups' quotas or the hub's default);
* ``api/courses/{course}/students/{user}/stop``: stop one of the student's
  servers, open notebooks saved first, the student told "stopped by an
  instructor (NAME) of COURSE" and the usage ledger's reason saying the same.

Who may: an admin (``custom:workbench:admin``) everything; anyone who reads
everyone's data (``custom:workbench:read``) the reads; a course's staff
(``rules.course.is_staff``: named in the course or in its staff group, as
the hub says at the request) the reads and writes of that course only, and
only while it has not ended. Every refusal is a 403 whose sentence says why:
another course, a user who is not the course's student, above the ceiling,
an ended course.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
from collections.abc import Callable, Coroutine
from datetime import date
from typing import Any, NoReturn

from workbench_hub.service import scopes
from workbench_hub.service.handlers import APIHandler, _check_name, unknown_user
from workbench_hub.service.scopes import ADMIN_SCOPE, READ_SCOPE
from workbench_hub.service.usage_handlers import usage_report
from workbench_spawner.ledger import reasons
from workbench_spawner.ledger.course_book import CourseBook
from workbench_spawner.ledger.gpu_hours import WEEK
from workbench_spawner.ledger.store import utcnow
from workbench_spawner.rules.course import (
    Course,
    CourseError,
    course_from_body,
    is_staff,
    over_ceiling,
    phase,
    staff_quota_from_body,
    staff_refusal,
)

STOP_KIND = "instructor"  # the notice kind of a stop a course's staff asked for


def instructor_cause(who: str, course: str) -> str:
    """The stop box's words after "stopped at 10:30: "."""
    return f"stopped by an instructor ({who}) of {course}"


def instructor_reason(who: str, course: str) -> str:
    """The usage ledger's reason (at most 64 characters): 'stopped by an instructor: ann (ML-101)'."""
    return f"{reasons.STOPPED_BY_INSTRUCTOR}: {who} ({course})"[:64].rstrip()


class CourseAccess:
    """What every course route and page needs: the courses, today in the hub's time zone, who the caller is to
    a course, and its students' report. A mixin of the API's handlers and the course pages, which each say a
    refusal their way (``fail``: JSON, or the refusal page)."""

    fleet: Any
    hub: Any
    fail: Callable[..., NoReturn]
    require_caller: Callable[[], dict]
    can_read: Callable[[], bool]
    is_admin: Callable[[], bool]
    caller_name: Callable[[], str]
    wait_for_settings: Callable[[], Coroutine[Any, Any, None]]

    @property
    def courses(self) -> CourseBook:
        return CourseBook(self.fleet.store)

    def today(self) -> date:
        return self.fleet.today()

    async def caller_groups(self) -> list[str]:
        """The caller's hub groups as the hub says now (a directory login changes them at each login); asked of
        the hub once per request, however many checks need them."""
        cached = getattr(self, "_caller_groups", None)
        if cached is not None:
            return cached
        caller = self.require_caller()
        groups: list[str] = []
        if caller.get("kind", "user") == "user":
            model = await self.hub.user(caller["name"])
            groups = list((model or {}).get("groups") or [])
        self._caller_groups = groups
        return groups

    async def course_or_404(self, name: str) -> Course:
        _check_name("course", name)
        course = await asyncio.to_thread(self.courses.get, name)
        if course is None:
            self.fail(
                404,
                f"no course named {json.dumps(name)}; a hub admin sets courses up (PUT api/courses/NAME), "
                "and GET api/courses lists yours",
            )
        return course

    async def staffs(self, course: Course) -> bool:
        """The caller is on the course's staff, with a token that holds the workbench's self scope (every
        login and default token does; a token narrowed to other scopes acts for no course)."""
        caller = self.require_caller()
        if not scopes.holds_self_scope(caller):
            return False
        return is_staff(course, caller["name"], await self.caller_groups())

    async def require_course_read(self, name: str) -> Course:
        """The course, for an admin, a reader of everyone's data, or the course's staff; else a 403."""
        self.require_caller()
        await self.wait_for_settings()
        course = await self.course_or_404(name)
        if self.can_read() or await self.staffs(course):
            return course
        self.fail(
            403,
            f"only the staff of {name} (its instructors and TAs) or a hub admin may see this course; "
            f"ask a hub admin to add you to its staff (scope {READ_SCOPE} reads every course)",
        )

    async def require_course_staff(self, name: str, what: str) -> Course:
        """The course, for an admin or the course's staff while it has not ended; else a 403 saying why."""
        self.require_caller()
        await self.wait_for_settings()
        course = await self.course_or_404(name)
        if self.is_admin():
            return course
        if not await self.staffs(course):
            self.fail(
                403,
                f"only the staff of {name} (its instructors and TAs) or a hub admin may {what}; "
                f"ask a hub admin to add you to its staff (scope {ADMIN_SCOPE})",
            )
        refusal = staff_refusal(course, self.today(), what)
        if refusal:
            self.fail(403, refusal)
        return course

    async def students_of(self, course: Course) -> list[dict]:
        """The hub user models of the course's students: its group's members, less its staff."""
        group = await self.hub.group(course.name)
        members = set((group or {}).get("users") or [])
        return [
            u
            for u in await self.hub.users()
            if u["name"] in members and not is_staff(course, u["name"], u.get("groups") or [])
        ]

    async def student_or_404(self, course: Course, user: str) -> dict:
        _check_name("user", user)
        model = await self.hub.user(user)
        if model is None:
            self.fail(404, unknown_user(user))
        if course.name not in (model.get("groups") or []) or is_staff(course, user, model.get("groups") or []):
            self.fail(
                403,
                f"{user} is not a student of {course.name} (not in its hub group, or on its staff); a course's "
                "staff act only for its students",
            )
        return model

    def view(self, course: Course) -> dict:
        return {**course.to_json(), "phase": phase(course, self.today())}

    async def students_report(self, found: Course) -> dict:
        """The course, its students (as api/usage reports users, plus their servers now) and how their servers
        ended in the last 7 days: ``GET api/courses/{course}/students`` and the course page."""
        models = await self.students_of(found)
        now = utcnow()
        students, ends = await asyncio.to_thread(
            usage_report, self.fleet, models, now, None, {m["name"] for m in models}
        )
        running = {m["name"]: m.get("servers") or {} for m in models}
        for row in students:
            row["running"] = {
                server: {"ready": bool(s.get("ready")), "pending": s.get("pending")}
                for server, s in sorted(running.get(row["name"], {}).items())
            }
        return {
            "course": self.view(found),
            "window_start": (now - WEEK).isoformat(),
            "window_end": now.isoformat(),
            "students": students,
            "ends_by_reason": ends,
        }


class CourseAPIHandler(CourseAccess, APIHandler):
    """The course routes of the REST API."""


class CourseListHandler(CourseAPIHandler):
    async def get(self):
        caller = self.require_caller()
        await self.wait_for_settings()
        if self.can_read():
            found = await asyncio.to_thread(self.courses.all)
        else:
            self.require_own("listing the courses you teach")
            groups = await self.caller_groups()
            found = await asyncio.to_thread(self.courses.staffed_by, caller["name"], groups)
        self.send({"courses": [self.view(c) for c in found]})


class CourseHandler(CourseAPIHandler):
    async def get(self, course: str):
        self.send(self.view(await self.require_course_read(course)))

    async def put(self, course: str):
        await self.require_admin("set up courses")
        _check_name("course", course)
        body = self.valid_body("CourseBody", "invalid course")
        try:
            found = course_from_body(course, body, self.fleet.models())
        except CourseError as exc:
            self.fail(400, f"invalid course: {exc}")
        await asyncio.to_thread(self.courses.set, found, self.caller_name())
        self.send(self.view(found))

    async def delete(self, course: str):
        await self.require_admin("delete courses")
        _check_name("course", course)
        await asyncio.to_thread(self.courses.delete, course)
        self.set_status(204)
        self.finish()


class CourseStudentsHandler(CourseAPIHandler):
    async def get(self, course: str):
        found = await self.require_course_read(course)
        wanted = self.get_argument("format", "json")
        if wanted not in ("json", "csv"):
            self.fail(400, f"format must be json or csv, not {json.dumps(wanted)[:40]}")
        report = await self.students_report(found)
        if wanted == "csv":
            self.set_header("Content-Type", "text/csv; charset=utf-8")
            self.set_header("Content-Disposition", f'attachment; filename="{found.name}-students.csv"')
            self.finish(students_csv(report))
            return
        self.send(report)


CSV_COLUMNS = (
    "student",
    "quota_gpus",
    "quota_from",
    "gpu_hours_week",
    "gpu_hours_by_reason",
    "held_gpus",
    "servers_running",
)


def students_csv(report: dict) -> str:
    """The course page's table as CSV, one row per student (a spreadsheet's formula characters defused)."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)

    def cell(value: object) -> str:
        text = str(value)
        return "'" + text if text[:1] in ("=", "+", "-", "@") else text

    for row in report["students"]:
        running = ";".join(name or "default" for name in row["running"])
        by_reason = ";".join(f"{kind} {hours:g}" for kind, hours in row["gpu_hours_week_by_reason"].items())
        writer.writerow(
            [
                cell(row["name"]),
                row["quota"]["max_gpus"],
                cell(row["quota"]["origin"]),
                row["gpu_hours_week"],
                cell(by_reason),
                row["held_gpus"],
                cell(running),
            ]
        )
    return out.getvalue()


class StudentQuotaHandler(CourseAPIHandler):
    async def put(self, course: str, user: str):
        found = await self.require_course_staff(course, "set a student's quota")
        body = self.valid_body("StudentQuotaBody", "invalid quota")
        try:
            quota = staff_quota_from_body(found, body, self.fleet.models())
        except CourseError as exc:
            self.fail(400, f"invalid quota: {exc}")
        refusal = over_ceiling(found, quota)
        if refusal:
            self.fail(403, refusal)
        model = await self.student_or_404(found, user)
        by = f"{self.caller_name()} for {found.name}"
        stored = await asyncio.to_thread(self.fleet.book.set, "user", user, quota, by, found.name)
        effective = await asyncio.to_thread(
            self.fleet.book.effective, user, model.get("groups") or [], self.fleet.default
        )
        self.send({"course": found.name, "user": user, "quota": stored.to_json(), "effective": effective.to_json()})

    async def delete(self, course: str, user: str):
        found = await self.require_course_staff(course, "remove a student's quota")
        await self.student_or_404(found, user)
        await asyncio.to_thread(self.fleet.book.delete, "user", user)
        self.set_status(204)
        self.finish()


class StudentStopHandler(CourseAPIHandler):
    async def post(self, course: str, user: str):
        found = await self.require_course_staff(course, "stop a student's server")
        body = self.valid_body("StudentStopBody", "invalid stop")
        model = await self.student_or_404(found, user)
        server = body.get("server", "")
        running = (model.get("servers") or {}).get(server)
        if not running:
            shown = f"server {json.dumps(server)}" if server else "default server"
            self.fail(404, f"{user} has no running {shown}; GET api/courses/{found.name}/students lists them")
        caller = self.require_caller()
        who = caller.get("name", "?") if caller.get("kind", "user") == "user" else f"service {caller.get('name')}"
        stopped = await self.settings["stopper"].stop_for(
            user,
            server,
            kind=STOP_KIND,
            cause=instructor_cause(who, found.name),
            reason=instructor_reason(who, found.name),
            path=running.get("url") if running.get("ready") else None,
        )
        self.send(
            {"user": user, "server": server, "stopped": stopped.stopped, "message": stopped.message},
            status=202 if stopped.stopped else 503,
        )
