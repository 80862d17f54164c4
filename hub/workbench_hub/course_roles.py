"""JupyterHub roles for each course's staff: see and follow their students in the hub itself, nothing else.

Beside the workbench service's own course routes (``service/course_handlers.py``,
which decide at every request from the course's staff as the hub says it then),
each course's staff get a JupyterHub role of their own, scoped to the course's
hub group with JupyterHub's ``!group=`` filter (as Berkeley's DataHub gives its
course staff): the hub's admin page (``admin-ui``) and its REST API list their
students, their activity and their servers, and no one else. Stopping a
server goes through the course page or ``workbench course stop``, where open
notebooks are saved first and the student is told who stopped it; no role here
grants ``admin:servers``, ``access:servers`` (the students' notebooks) or
anything outside the course's group.

JupyterHub reads roles when it starts: a course set up, or its staff changed,
while the hub runs gets its hub role at the next start (the service's own
checks apply at once). A course's name may hold characters a role name may not:
the role is ``course-staff-`` with the name made safe and a short digest of it,
so two courses never share a role.
"""

from __future__ import annotations

import hashlib
import re

from traitlets.config import Config

from workbench_spawner.ledger.course_book import CourseBook
from workbench_spawner.ledger.store import AllocationStore
from workbench_spawner.rules.course import Course

PREFIX = "course-staff-"


def role_name(course: str) -> str:
    """A JupyterHub role name for ``course``'s staff: lowercase letters, digits and ``-``, unique per course."""
    safe = re.sub(r"[^a-z0-9]+", "-", course.lower()).strip("-")[:200] or "course"
    return f"{PREFIX}{safe}-{hashlib.sha256(course.encode()).hexdigest()[:8]}"


def course_scopes(course: str) -> list[str]:
    """What a course's staff may do in the hub itself: its students, their activity and servers, read only."""
    where = f"!group={course}"
    return [
        "admin-ui",
        f"list:users{where}",
        f"read:users{where}",
        f"read:users:activity{where}",
        f"read:servers{where}",
        f"read:groups{where}",
    ]


def course_role(course: Course) -> dict:
    """The ``load_roles`` entry of ``course``'s staff (its staff group and the users it names)."""
    role: dict = {
        "name": role_name(course.name),
        "description": f"Staff of the course {course.name}: its students and their servers, read only",
        "scopes": course_scopes(course.name),
        "users": list(course.staff),
    }
    if course.staff_group:
        role["groups"] = [course.staff_group]
    return role


def update_course_roles(c: Config, db_url: str) -> list[str]:
    """Add a role per course of the GPU database to ``c.JupyterHub.load_roles``; the role names added."""
    store = AllocationStore(db_url)
    try:
        courses = CourseBook(store).all()
    finally:
        store.dispose()
    roles = [course_role(course) for course in courses]
    c.JupyterHub.load_roles = [*c.JupyterHub.get("load_roles", []), *roles]
    return [role["name"] for role in roles]
