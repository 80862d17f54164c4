"""A course's end: the GPU servers its quota kept running are stopped, saved first, with a sentence.

From the day after a course's end date (in the hub's time zone, by the
hub's clock: ``Fleet.today``) its group quota and the quotas its staff set
for its students are no longer in force (``QuotaBook``'s ``today``). Every
``--session-check-seconds`` the service looks at the ended courses' students
and stops the GPU servers of each student who now holds more GPUs than the
quota still in force for them allows (their own admin-set quota, another
course's, the hub's default): those servers ran on the course's quota. A
student whose other quota still covers what they hold keeps running.

The stop is the service's one way (``stopping.Stopper.stop_for``): open
notebooks saved first; the spawn page and home page say "Your server was
stopped at 09:00: the course ml-101 ended on 12 March. ... Your files are
kept."; the usage ledger's reason is "course ended: ml-101". Homes are never
touched. A server whose stop the hub is already doing is left alone, so a
check every second asks once.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import date

from workbench_spawner.ledger import reasons
from workbench_spawner.ledger.course_book import CourseBook
from workbench_spawner.rules.course import ENDED, Course, is_staff, phase

from .hub_client import HubClient
from .stopping import Stopped, Stopper

log = logging.getLogger("workbench.service")
KIND = "course"
AFTER_END = "Your course's GPU quota ended with it; the hub's default quota applies to your next start."


def ended_cause(course: Course) -> str:
    """The stop box's words after "stopped at 09:00: ": 'the course ml-101 ended on 12 March'."""
    ends = course.ends or date.min
    return f"the course {course.name} ended on {ends.day} {ends:%B}"


def ended_reason(course: Course) -> str:
    """The usage ledger's reason (at most 64 characters): 'course ended: ml-101'."""
    return f"{reasons.COURSE_ENDED}: {course.name}"[:64].rstrip()


async def stop_ended_courses(fleet, hub: HubClient, stopper: Stopper) -> list[Stopped]:
    """Stop what ended courses' quotas kept running (see the module docstring); the stops made."""
    today = await asyncio.to_thread(fleet.today)
    ended = [c for c in await asyncio.to_thread(CourseBook(fleet.store).all) if phase(c, today) == ENDED]
    if not ended:
        return []
    held = await asyncio.to_thread(fleet.held_by_server)
    users = [u for u in await hub.users() if sum(held.get(u["name"], {}).values())]
    stops = []
    for user in users:
        name, groups = user["name"], user.get("groups") or []
        course = next((c for c in ended if c.name in groups and not is_staff(c, name, groups)), None)
        if course is None:
            continue
        quota = await asyncio.to_thread(fleet.book.effective, name, groups, fleet.default)
        holding = {server: n for server, n in held[name].items() if n}
        if sum(holding.values()) <= quota.quota.max_gpus:
            continue  # another quota still covers what they hold
        running = user.get("servers") or {}
        for server in sorted(holding):
            model = running.get(server)
            if model is None or model.get("pending") == "stop":
                continue
            log.info("Course %s ended on %s: stopping %s/%s", course.name, course.ends, name, server or "default")
            stops.append(
                stopper.stop_for(
                    name,
                    server,
                    kind=KIND,
                    cause=ended_cause(course),
                    reason=ended_reason(course),
                    hint=AFTER_END,
                    path=model.get("url") if model.get("ready") else None,
                )
            )
    return list(await asyncio.gather(*stops))
