"""Users' servers on their own origins, through a real hub (local backend, one simulated GPU) started with
``WORKBENCH_SUBDOMAIN_HOST=http://localhost:PORT``: the proxy routes by host name.

1. bob's server is at ``http://bob.localhost:PORT/user/bob/``: the proxy hands it a request for that host, and
   hands the same path on the hub's host (or alice's) to the hub, not to bob's server;
2. the workbench service still reaches bob's GPU monitor through the proxy: an idle warning it delivers shows in
   bob's server;
3. the workbench service answers on the hub's host and on the names this machine uses (``127.0.0.1`` for the CLI),
   not on a user's host; the banner names the hub's own address.

Python's resolver may not resolve ``*.localhost``: every request goes to 127.0.0.1 with the host in ``Host``.
What a browser does with this (the viewer's cookies, the hub's API from a student's page):
tests/browser/test_subdomains_browser.py.
"""

from __future__ import annotations

import sqlite3

import pytest
import requests

from tests.conftest import free_port, wait_until, write_utilization
from tests.service.conftest import WorkbenchHub, shut_down

pytestmark = pytest.mark.integration

GPU = "GPU-sim-00-h100-80gb"
IDLE_MINUTES = 0.25  # 15 s; the warning comes half of it (7.5 s) before the stop


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    base = tmp_path_factory.mktemp("subdomains")
    utilization = base / "utilization.json"
    write_utilization(utilization, {"*": 80})
    local = base / "local_config.py"
    local.write_text("c.Spawner.http_timeout = 180\n")  # a busy 2-core CI host starts servers slowly
    (base / "hub").mkdir()
    hub = WorkbenchHub(
        base / "hub",
        {
            "WORKBENCH_LOCAL_CONFIG": str(local),
            "WORKBENCH_SIMULATED_GPUS": "1",
            "WORKBENCH_SERVICE_PORT": str(free_port()),
            "WORKBENCH_SIMULATED_UTILIZATION": str(utilization),
            "WORKBENCH_GPU_IDLE_MINUTES": str(IDLE_MINUTES),
            "WORKBENCH_GPU_IDLE_CHECK_SECONDS": "1",
        },
        [],
    )
    hub.env["WORKBENCH_SUBDOMAIN_HOST"] = f"http://localhost:{hub.port}"
    hub.utilization = utilization
    hub.start()
    hub.wait_service()
    hub.create_users("alice", "bob")
    yield hub
    shut_down(hub)


def on_host(hub, host: str, path: str, token: str, method: str = "GET", **kwargs) -> requests.Response:
    """``path`` through the hub's proxy as a browser on ``host`` (a name under localhost) would ask for it."""
    return requests.request(
        method,
        f"{hub.url}{path}",
        headers={"Host": f"{host}:{hub.port}", "Authorization": f"token {token}"},
        timeout=30,
        allow_redirects=False,
        **kwargs,
    )


def test_a_students_server_is_reached_on_its_own_host_only(hub):
    bob = hub.user_token("bob")
    assert hub.spawn("bob", gpus=0).status_code in (201, 202)
    server = hub.wait_ready("bob", timeout=180)
    assert server["url"] == f"http://bob.localhost:{hub.port}/user/bob/"

    r = on_host(hub, "bob.localhost", "/user/bob/api/status", bob)
    assert r.status_code == 200, r.text
    assert "started" in r.json()  # jupyter_server's own status: bob's server answered
    assert r.headers.get("Server", "").lower().startswith("tornado")

    # The same path on the hub's host, or on alice's, is the hub's: it sends the browser on to bob's host.
    for host in ("localhost", "alice.localhost"):
        r = on_host(hub, host, "/user/bob/api/status", bob)
        assert r.status_code == 302, (host, r.status_code, r.text[:300])
        assert r.headers["Location"].startswith(f"http://localhost:{hub.port}/hub/user/bob/api/status"), r.headers
    # Bob's host leads to bob's server only: alice's path there is the hub's too.
    r = on_host(hub, "bob.localhost", "/user/alice/api/status", bob)
    assert r.status_code == 302
    assert r.headers["Location"].startswith(f"http://localhost:{hub.port}/hub/user/alice/")

    assert hub.api("DELETE", "/users/bob/server").status_code in (202, 204)
    hub.wait_stopped("bob")


def test_the_service_still_reaches_the_students_gpu_monitor(hub):
    """Idle reclaim delivers its warning to bob's server through the proxy (PUT api/gpu/notices): with host routing
    the service names bob's host in the request (service/user_servers.py), or the proxy would hand it to the hub."""
    bob = hub.user_token("bob")
    write_utilization(hub.utilization, {"*": 80})
    assert hub.spawn("bob", gpus=1).status_code in (201, 202)
    hub.wait_ready("bob", timeout=180)
    assert hub.leases() == {"bob": [GPU]}
    write_utilization(hub.utilization, {"*": 0})

    def warning():
        r = on_host(hub, "bob.localhost", "/user/bob/api/gpu/notices", bob)
        notices = r.json().get("notices") if r.status_code == 200 else None
        return notices[0] if notices else None

    notice = wait_until(warning, 30, "no idle warning reached bob's server on bob.localhost", log=hub.log)
    assert notice["kind"] == "idle"
    assert notice["message"].startswith("Your server will be stopped at ")
    with sqlite3.connect(hub.data_dir / "workbench.sqlite") as db:
        delivered = db.execute("SELECT state FROM workbench_notices WHERE user='bob' AND kind='idle'").fetchall()
    assert delivered
    assert all(state != "failed" for (state,) in delivered), delivered
    hub.wait_stopped("bob", timeout=40)
    write_utilization(hub.utilization, {"*": 80})


def test_the_service_answers_on_the_hubs_host_and_this_machines_names_not_a_users(hub):
    for host in (f"localhost:{hub.port}", f"127.0.0.1:{hub.port}"):
        r = hub.service("GET", "api/usage", headers={"Host": host})
        assert r.status_code == 200, (host, r.status_code, r.text[:300])
        assert "users" in r.json()
    r = requests.get(
        f"{hub.url}/services/workbench/api/usage",
        headers={"Host": f"bob.localhost:{hub.port}", "Authorization": f"token {hub.token}"},
        timeout=30,
        allow_redirects=False,
    )
    assert r.status_code in (302, 404), r.status_code
    assert "users" not in r.text
    # The CLI on this machine (WORKBENCH_URL=http://127.0.0.1:PORT) reaches the service through the alias route.
    done = hub.cli("usage")
    assert done.returncode == 0, done.stderr
    # Where the banner sends the first admin: the hub's own host, where the login cookie belongs.
    assert f"GPU Workbench (local backend) at http://localhost:{hub.port}/" in hub.log()
