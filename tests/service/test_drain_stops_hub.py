"""Drains that stop servers, and the session limit's warning, through the real hub, proxy, service and user
servers (local backend, 2 simulated GPUs).

1. bad ``stop_servers_in_minutes`` (API and CLI): 400 or exit 2 with a sentence, nothing drained or warned;
2. a server on a GPU drained with a countdown is warned (the notice reaches its GPU monitor), then stopped:
   its stop box says "drained for maintenance (new MIG layout)", the ledger reason is "drained: new MIG
   layout"; the server on the other GPU keeps running;
3. ``workbench drain GPU --stop-in 10`` warns, ``workbench undrain`` before the time withdraws the warning;
4. a server with a 72-second session limit is warned (30 s lead, WORKBENCH_GPU_IDLE_WARN_MINUTES) before
   it is stopped at its limit.
"""

from __future__ import annotations

import sqlite3
import time

import pytest
import requests

from tests.conftest import wait_until
from tests.service.conftest import shut_down, start_workbench_hub

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    base = tmp_path_factory.mktemp("drain-stops")
    local = base / "local_config.py"
    # A busy CI host can take over 30 s to start a server (JupyterHub's default http_timeout).
    local.write_text("c.Spawner.http_timeout = 180\n")
    hub = start_workbench_hub(
        base / "hub",
        {
            "WORKBENCH_LOCAL_CONFIG": str(local),
            "WORKBENCH_SIMULATED_GPUS": "2",
            "WORKBENCH_TIME_ZONE": "UTC",
            "WORKBENCH_RESERVATION_CHECK_SECONDS": "0.5",  # the drain countdown's pace
            "WORKBENCH_SESSION_CHECK_SECONDS": "1",
            "WORKBENCH_GPU_IDLE_CHECK_SECONDS": "1",  # delivers the notices to the servers
            "WORKBENCH_GPU_IDLE_WARN_MINUTES": "0.5",
            "WORKBENCH_SAVE_WAIT_SECONDS": "5",
        },
    )
    hub.create_users("alice", "bob", "carol")
    yield hub
    shut_down(hub)


def wait_for(hub, predicate, what: str, timeout: float = 60):
    return wait_until(predicate, timeout, what, log=hub.log)


def notices(hub, kind: str, state: str = "pending") -> list[tuple[str, str]]:
    with sqlite3.connect(hub.data_dir / "workbench.sqlite") as db:
        return db.execute(
            "SELECT user, message FROM workbench_notices WHERE kind=? AND state=? ORDER BY user", (kind, state)
        ).fetchall()


def on_server(hub, user: str, token: str) -> list[dict]:
    r = requests.get(f"{hub.url}/user/{user}/api/gpu/notices", headers={"Authorization": f"token {token}"}, timeout=10)
    return r.json().get("notices") or [] if r.status_code == 200 else []


def drains(hub) -> list[dict]:
    r = hub.service("GET", "api/drains")
    assert r.status_code == 200, r.text
    return r.json()["drains"]


def start(hub, user: str) -> str:
    """Start ``user``'s server with 1 GPU; its GPU's UUID."""
    assert hub.spawn(user, gpus=1).status_code in (201, 202)
    hub.wait_ready(user, timeout=180)
    return hub.leases()[user][0]


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (0, "stop_servers_in_minutes must be more than 0"),
        (-5, "stop_servers_in_minutes must be more than 0"),
        (10081, "stop_servers_in_minutes must be"),
        ("ten", "stop_servers_in_minutes must be a number"),
        (True, "stop_servers_in_minutes must be a number"),
    ],
)
def test_a_bad_countdown_is_refused_and_changes_nothing(hub, value, words):
    r = hub.service("PUT", "api/drains/0", json={"reason": "x", "stop_servers_in_minutes": value})
    assert r.status_code == 400, r.text
    assert words in r.json()["message"], r.text
    assert drains(hub) == []
    assert notices(hub, "drain") == []


def test_the_cli_refuses_a_bad_stop_in_before_asking(hub):
    result = hub.cli("drain", "0", "--stop-in", "0")
    assert result.returncode == 2, result.stderr
    assert "--stop-in takes minutes above 0" in result.stderr, result.stderr
    assert drains(hub) == []


def test_a_server_on_a_drained_gpu_is_warned_then_stopped_with_the_reason(hub):
    alice_gpu = start(hub, "alice")
    bob_gpu = start(hub, "bob")
    assert alice_gpu != bob_gpu
    alice = hub.user_token("alice")
    r = hub.service("PUT", f"api/drains/{alice_gpu}", json={"reason": "new MIG layout", "stop_servers_in_minutes": 0.3})
    assert r.status_code == 200, r.text
    [holder] = r.json()["holders"]
    assert (holder["user"], holder["uuid"]) == ("alice", alice_gpu)
    assert holder["stop_at"]
    [(user, message)] = notices(hub, "drain")
    assert user == "alice"
    assert message.startswith("Your server will be stopped at ")
    assert message.endswith(": its GPU is being drained for maintenance (new MIG layout).")
    # JupyterLab's countdown: the notice reaches alice's server.
    told = wait_for(hub, lambda: [n for n in on_server(hub, "alice", alice) if n["kind"] == "drain"], "the notice")
    assert told[0]["message"] == message
    assert 0 <= told[0]["seconds_left"] <= 18
    hub.wait_stopped("alice", timeout=60)
    box = hub.stop_box("alice")
    assert box.startswith("Your server was stopped at "), box
    assert box.endswith("Your files are kept."), box
    assert ": its GPU was drained for maintenance (new MIG layout). " in box
    assert wait_for(hub, lambda: hub.usage_reasons().get("alice"), "alice's ledger row") == ["drained: new MIG layout"]
    assert hub.server("bob")["ready"]
    assert notices(hub, "drain") == []
    assert hub.service("DELETE", f"api/drains/{alice_gpu}").status_code == 204


def test_undraining_before_the_time_withdraws_the_warning(hub):
    bob_gpu = hub.leases()["bob"][0]
    said = hub.cli("drain", bob_gpu, "--reason", "driver update", "--stop-in", "10")
    assert said.returncode == 0, said.stderr
    assert "still in use by bob (to be stopped at " in said.stdout
    assert "each was warned now" in said.stdout
    [(user, message)] = notices(hub, "drain")
    assert user == "bob"
    assert "(driver update)." in message
    listed = hub.cli("drains")
    assert "bob (to be stopped at " in listed.stdout, listed.stdout
    undone = hub.cli("undrain", bob_gpu)
    assert undone.returncode == 0, undone.stderr
    assert notices(hub, "drain") == []
    assert "bob" in [u for u, _ in notices(hub, "drain", "cleared")]
    time.sleep(2)  # a few drain passes: bob keeps running
    assert hub.server("bob")["ready"]
    assert drains(hub) == []
    hub.api("DELETE", "/users/bob/server")
    hub.wait_stopped("bob")


def test_the_session_limit_warns_before_it_stops(hub):
    r = hub.service("PUT", "api/quotas/users/carol", json={"max_gpus": 1, "max_session_hours": 0.02})
    assert r.status_code == 200, r.text
    began = time.monotonic()
    start(hub, "carol")
    carol = hub.user_token("carol")
    warned = wait_for(
        hub, lambda: [n for n in on_server(hub, "carol", carol) if n["kind"] == "session"], "the warning", 90
    )
    assert hub.server("carol")["ready"], "warned while it still runs"
    assert warned[0]["message"].startswith("Your server will be stopped at ")
    assert warned[0]["message"].endswith(": session limit of 0.02 hours.")
    assert warned[0]["seconds_left"] <= 31
    hub.wait_stopped("carol", timeout=90)
    assert time.monotonic() - began > 30
    assert ": session limit of 0.02 hours reached. " in hub.stop_box("carol")
    assert wait_for(hub, lambda: hub.usage_reasons().get("carol"), "carol's ledger row") == ["session limit: 0.02 h"]
    assert notices(hub, "session") == []
