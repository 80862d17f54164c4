"""Every way a server ends on the local backend leaves its true reason in the usage ledger.

Before, a stop through the hub's API, the admin page or the idle culler was recorded as "server exited":
the local spawner's stop() polls the process, and the poll released the lease first. Here one real hub:
a student stops her own server, an admin stops another's, a script with the admin service token stops a
third, a fourth server's process is killed, and the idle culler stops a fifth.
"""

from __future__ import annotations

import html
import os
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.conftest import wait_until
from workbench_spawner.ledger import reasons

pytestmark = pytest.mark.integration

CULL_AFTER = 30  # the culler looks every 15 s


def test_each_way_a_server_ends_is_recorded_with_its_reason(running_hub):
    # The idle culler off here: on a loaded host a server slow to start is idle by the time it is ready,
    # and the culler could stop it before the stop under test (the culler has its own hub below).
    hub = running_hub({"WORKBENCH_SIMULATED_GPUS": "4"})
    hub.create_users("ann", "ben", "cat", "dan", "admin")  # admin: WORKBENCH_ADMIN_USERS' default
    ann_token = hub.user_token("ann")
    r = hub.api("POST", "/users/admin/tokens", json={"note": "tests", "expires_in": 3600, "scopes": ["admin:servers"]})
    assert r.status_code == 201, r.text
    prof_token = r.json()["token"]

    def as_token(token: str, method: str, path: str) -> requests.Response:
        return requests.request(
            method, f"{hub.url}/hub/api{path}", headers={"Authorization": f"token {token}"}, timeout=30
        )

    def stop_when_ready(user: str) -> None:
        hub.wait_ready(user, timeout=180)
        if user == "ann":
            r = as_token(ann_token, "DELETE", "/users/ann/server")  # the student herself
        elif user == "ben":
            r = as_token(prof_token, "DELETE", "/users/ben/server")  # an admin
        elif user == "cat":
            r = hub.api("DELETE", "/users/cat/server")  # a script with WORKBENCH_ADMIN_TOKEN (a service)
        else:
            pid = next(p for p in hub.server_pids() if os.readlink(f"/proc/{p}/cwd").endswith("/dan"))
            os.kill(pid, signal.SIGKILL)  # the server dies on its own
            return
        assert r.status_code in (202, 204), r.text

    with ThreadPoolExecutor(4) as pool:
        for r in pool.map(lambda u: hub.spawn(u, gpus=1), ["ann", "ben", "cat", "dan"]):
            assert r.status_code in (201, 202), r.text
        list(pool.map(stop_when_ready, ["ann", "ben", "cat", "dan"]))
    for user in ("ann", "ben", "cat", "dan"):
        hub.wait_stopped(user, timeout=120)
    wait_until(lambda: len(hub.usage_reasons()) == 4, 30, "four ledger rows", hub.log)
    # dan's process is the hub's child: its poll reads the exit code (and so does the reconciler, should it
    # look first, leaving the process for the poll to reap).
    killed = "killed by SIGKILL, exit code -9"
    assert hub.usage_reasons() == {
        "ann": [reasons.STOPPED_BY_USER],
        "ben": [f"{reasons.STOPPED_BY_ADMIN}: admin"],
        "cat": [f"{reasons.STOPPED_BY_SERVICE}: workbench-admin"],
        "dan": [f"{reasons.SERVER_EXITED}: {killed}"],
    }
    # Each student reads why on the spawn page (and the home page) until the next start.
    said = {
        "ann": "You stopped this server.",
        "ben": "An admin (admin) stopped this server.",
        "cat": "The hub service workbench-admin stopped this server.",
        "dan": f"This server exited on its own ({killed}).",
    }
    assert {user: hub.stop_box(user) for user in said} == said
    pages = hub.admin_pages()
    for user, sentence in said.items():
        r = pages.get(f"{hub.url}/hub/spawn/{user}", timeout=30)
        assert r.status_code == 200, (user, r.text[-2000:])
        assert sentence in html.unescape(r.text), (user, r.text[-2000:])
    # A new start has read it: the box is gone.
    assert hub.spawn("ann", gpus=1).status_code in (201, 202)
    hub.wait_ready("ann", timeout=180)
    assert hub.stop_box("ann") is None


def test_a_server_the_idle_culler_stops_is_recorded_as_culled(running_hub):
    hub = running_hub({"WORKBENCH_SIMULATED_GPUS": "1", "WORKBENCH_CULL_IDLE_SECONDS": str(CULL_AFTER)})
    hub.create_users("eve")
    assert hub.spawn("eve", gpus=1).status_code in (201, 202)
    hub.wait_ready("eve", timeout=180)
    hub.wait_stopped("eve", timeout=3 * CULL_AFTER + 30)
    wait_until(lambda: hub.usage_reasons(), 30, "the ledger row", hub.log)
    assert hub.usage_reasons() == {"eve": [f"{reasons.STOPPED_BY_CULLER}: 30 seconds"]}
    assert hub.stop_box("eve") == "The hub's idle culler stopped this server after 30 seconds without activity."


def test_a_killed_server_the_hub_re_attached_to_is_not_given_an_exit_code(running_hub):
    """The hub restarts (Ctrl-C, start again) and re-attaches to eli's server: it is no longer the process's
    parent, and no exit code can be read when the process is killed. JupyterHub's poll answers 0 for it, which
    was told as "exit code 0". fay's server, started by the restarted hub, still gets its signal told."""
    # JupyterHub's poll every 3 s, so that it (not only the reconciler's pass) sees eli's end.
    hub = running_hub({"WORKBENCH_SIMULATED_GPUS": "2"}, ["--Spawner.poll_interval=3"])
    hub.create_users("eli", "fay")
    assert hub.spawn("eli", gpus=1).status_code in (201, 202)
    eli = int(hub.wait_ready("eli", timeout=180)["state"]["pid"])
    hub.stop()
    hub.start()
    assert int(hub.wait_ready("eli", timeout=60)["state"]["pid"]) == eli, "eli's server was not re-attached"
    assert hub.spawn("fay", gpus=1).status_code in (201, 202)
    fay = int(hub.wait_ready("fay", timeout=180)["state"]["pid"])
    assert sorted(hub.leases()) == ["eli", "fay"]

    for pid in (eli, fay):
        os.kill(pid, signal.SIGKILL)
    for user in ("eli", "fay"):
        hub.wait_stopped(user, timeout=120)
    wait_until(lambda: len(hub.usage_reasons()) == 2, 60, "two ledger rows", hub.log)
    assert hub.usage_reasons() == {
        "eli": [f"{reasons.SERVER_EXITED}: exit code unknown"],
        "fay": [f"{reasons.SERVER_EXITED}: killed by SIGKILL, exit code -9"],
    }
    assert hub.leases() == {}
    said = {
        "eli": "This server's process ended. The hub re-attached to it after a restart, so its exit code is unknown.",
        "fay": "This server exited on its own (killed by SIGKILL, exit code -9).",
    }
    assert {user: hub.stop_box(user) for user in said} == said
    pages = hub.admin_pages()
    for user, sentence in said.items():
        r = pages.get(f"{hub.url}/hub/spawn/{user}", timeout=30)
        assert r.status_code == 200, (user, r.text[-2000:])
        page = html.unescape(r.text)
        assert sentence in page, (user, r.text[-2000:])
        assert "exit code 0" not in page


def test_a_hub_shut_down_through_its_api_tells_who_asked(running_hub):
    """``POST /hub/api/shutdown`` with ``servers: true`` stops every server after its request: each student
    reads which admin shut the hub down, not only that the hub stopped (JupyterHub's clean-up has no request)."""
    hub = running_hub({"WORKBENCH_SIMULATED_GPUS": "2"})
    hub.create_users("gus", "hal", "admin")  # admin: WORKBENCH_ADMIN_USERS' default
    for user in ("gus", "hal"):
        assert hub.spawn(user, gpus=1).status_code in (201, 202)
    for user in ("gus", "hal"):
        hub.wait_ready(user, timeout=180)
    r = hub.api("POST", "/users/admin/tokens", json={"note": "tests", "expires_in": 3600, "scopes": ["shutdown"]})
    assert r.status_code == 201, r.text
    r = requests.post(
        f"{hub.url}/hub/api/shutdown",
        headers={"Authorization": f"token {r.json()['token']}"},
        json={"servers": True},
        timeout=30,
    )
    assert r.status_code == 202, r.text
    assert hub.proc is not None
    hub.proc.wait(90)
    hub.proc = None
    assert hub.server_pids() == [], "the shutdown left a server running"
    assert hub.leases() == {}
    asked = "An admin (admin) shut the hub down and stopped its servers."
    assert hub.usage_reasons() == {
        user: [f"{reasons.STOPPED_BY_ADMIN}: admin, hub shutdown"] for user in ("gus", "hal")
    }
    assert {user: hub.stop_box(user) for user in ("gus", "hal")} == {"gus": asked, "hal": asked}
    # Started again, the hub shows it on each student's spawn page.
    hub.start()
    pages = hub.admin_pages()
    for user in ("gus", "hal"):
        r = pages.get(f"{hub.url}/hub/spawn/{user}", timeout=30)
        assert r.status_code == 200, (user, r.text[-2000:])
        assert asked in html.unescape(r.text), (user, r.text[-2000:])
