"""Each course's staff get a JupyterHub role scoped to the course's group, read at the hub's start.

The course is in the GPU database before the hub starts (as after a restart): prof is named on its staff,
ta is in its staff group. With their own tokens the hub's REST API lists the course's students and their
servers and nobody else's, and refuses to stop a student's server (that goes through the course page, saved
first). A unit table checks the role's name and scopes.
"""

from __future__ import annotations

import pytest
import requests

from tests.service.conftest import shut_down, start_workbench_hub
from workbench_hub.course_roles import course_role, course_scopes, role_name
from workbench_spawner.ledger.course_book import CourseBook
from workbench_spawner.ledger.store import AllocationStore
from workbench_spawner.rules.course import Course
from workbench_spawner.rules.quota import Quota

ML = Course(name="ml-101", title="ML", ceiling=Quota(max_gpus=1), staff_group="ml-staff", staff=("prof",))


@pytest.mark.parametrize(
    ("course", "name"),
    [
        ("ml-101", "course-staff-ml-101-"),
        ("ML 101 (Spring)", "course-staff-ml-101-spring-"),
        ("données", "course-staff-donn-es-"),
        ("---", "course-staff-course-"),
    ],
)
def test_a_course_role_name_is_a_valid_jupyterhub_role_name_of_its_own(course, name):
    from jupyterhub.roles import _validate_role_name  # JupyterHub's own rule, as it checks load_roles

    made = role_name(course)
    assert made.startswith(name)
    assert _validate_role_name(made)
    assert role_name(course + "x") != made


def test_the_role_reads_the_courses_students_only():
    role = course_role(ML)
    assert role["users"] == ["prof"]
    assert role["groups"] == ["ml-staff"]
    assert role["scopes"] == course_scopes("ml-101")
    assert all(s == "admin-ui" or s.endswith("!group=ml-101") for s in role["scopes"])
    assert not [s for s in role["scopes"] if s.startswith(("admin:", "access:", "delete:"))]


@pytest.mark.integration
def test_course_staff_see_their_students_in_the_hubs_api_and_no_one_else(tmp_path):
    data = tmp_path / "hub"
    data.mkdir()
    store = AllocationStore(f"sqlite:///{data / 'workbench.sqlite'}")
    CourseBook(store).set(ML)
    store.dispose()
    hub = start_workbench_hub(data, {"WORKBENCH_SIMULATED_GPUS": "2"})
    try:
        hub.create_users("ann", "zoe", "ta")
        assert hub.api("POST", "/groups/ml-101", json={"users": ["ann"]}).status_code == 201
        assert hub.api("POST", "/groups/ml-staff/users", json={"users": ["ta"]}).status_code == 200
        assert hub.spawn("ann", gpus=1).status_code in (201, 202)
        hub.wait_ready("ann")
        for staff in ("prof", "ta"):
            token = hub.user_token(staff)
            headers = {"Authorization": f"token {token}"}

            def get(path: str, headers=headers):
                return requests.get(f"{hub.url}/hub/api{path}", headers=headers, timeout=30)

            listed = [u["name"] for u in get("/users").json()]
            assert listed == ["ann"], (staff, listed)  # the course's students only
            assert get("/users/ann").json()["servers"][""]["ready"] is True
            assert get("/users/zoe").status_code == 404  # outside the course: not even there
            stop = requests.delete(f"{hub.url}/hub/api/users/ann/server", headers=headers, timeout=30)
            assert stop.status_code in (403, 404), stop.text  # JupyterHub says 404 without the scope
        assert hub.server("ann") is not None
    finally:
        shut_down(hub)
