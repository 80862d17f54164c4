"""Reservations and the fair-share queue through the real hub, proxy, service and user servers.

One hub with 2 simulated GPUs, fair-share order and a test clock
(``WORKBENCH_TEST_CLOCK_FILE``, clock.py) that the test moves to open a
window. The scenario runs in order, each step on the state the last one
left, so it needs only four user servers:

1. bad input to every new endpoint and CLI command: a 4xx or exit code with
   a sentence, the reservations unchanged;
2. a window opened by the test clock keeps 1 of 2 GPUs for ml-course: a
   non-member gets the other, the next non-member waits, a member gets the
   reserved one while that non-member still waits;
3. fair share: of two users waiting, the one with fewer GPU-hours gets the
   next free GPU although they came second, and the spawn page says why;
4. preempt: a reservation that says ``preempt`` warns the non-members who
   hold the GPUs (notices), stops them at its start with the ledger reason
   "preempted: reserved for ml-course", and the GPUs they free are kept for
   the members (the waiting non-member keeps waiting).
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest

from tests.conftest import wait_until
from tests.service.conftest import shut_down, start_workbench_hub
from workbench_spawner.policy.clock import set_test_clock

pytestmark = pytest.mark.integration

TUE = datetime(2026, 12, 8, tzinfo=UTC)  # a Tuesday; the hub's zone is UTC here


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    base = tmp_path_factory.mktemp("reservations")
    clock = base / "clock"
    set_test_clock(clock, TUE.replace(hour=9))
    # A busy 2-core CI host can take over 30 s to start a server (JupyterHub's default http_timeout).
    local = base / "local_config.py"
    # The spawn request answers 202 after 1 s instead of 10 (slow_spawn_timeout): the scenario waits less.
    local.write_text("c.Spawner.http_timeout = 180\nc.JupyterHub.tornado_settings = {'slow_spawn_timeout': 1}\n")
    hub = start_workbench_hub(
        base / "hub",
        {
            "WORKBENCH_LOCAL_CONFIG": str(local),
            "WORKBENCH_SIMULATED_GPUS": "2",
            "WORKBENCH_QUEUE_ORDER": "fair-share",
            "WORKBENCH_TIME_ZONE": "UTC",
            "WORKBENCH_TEST_CLOCK_FILE": str(clock),
            "WORKBENCH_RESERVATION_CHECK_SECONDS": "0.5",
            "WORKBENCH_QUEUE_TIMEOUT": "120",
            "WORKBENCH_SESSION_CHECK_SECONDS": "0",
        },
    )
    hub.clock = clock
    hub.create_users("out1", "out2", "stud", "heavy", "light")
    assert hub.api("POST", "/groups/ml-course").status_code in (201, 409)
    assert hub.api("POST", "/groups/ml-course/users", json={"users": ["stud"]}).status_code == 200
    yield hub
    shut_down(hub)


def reservations(hub) -> list[dict]:
    r = hub.service("GET", "api/reservations")
    assert r.status_code == 200, r.text
    return r.json()["reservations"]


def cli(hub, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "workbench_hub.cli", "--url", hub.url, "--token", hub.token, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def sql(hub, query: str, *params) -> list[tuple]:
    with sqlite3.connect(hub.data_dir / "workbench.sqlite") as db:
        return db.execute(query, params).fetchall()


def wait_for(predicate, what: str, timeout: float = 60):
    return wait_until(predicate, timeout, what)


def pending(hub, user: str) -> None:
    r = hub.spawn(user, gpus=1)
    assert r.status_code == 202, r.text
    wait_for(
        lambda: any("ahead" in m or "next in line" in m for m in hub.progress_messages(user, "line", timeout=5)),
        f"{user} to wait in line",
    )


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"group": "ml-course", "gpus": 1}, 400, "window is missing"),
        ({"group": "ml-course", "gpus": 1, "window": "Tue 10-12"}, 400, "malformed"),
        ({"group": "ml-course", "gpus": 1, "window": "Tue 12:00-12:00"}, 400, "empty"),
        ({"group": "ml-course", "gpus": 3, "window": "Tue 10:00-12:00"}, 400, "more than this hub has (2)"),
        ({"group": "ml-course", "gpus": 0, "window": "Tue 10:00-12:00"}, 400, "between 1"),
        ({"group": "ml-course", "gpus": "two", "window": "Tue 10:00-12:00"}, 400, "whole number"),
        ({"group": "ml-course", "gpus": 1, "window": "Tue 10:00-12:00", "model": "B200"}, 400, "no B200 GPUs"),
        ({"group": "nobody", "gpus": 1, "window": "Tue 10:00-12:00"}, 400, "no group named"),
        ({"group": "ml-course", "gpus": 1, "window": "2026-12-01 10:00-12:00"}, 400, "is past"),
        ([1, 2], 400, "JSON object"),
    ],
)
def test_bad_reservations_are_refused_and_change_nothing(hub, body, status, words):
    before = reservations(hub)
    r = hub.service("POST", "api/reservations", json=body)
    assert r.status_code == status, r.text
    assert words in r.json()["message"], r.text
    assert reservations(hub) == before


def test_bad_requests_to_the_other_endpoints_and_the_cli(hub):
    before = reservations(hub)
    assert hub.service("POST", "api/reservations", data=b"{nope").status_code == 400
    r = hub.service("DELETE", "api/reservations/999")
    assert r.status_code == 404
    assert "no reservation with id 999" in r.json()["message"]
    assert hub.service("GET", "api/reservations/abc").status_code == 404
    assert hub.service("POST", "api/reservations/1", json={}).status_code == 405
    student = hub.user_token("stud")
    r = hub.service(
        "POST", "api/reservations", token=student, json={"group": "ml-course", "gpus": 1, "window": "Tue 10:00-12:00"}
    )
    assert r.status_code == 403
    assert hub.service("GET", "api/reservations", token=student).status_code == 403
    for args, code, words in [
        (("reserve", "ml-course", "--gpus", "1", "--weekly", "2026-12-08 10:00-12:00"), 2, "--weekly needs a weekday"),
        (("reserve", "ml-course", "--gpus", "x", "--weekly", "Tue 10:00-12:00"), 2, "not a whole number"),
        (("reserve", "ml-course", "--gpus", "9", "--weekly", "Tue 10:00-12:00"), 1, "more than this hub has"),
        (("reserve", "nobody", "--gpus", "1", "--once", "2026-12-08 10:00-12:00"), 1, "no group named"),
        (("reservations", "delete", "77"), 1, "no reservation with id 77"),
        (("reservations", "delete"), 2, "needs the reservation's id"),
    ]:
        result = cli(hub, *args)
        assert result.returncode == code, (args, result.stdout, result.stderr)
        assert words in result.stderr, (args, result.stdout, result.stderr)
    assert reservations(hub) == before


def test_a_window_opened_by_the_test_clock_keeps_gpus_for_members(hub):
    made = cli(hub, "reserve", "ml-course", "--gpus", "1", "--weekly", "Tue 10:00-12:00")
    assert made.returncode == 0, made.stderr
    assert "Reserved #" in made.stdout, made.stderr
    listed = cli(hub, "reservations")
    assert "1 GPU for ml-course, weekly Tue 10:00-12:00" in listed.stdout
    assert "time zone: UTC" in listed.stdout
    page = hub.service("GET", "")
    assert page.status_code == 200
    assert 'id="workbench-reservations"' in page.text
    assert 'id="reservation-form"' in page.text
    [res] = reservations(hub)
    assert res["active"] is False
    assert res["next_start"].startswith("2026-12-08T10:00")
    # An overlapping one that together needs 3 of 2 GPUs is refused; nothing changes.
    r = hub.service("POST", "api/reservations", json={"group": "ml-course", "gpus": 2, "window": "Tue 11:00-13:00"})
    assert r.status_code == 400
    assert "together 3 GPUs" in r.json()["message"]
    assert reservations(hub) == [res]

    set_test_clock(hub.clock, TUE.replace(hour=10, minute=1))
    assert wait_for(lambda: reservations(hub)[0]["active"], "the window to open")
    assert hub.spawn("out1", gpus=1).status_code in (201, 202)
    hub.wait_ready("out1")
    pending(hub, "out2")  # the other GPU is reserved for ml-course
    assert hub.spawn("stud", gpus=1).status_code in (201, 202)
    hub.wait_ready("stud")  # a member passes the waiting non-member
    leases = hub.leases()
    assert sorted(leases) == ["out1", "stud"]
    assert not hub.server("out2")["ready"]
    hub.api("DELETE", "/users/out1/server")
    hub.wait_ready("out2")  # the unreserved GPU came free: out2 gets it
    assert sorted(hub.leases()) == ["out2", "stud"]
    groups = dict(sql(hub, "SELECT user, groups FROM gpu_leases"))
    assert groups["stud"] == '["ml-course"]'
    assert groups["out2"] == "[]"


def test_fair_share_serves_the_lighter_user_first(hub):
    assert hub.service("DELETE", f"api/reservations/{reservations(hub)[0]['id']}").status_code == 204
    assert reservations(hub) == []
    # heavy used 12 GPU-hours this week (a finished lease in the ledger); light none.
    now = datetime.now(UTC)
    sql(
        hub,
        "INSERT INTO gpu_usage (gpu_uuid, user, server, started, ended, reason, node) VALUES (?,?,?,?,?,?,?)",
        "GPU-x",
        "heavy",
        "",
        (now - timedelta(hours=12)).isoformat(" "),
        now.isoformat(" "),
        "stopped",
        "n",
    )
    pending(hub, "heavy")
    pending(hub, "light")  # arrives second
    messages = hub.progress_messages("heavy", "who used less", timeout=10)
    assert any("you used 12.0 GPU-hours this week; 1 user who used less is ahead" in m for m in messages), messages
    hub.api("DELETE", "/users/stud/server")
    hub.wait_ready("light")  # fewer GPU-hours: served first
    assert not hub.server("heavy")["ready"]


def test_preempt_warns_then_stops_non_members_at_the_start(hub):
    set_test_clock(hub.clock, TUE.replace(hour=10, minute=25))
    r = hub.service(
        "POST",
        "api/reservations",
        json={"group": "ml-course", "gpus": 2, "window": "Tue 10:30-11:00", "preempt": True, "warn_minutes": 10},
    )
    assert r.status_code == 201, r.text
    assert r.json()["preempt"] is True
    warned = wait_for(
        lambda: sql(
            hub, "SELECT user, message FROM workbench_notices WHERE kind='preempt' AND state='pending' ORDER BY user"
        ),
        "the preemption warnings",
    )
    assert [u for u, _ in warned] == ["light", "out2"]
    assert "will be stopped at 10:30 because its GPUs are reserved for ml-course" in warned[0][1]
    set_test_clock(hub.clock, TUE.replace(hour=10, minute=30, second=5))
    hub.wait_stopped("out2")
    hub.wait_stopped("light")
    reasons = dict(sql(hub, "SELECT user, reason FROM gpu_usage WHERE user IN ('out2', 'light')"))
    assert reasons == {"out2": "preempted: reserved for ml-course", "light": "preempted: reserved for ml-course"}
    # The freed GPUs are kept for ml-course: heavy (not a member) still waits.
    time.sleep(1.5)
    assert hub.leases() == {}
    assert not hub.server("heavy")["ready"]


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("WORKBENCH_QUEUE_ORDER", "lifo", "WORKBENCH_QUEUE_ORDER='lifo' is not a queue order; use 'fifo'"),
        ("WORKBENCH_TIME_ZONE", "Mars/Olympus", "is not a time zone"),
    ],
)
def test_a_bad_queue_order_or_zone_stops_the_hub_with_exit_2(running_hub, variable, value, words):
    with pytest.raises(RuntimeError) as stopped:
        running_hub(env={"WORKBENCH_SIMULATED_GPUS": "1", variable: value})
    assert "exited with 2" in str(stopped.value)
    assert words in str(stopped.value)
