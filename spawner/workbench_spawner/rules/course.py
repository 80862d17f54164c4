"""Courses: a hub group with its settings, who its staff are, and the ceiling its staff hand quotas out under.

A course is a JupyterHub group (its students; with a directory login, the
directory's group) plus what a hub admin sets for it:

* ``title`` and, optionally, ``starts`` and ``ends`` (dates in the hub's time
  zone): before its start a course is *upcoming*, after its end *ended*, in
  between *running* (``phase``). Staff may act for a course only while it has
  not ended: an ended course is read-only for them;
* ``ceiling``: the most a course's staff may give one of its students, a
  quota's three parts that matter for fairness (``max_gpus``,
  ``gpu_hours_per_week``, ``allowed_models``). Staff set a student's own quota
  within it (``over_ceiling`` says why not, in a sentence); only an admin
  changes the ceiling;
* ``staff_group`` (a hub group, such as ``ml-course-staff``, which a directory
  login keeps up to date) and ``staff`` (user names the admin lists): both
  make instructors and TAs of the course (``is_staff``). Staff are not
  counted among the course's students.

This module is rules alone (no I/O), as all of ``rules/``; the courses are
stored by ``workbench_spawner.ledger.course_book`` and served by the
workbench service (``workbench_hub.service.course_handlers``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from workbench_spawner.rules.quota import Quota, QuotaError, quota_from_body

UPCOMING, RUNNING, ENDED = "upcoming", "running", "ended"
CEILING_FIELDS = ("max_gpus", "gpu_hours_per_week", "allowed_models")
MAX_TITLE = 200  # characters of a course's title (the service's CourseBody and the column say the same)
MAX_STAFF = 200  # users a course may name as its staff (a staff group has no limit)


class CourseError(ValueError):
    """A course or a staff member's quota that cannot be stored; str(err) says why, for a person."""


@dataclass(frozen=True)
class Course:
    name: str
    title: str
    ceiling: Quota
    starts: date | None = None
    ends: date | None = None
    staff_group: str | None = None
    staff: tuple[str, ...] = field(default=())
    # The most GPUs one reservation its staff book for the course may hold (0: only an admin books for it).
    reservation_gpus: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "starts": self.starts.isoformat() if self.starts else None,
            "ends": self.ends.isoformat() if self.ends else None,
            "ceiling": {key: self.ceiling.to_json()[key] for key in CEILING_FIELDS},
            "staff_group": self.staff_group,
            "staff": list(self.staff),
            "reservation_gpus": self.reservation_gpus,
        }


def phase(course: Course, today: date) -> str:
    """``UPCOMING`` before ``starts``, ``ENDED`` after ``ends`` (the end day is still a course day), else
    ``RUNNING``."""
    return dates_phase(course.starts, course.ends, today)


def dates_phase(starts: date | None, ends: date | None, today: date) -> str:
    """``phase`` of a course known only by its dates (the quota book reads no more of it)."""
    if starts is not None and today < starts:
        return UPCOMING
    if ends is not None and today > ends:
        return ENDED
    return RUNNING


def is_staff(course: Course, user: str, groups: Iterable[str]) -> bool:
    """An instructor or TA of ``course``: named in its staff, or a member of its staff group."""
    return user in course.staff or (course.staff_group is not None and course.staff_group in set(groups))


def staff_refusal(course: Course, today: date, what: str) -> str | None:
    """Why staff may not do ``what`` ("set a student's quota") for ``course`` now, or None: they may while
    the course has not ended."""
    if phase(course, today) == ENDED and course.ends is not None:
        return (
            f"the course {course.name} ended on {course.ends.isoformat()}, so its staff may no longer {what}; "
            "a hub admin may change its end date"
        )
    return None


def reservation_refusal(course: Course, gpus: int, preempt: bool) -> str | None:
    """Why the course's staff may not book a reservation of ``gpus`` for it, or None."""
    if course.reservation_gpus <= 0:
        return (
            f"the course {course.name} has no reservation allowance, so only a hub admin books GPUs for it; ask one "
            "to set its reservation_gpus"
        )
    if gpus > course.reservation_gpus:
        return (
            f"the course {course.name} may reserve at most {course.reservation_gpus} GPU"
            f"{'' if course.reservation_gpus == 1 else 's'} at once, not {gpus}; ask a hub admin for more"
        )
    if preempt:
        return "a course's staff may not book a reservation that stops other users' servers (preempt); ask a hub admin"
    return None


def over_ceiling(course: Course, quota: Quota) -> str | None:
    """Why ``quota`` is more than ``course``'s staff may give one of its students, or None."""
    ceiling = course.ceiling
    where = f"the course {course.name} may give a student at most"
    ask = "ask a hub admin to raise the course's ceiling"
    if quota.max_gpus > ceiling.max_gpus:
        gpus = f"{ceiling.max_gpus} GPU" + ("" if ceiling.max_gpus == 1 else "s")
        return f"{where} {gpus} at once, not {quota.max_gpus}; {ask}"
    if ceiling.gpu_hours_per_week is not None:
        if quota.gpu_hours_per_week is None:
            return (
                f"{where} {ceiling.gpu_hours_per_week:g} GPU-hours a week, so a student's quota must give a "
                f"weekly budget of {ceiling.gpu_hours_per_week:g} GPU-hours or less (gpu_hours_per_week)"
            )
        if quota.gpu_hours_per_week > ceiling.gpu_hours_per_week:
            return f"{where} {ceiling.gpu_hours_per_week:g} GPU-hours a week, not {quota.gpu_hours_per_week:g}; {ask}"
    if ceiling.allowed_models is not None:
        allowed = ", ".join(ceiling.allowed_models) or "none"
        if quota.allowed_models is None:
            return (
                f"the course {course.name} may hand out only these GPU models: {allowed}; name them in allowed_models"
            )
        extra = [m for m in quota.allowed_models if m not in ceiling.allowed_models]
        if extra:
            return f"the course {course.name} may hand out only these GPU models: {allowed}, not {', '.join(extra)}"
    return None


def _day(body: Mapping[str, Any], key: str) -> date | None:
    value = body.get(key)
    if value is None:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise CourseError(f"{key} must be a date like 2027-03-12, not {json.dumps(value)}") from None


def course_from_body(name: str, body: Mapping[str, Any], known_models: Iterable[str] | None = None) -> Course:
    """The course an admin's request body asks for (the body has passed the service's ``CourseBody``
    schema: fields, types and bounds); CourseError for what a schema cannot say."""
    starts, ends = _day(body, "starts"), _day(body, "ends")
    if starts is not None and ends is not None and ends < starts:
        raise CourseError(f"the course ends ({ends.isoformat()}) before it starts ({starts.isoformat()})")
    try:
        ceiling = quota_from_body(body["ceiling"], known_models)
    except QuotaError as exc:
        raise CourseError(f"ceiling: {exc}") from None
    staff_group = body.get("staff_group") or None
    if staff_group == name:
        raise CourseError(
            f"the staff group must not be the course's own group {json.dumps(name)} (its students); "
            "name a group of its instructors and TAs, such as " + json.dumps(f"{name}-staff")
        )
    staff = tuple(dict.fromkeys(s.strip() for s in body.get("staff") or [] if s.strip()))
    return Course(
        name=name,
        title=body["title"].strip(),
        ceiling=Quota(
            max_gpus=ceiling.max_gpus,
            gpu_hours_per_week=ceiling.gpu_hours_per_week,
            allowed_models=ceiling.allowed_models,
        ),
        starts=starts,
        ends=ends,
        staff_group=staff_group,
        staff=staff,
        reservation_gpus=int(body.get("reservation_gpus", 0)),
    )


def staff_quota_from_body(course: Course, body: Mapping[str, Any], known_models: Sequence[str] | None = None) -> Quota:
    """The quota a staff member's body asks for: ``max_gpus``, ``gpu_hours_per_week`` and ``allowed_models``,
    a part left out taking the course's ceiling (so ``{"max_gpus": 1}`` is one GPU under the course's weekly
    budget and models); the rest of the quota keeps the hub's defaults. CourseError for an unknown model;
    whether it is within the ceiling is ``over_ceiling``'s to say."""
    ceiling = course.ceiling.to_json()
    asked = {key: body[key] if key in body else ceiling[key] for key in CEILING_FIELDS}
    try:
        return quota_from_body(asked, known_models)
    except QuotaError as exc:
        raise CourseError(str(exc)) from None
