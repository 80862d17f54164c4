"""A course's dates on a real hub, moved by the test clock: its quotas sleep before its start and after its end,
and at its end what its quota kept running is stopped, saved first, with a sentence.

One hub for the module, its clock the test clock (``WORKBENCH_TEST_CLOCK_FILE``, UTC) and its service
checking every second. ``ml-101`` runs from 11 January to 12 March 2027 and gives its group 2 GPUs; the
hub's default is 1. ann is its student, prof its instructor, who gives ben a quota of their own.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.conftest import wait_until
from tests.service.conftest import shut_down, start_workbench_hub
from workbench_spawner.policy.clock import set_test_clock

pytestmark = pytest.mark.integration

ML = {
    "title": "Machine learning 101",
    "starts": "2027-01-11",
    "ends": "2027-03-12",
    "ceiling": {"max_gpus": 2},
    "staff": ["prof"],
}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    base = tmp_path_factory.mktemp("course-dates")
    clock = base / "clock"
    set_test_clock(clock, datetime(2027, 1, 5, 9, tzinfo=UTC))
    local = base / "local_config.py"
    local.write_text("c.Spawner.http_timeout = 180\nc.JupyterHub.tornado_settings = {'slow_spawn_timeout': 1}\n")
    hub = start_workbench_hub(
        base / "hub",
        {
            "WORKBENCH_LOCAL_CONFIG": str(local),
            "WORKBENCH_SIMULATED_GPUS": "4",
            "WORKBENCH_TIME_ZONE": "UTC",
            "WORKBENCH_TEST_CLOCK_FILE": str(clock),
            "WORKBENCH_SESSION_CHECK_SECONDS": "1",
        },
    )
    hub.clock = clock
    hub.create_users("ann", "ben", "prof", "zoe")
    assert hub.api("POST", "/groups/ml-101", json={"users": ["ann", "ben"]}).status_code == 201
    assert hub.service("PUT", "api/courses/ml-101", json=ML).status_code == 200
    assert hub.service("PUT", "api/quotas/groups/ml-101", json={"max_gpus": 2}).status_code == 200
    yield hub
    shut_down(hub)


def effective(hub, user: str) -> dict:
    return hub.service("GET", f"api/quotas/users/{user}").json()["effective"]


def test_a_courses_quotas_hold_from_its_start_to_its_end_and_its_servers_stop_at_the_end(hub):
    prof = hub.user_token("prof")
    # Before the start: the course's group quota sleeps; its staff may set up (a quota that waits too).
    assert hub.service("GET", "api/courses/ml-101").json()["phase"] == "upcoming"
    assert (effective(hub, "ann")["origin"], effective(hub, "ann")["max_gpus"]) == ("default", 1)
    r = hub.spawn("ann", gpus=2)
    assert r.status_code >= 400, r.text
    assert "2" in r.text
    r = hub.service("PUT", "api/courses/ml-101/students/ben/quota", token=prof, json={"max_gpus": 2})
    assert r.status_code == 200, r.text
    assert r.json()["quota"]["course"] == "ml-101"
    assert effective(hub, "ben")["origin"] == "default"  # set, asleep until the start

    # The first day: both in force, for the hub's spawns as for the service's answers.
    set_test_clock(hub.clock, datetime(2027, 1, 11, 9, tzinfo=UTC))
    assert hub.service("GET", "api/courses/ml-101").json()["phase"] == "running"
    assert (effective(hub, "ann")["origin"], effective(hub, "ann")["max_gpus"]) == ("from group ml-101", 2)
    assert (effective(hub, "ben")["origin"], effective(hub, "ben")["max_gpus"]) == ("own quota", 2)
    assert hub.spawn("ann", gpus=2).status_code in (201, 202)
    hub.wait_ready("ann", 180)
    assert hub.spawn("zoe", gpus=1).status_code in (201, 202)  # not in the course: the default, untouched
    hub.wait_ready("zoe", 180)

    # The last day is still a course day.
    set_test_clock(hub.clock, datetime(2027, 3, 12, 23, 59, tzinfo=UTC))
    assert hub.service("GET", "api/courses/ml-101").json()["phase"] == "running"
    assert hub.server("ann") is not None

    # The day after: the quotas are gone and ann's 2 GPUs, above the default, stop with the sentence.
    set_test_clock(hub.clock, datetime(2027, 3, 13, 9, tzinfo=UTC))
    wait_until(lambda: hub.server("ann") is None, 60, "ann's server to stop at the course's end", hub.log)
    told = hub.stop_box("ann") or ""
    assert "the course ml-101 ended on 12 March" in told, told
    assert "Your files are kept." in told
    assert hub.usage_reasons()["ann"][-1] == "course ended: ml-101"
    assert hub.service("GET", "api/courses/ml-101").json()["phase"] == "ended"
    assert (effective(hub, "ann")["origin"], effective(hub, "ben")["origin"]) == ("default", "default")
    assert hub.server("zoe") is not None  # another student's server is not the course's
    r = hub.service("PUT", "api/courses/ml-101/students/ben/quota", token=prof, json={"max_gpus": 1})
    assert r.status_code == 403
    assert "ended on 2027-03-12" in r.json()["message"]
    # ann may start again within the hub's default.
    assert hub.spawn("ann", gpus=2).status_code >= 400
    assert hub.spawn("ann", gpus=1).status_code in (201, 202)
    hub.wait_ready("ann", 180)
