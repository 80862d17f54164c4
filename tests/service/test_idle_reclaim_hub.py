"""Idle GPUs come back, through the real hub: a GPU made idle by the scripted simulated source is warned
about in the user's server, the server is stopped, the next user in line gets the GPU, the ledger says why;
exemptions and bad input at the REST API."""

from __future__ import annotations

import sqlite3
import time

import pytest
import requests

from tests.conftest import wait_until, write_utilization
from tests.service.conftest import shut_down, start_workbench_hub

pytestmark = pytest.mark.integration

GPU = "GPU-sim-00-h100-80gb"
IDLE_MINUTES = 0.25  # 15 s; the warning comes half of it (7.5 s) before the stop


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    base = tmp_path_factory.mktemp("idle")
    utilization = base / "utilization.json"
    write_utilization(utilization, {"*": 80})
    # A busy 2-core CI host can take over 30 s to start a server (JupyterHub's default http_timeout).
    local = base / "local_config.py"
    local.write_text("c.Spawner.http_timeout = 180\n")
    hub = start_workbench_hub(
        base / "hub",
        {
            "WORKBENCH_LOCAL_CONFIG": str(local),
            "WORKBENCH_SIMULATED_GPUS": "1",
            "WORKBENCH_SIMULATED_UTILIZATION": str(utilization),
            "WORKBENCH_GPU_IDLE_MINUTES": str(IDLE_MINUTES),
            "WORKBENCH_GPU_IDLE_CHECK_SECONDS": "1",
            "WORKBENCH_QUEUE_TIMEOUT": "120",
        },
    )
    hub.utilization = utilization
    hub.create_users("alice", "bob", "carol")
    assert hub.api("POST", "/groups/research", json={"users": ["carol"]}).status_code in (201, 409)
    yield hub
    shut_down(hub)


def server_get(hub, user: str, token: str, path: str) -> requests.Response:
    return requests.get(f"{hub.url}/user/{user}/{path}", headers={"Authorization": f"token {token}"}, timeout=10)


def wait_for(predicate, timeout: float, what: str, hub):
    return wait_until(predicate, timeout, what, log=hub.log)


def ledger(hub) -> list[tuple[str, str]]:
    with sqlite3.connect(hub.data_dir / "workbench.sqlite") as db:
        return db.execute("SELECT user, reason FROM gpu_usage ORDER BY id").fetchall()


def test_an_idle_gpu_is_warned_about_then_reclaimed_for_the_next_in_line(hub):
    alice = hub.user_token("alice")
    assert hub.spawn("alice", gpus=1).status_code in (201, 202)
    hub.wait_ready("alice")
    assert hub.leases() == {"alice": [GPU]}
    # Busy: no warning, the fleet says busy.
    time.sleep(3)
    assert server_get(hub, "alice", alice, "api/gpu/notices").json()["notices"] == []
    # Bob asks for the only GPU and waits in line.
    assert hub.spawn("bob", gpus=1).status_code == 202
    write_utilization(hub.utilization, {"*": 0})

    def notice():
        notices = server_get(hub, "alice", alice, "api/gpu/notices").json()["notices"]
        return notices[0] if notices else None

    warning = wait_for(notice, 30, "no idle warning reached alice's server", hub)
    assert warning["kind"] == "idle"
    assert warning["message"].startswith("Your server will be stopped at ")
    assert 0 <= warning["seconds_left"] <= IDLE_MINUTES * 60 / 2 + 2
    assert "CPU-only server" in warning["hint"]
    # The user reads notices; she cannot write them (only the hub's service may).
    r = requests.put(
        f"{hub.url}/user/alice/api/gpu/notices",
        json={"notices": []},
        headers={"Authorization": f"token {alice}"},
        timeout=10,
    )
    assert r.status_code == 403
    assert "service" in r.json()["message"]
    idle = hub.service("GET", "api/idle").json()
    [gpu] = idle["gpus"]
    assert gpu["user"] == "alice"
    assert gpu["idle_seconds"] > 0
    assert gpu["reading_source"] == "host"
    assert idle["default_rule"]["enabled"]
    assert idle["default_rule"]["gpu_idle_minutes"] == IDLE_MINUTES
    page_gpus = hub.service("GET", "api/gpus").json()["gpus"]
    assert page_gpus[0]["idle_seconds"] > 0

    hub.wait_stopped("alice", timeout=40)
    write_utilization(hub.utilization, {"*": 80})  # bob works
    hub.wait_ready("bob", timeout=60)
    assert hub.leases() == {"bob": [GPU]}
    assert ("alice", "reclaimed: GPU idle 15 s") in ledger(hub)
    assert "Stopping alice/default: its GPUs GPU-sim-00-h100-80gb stayed under 5 %" in hub.log()
    # (The spawn page's "why it stopped" needs a logged-in browser: tests/browser/test_idle_warning_browser.py.)
    # Bob's busy GPU is left alone.
    time.sleep(IDLE_MINUTES * 60 / 2 + 3)
    assert hub.server("bob")["ready"]
    assert server_get(hub, "bob", hub.user_token("bob"), "api/gpu/notices").json()["notices"] == []
    assert hub.api("DELETE", "/users/bob/server").status_code in (202, 204)
    hub.wait_stopped("bob")


def test_missing_readings_and_exempt_groups_are_left_alone(hub):
    # Readings stop (the script says "no reading"): never idle, logged once.
    write_utilization(hub.utilization, {"*": None})
    assert hub.spawn("alice", gpus=1).status_code in (201, 202)
    hub.wait_ready("alice")
    time.sleep(IDLE_MINUTES * 60 + 5)
    assert hub.server("alice")["ready"], "a server without readings must not be reclaimed"
    assert "Idle reclaim leaves alice/default alone: no recent utilization reading" in hub.log()
    assert hub.api("DELETE", "/users/alice/server").status_code in (202, 204)
    hub.wait_stopped("alice")
    # An exempt group keeps its idle GPU.
    r = hub.service("PUT", "api/idle/exemptions/research", json={"reason": "long CPU preprocessing"})
    assert r.status_code == 200
    assert r.json()["exempt"] is True
    write_utilization(hub.utilization, {"*": 0})
    assert hub.spawn("carol", gpus=1).status_code in (201, 202)
    hub.wait_ready("carol")
    time.sleep(IDLE_MINUTES * 60 + 5)
    assert hub.server("carol")["ready"], "an exempt group's server must not be reclaimed"
    assert server_get(hub, "carol", hub.user_token("carol"), "api/gpu/notices").json()["notices"] == []
    # Ending the exemption brings the rule back (warned, then stopped).
    assert hub.service("DELETE", "api/idle/exemptions/research").status_code == 204
    hub.wait_stopped("carol", timeout=40)
    assert ("carol", "reclaimed: GPU idle 15 s") in ledger(hub)


@pytest.mark.parametrize(
    ("method", "path", "body", "token", "status", "words"),
    [
        ("PUT", "api/idle/exemptions/nosuchgroup", {}, None, 404, "no group named"),
        ("PUT", "api/idle/exemptions/research", {"why": "x"}, None, 400, "reason"),
        ("PUT", "api/idle/exemptions/research", {"reason": 5}, None, 400, "text"),
        ("PUT", "api/idle/exemptions/research", {"reason": "r" * 501}, None, 400, "500"),
        ("PUT", "api/idle/exemptions/research", "not json", None, 400, "not valid JSON"),
        ("PUT", "api/idle/exemptions/%20pad", {}, None, 400, "group name"),
        ("PUT", "api/idle/exemptions/research", {}, "student", 403, "admin"),
        ("DELETE", "api/idle/exemptions/research", None, "student", 403, "admin"),
        ("DELETE", "api/idle/exemptions/nosuchgroup", None, None, 404, "no group named"),
        ("GET", "api/idle", None, "student", 403, "scope"),
        ("GET", "api/idle/exemptions/nosuchgroup", None, None, 404, "no group named"),
        ("PUT", "api/quotas/users/alice", {"max_gpus": 1, "gpu_idle_minutes": 0.001}, None, 400, "gpu_idle_minutes"),
        ("PUT", "api/quotas/users/alice", {"max_gpus": 1, "gpu_idle_threshold": 150}, None, 400, "gpu_idle_threshold"),
    ],
)
def test_bad_input_is_refused_with_a_sentence_and_changes_nothing(hub, method, path, body, token, status, words):
    assert hub.service("PUT", "api/idle/exemptions/research", json={"reason": "kept"}).status_code == 200
    assert hub.service("PUT", "api/quotas/users/alice", json={"max_gpus": 1, "gpu_idle_minutes": 30}).status_code == 200
    before = (hub.service("GET", "api/idle/exemptions").json(), hub.service("GET", "api/quotas").json()["users"])
    kwargs = {"data": body} if isinstance(body, str) else ({"json": body} if body is not None else {})
    if token == "student":
        token = hub.user_token("bob")
    r = hub.service(method, path, token=token, **kwargs)
    assert r.status_code == status, r.text
    assert words in r.json()["message"]
    after = (hub.service("GET", "api/idle/exemptions").json(), hub.service("GET", "api/quotas").json()["users"])
    assert after == before


def test_the_cli_shows_exempts_and_refuses_with_an_exit_code(hub, capsys):
    from workbench_hub.cli import main

    base = ["--url", hub.url, "--token", hub.token]
    assert main([*base, "idle", "exempt", "research", "--reason", "long runs"]) == 0
    assert main([*base, "idle"]) == 0
    out = capsys.readouterr().out
    assert "exempt: research (long runs)" in out
    assert "hub default: stop after 15 s under 5 % utilization" in out
    before = hub.service("GET", "api/idle/exemptions").json()
    assert main([*base, "idle", "exempt", "nosuchgroup"]) == 1
    assert "no group named" in capsys.readouterr().err
    assert main([*base, "idle", "unexempt"]) == 2
    assert "needs a group name" in capsys.readouterr().err
    assert main([*base, "idle", "show", "research"]) == 2
    assert main(["--url", hub.url, "--token", "wrong-token", "idle", "exempt", "research"]) == 1
    assert hub.service("GET", "api/idle/exemptions").json() == before
    assert main([*base, "quota", "set", "alice", "--max-gpus", "1", "--gpu-idle-minutes", "0"]) == 0
    assert "never reclaimed when idle" in capsys.readouterr().out
    assert main([*base, "quota", "set", "alice", "--max-gpus", "1", "--gpu-idle-minutes", "0.001"]) == 1
    assert "gpu_idle_minutes must be 0" in capsys.readouterr().err
    assert hub.service("GET", "api/quotas/users/alice").json()["quota"]["gpu_idle_minutes"] == 0
    assert main([*base, "idle", "unexempt", "research"]) == 0


def test_the_service_reads_a_server_it_cannot_see_through_the_proxy_and_reclaims_by_it(tmp_path):
    """A hub that cannot see its GPUs (a ``static_gpus`` list): the service's only readings are the user
    server's own monitor, read through the proxy with the service's token. Busy readings keep the server;
    idle ones get it warned (in the server) and stopped, the ledger says why."""
    utilization = tmp_path / "utilization.json"
    write_utilization(utilization, {"*": 80})
    static = [{"uuid": GPU, "name": "NVIDIA H100 80GB HBM3", "model": "H100-80GB"}]
    local = tmp_path / "local_config.py"
    # The hub sees no GPUs (static list); only the user server pretends to have them, with scripted use.
    local.write_text(
        f"c.GPUSpawnerMixin.static_gpus = {static!r}\n"
        f"c.Spawner.environment = {{'WORKBENCH_SIMULATED_GPUS': '1', "
        f"'WORKBENCH_SIMULATED_UTILIZATION': {str(utilization)!r}}}\n"
        "c.Spawner.http_timeout = 180\n"
    )
    hub = start_workbench_hub(
        tmp_path / "hub",
        {
            "WORKBENCH_SIMULATED_GPUS": "",
            "WORKBENCH_LOCAL_CONFIG": str(local),
            "WORKBENCH_GPU_IDLE_MINUTES": str(IDLE_MINUTES),
            "WORKBENCH_GPU_IDLE_CHECK_SECONDS": "1",
        },
    )
    try:
        hub.create_users("alice")
        assert hub.service("GET", "api/gpus").json()["source"] == "static"
        assert hub.spawn("alice", gpus=1).status_code in (201, 202)
        hub.wait_ready("alice")

        def busy_reading():
            gpus = hub.service("GET", "api/idle").json()["gpus"]
            return gpus and gpus[0]["utilization_percent"] == 80 and gpus[0]

        gpu = wait_for(busy_reading, 30, "the service never read the server's monitor", hub)
        assert gpu["reading_source"] == "server", "busy: no idle clock"
        assert gpu["idle_seconds"] is None, "busy: no idle clock"
        write_utilization(utilization, {"*": 0})

        token = hub.user_token("alice")

        def notices():
            r = server_get(hub, "alice", token, "api/gpu/notices")
            return r.json()["notices"] if r.status_code == 200 else []

        [notice] = wait_for(notices, 30, "no idle warning from the server's readings", hub)
        assert notice["kind"] == "idle"
        hub.wait_stopped("alice", timeout=40)
        assert ledger(hub) == [("alice", "reclaimed: GPU idle 15 s")]
    finally:
        shut_down(hub)
