"""The hub side reading a real user server: utilization from its GPU monitor, and notices put on it.

This is how idle reclaim reads nodes whose GPUs the hub cannot see (``ServerMonitorReadings``) and
how every notice reaches JupyterLab (``NoticeDelivery``): first against a real ``jupyter server``
with the monitor extension (no hub: the server's own token stands in for the service's), then
through a real hub, where the workbench service reads a user server through the proxy with its own
token and reclaims it, or leaves it alone, by what it reads.
"""

from __future__ import annotations

import json
import os
import sqlite3
from datetime import datetime, timedelta, timezone

import pytest

from tests.conftest import free_port, wait_until
from workbench_hub.service.notice_delivery import NoticeDelivery
from workbench_hub.service.user_servers import ServerUnreachable, UserServers
from workbench_hub.service.utilization import ServerMonitorReadings
from workbench_spawner.notices import NoticeBook
from workbench_spawner.store import AllocationStore, Lease

OWN = "GPU-sim-02-h100-80gb"  # pinned_server holds the third of four simulated GPUs
NOW = datetime.now(timezone.utc)


def lease(*uuids: str) -> Lease:
    return Lease("alice", "", tuple(uuids), NOW, node="slurm-node-3")


async def test_the_server_s_monitor_gives_the_utilization_of_its_gpus(pinned_server):
    readings = ServerMonitorReadings(UserServers(pinned_server.url, pinned_server.token))
    got = await readings.read(lease(OWN, "GPU-sim-00-h100-80gb"), "/")
    assert isinstance(got[OWN], float) and 0 <= got[OWN] <= 100
    assert got["GPU-sim-00-h100-80gb"] is None, "a GPU the server does not see has no reading"
    assert ("alice", "") not in readings.last_error


async def test_an_unreachable_or_refusing_server_gives_no_readings_never_zero(pinned_server):
    down = ServerMonitorReadings(UserServers(f"http://127.0.0.1:{free_port()}", "t", timeout=3))
    assert await down.read(lease(OWN), "/") == {OWN: None}
    assert "api/gpu/metrics" in down.last_error[("alice", "")]
    refused = ServerMonitorReadings(UserServers(pinned_server.url, "wrong-token"))
    assert await refused.read(lease(OWN), "/") == {OWN: None}
    assert "403" in refused.last_error[("alice", "")]
    assert await refused.read(lease(OWN), None) == {OWN: None}
    with pytest.raises(ServerUnreachable):
        await UserServers(pinned_server.url, pinned_server.token).metrics("/no/such/server")


async def test_pending_notices_are_put_on_the_server_and_withdrawn(pinned_server, tmp_path):
    store = AllocationStore(f"sqlite:///{tmp_path / 'wb.sqlite'}")
    book = NoticeBook(store)
    delivery = NoticeDelivery(book, UserServers(pinned_server.url, pinned_server.token))
    running = {("alice", ""): "/"}
    book.warn("alice", "", kind="preempt", message="Your server will be stopped at 10:00: reserved.",
              hint="Save your work.", stop_at=datetime.now(timezone.utc) + timedelta(minutes=5))
    assert await delivery.deliver(running) == [("alice", "")]
    [shown] = pinned_server.get("api/gpu/notices").json()["notices"]
    assert shown["kind"] == "preempt" and 290 < shown["seconds_left"] <= 300
    assert await delivery.deliver(running) == [], "unchanged: not sent again before resend_seconds"
    book.clear("alice", "", kind="preempt")
    assert await delivery.deliver(running) == [("alice", "")]
    assert pinned_server.get("api/gpu/notices").json()["notices"] == []
    assert await delivery.deliver(running) == [], "nothing to withdraw any more"
    store.dispose()


# -- through a real hub ------------------------------------------------------------------------

IDLE_MINUTES = 0.25  # 15 s; warned 7.5 s before the stop


def script(path, table) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(table))
    os.replace(tmp, path)


@pytest.mark.integration
def test_the_service_reads_a_server_it_cannot_see_through_the_proxy_and_reclaims_by_it(tmp_path):
    """A hub that cannot see its GPUs (a ``static_gpus`` list): the service's only readings are the user
    server's own monitor, read through the proxy with the service's token. Busy readings keep the server;
    idle ones get it warned (in the server) and stopped, the ledger says why."""
    from tests.service.conftest import shut_down, start_workbench_hub

    utilization = tmp_path / "utilization.json"
    script(utilization, {"*": 80})
    static = [{"uuid": "GPU-sim-00-h100-80gb", "name": "NVIDIA H100 80GB HBM3", "model": "H100-80GB"}]
    local = tmp_path / "local_config.py"
    # The hub sees no GPUs (static list); only the user server pretends to have them, with scripted use.
    local.write_text(f"c.GPUSpawnerMixin.static_gpus = {static!r}\n"
                     f"c.Spawner.environment = {{'WORKBENCH_SIMULATED_GPUS': '1', "
                     f"'WORKBENCH_SIMULATED_UTILIZATION': {str(utilization)!r}}}\n"
                     "c.Spawner.http_timeout = 180\n")
    hub = start_workbench_hub(tmp_path / "hub", {
        "WORKBENCH_SIMULATED_GPUS": "", "WORKBENCH_LOCAL_CONFIG": str(local),
        "WORKBENCH_GPU_IDLE_MINUTES": str(IDLE_MINUTES), "WORKBENCH_GPU_IDLE_CHECK_SECONDS": "1"})
    try:
        hub.create_users("alice")
        assert hub.service("GET", "api/gpus").json()["source"] == "static"
        assert hub.spawn("alice", gpus=1).status_code in (201, 202)
        hub.wait_ready("alice")

        def busy_reading():
            gpus = hub.service("GET", "api/idle").json()["gpus"]
            return gpus and gpus[0]["utilization_percent"] == 80 and gpus[0]

        gpu = wait_until(busy_reading, 30, "the service never read the server's monitor", log=hub.log)
        assert gpu["reading_source"] == "server" and gpu["idle_seconds"] is None, "busy: no idle clock"
        script(utilization, {"*": 0})

        token = hub.user_token("alice")
        [notice] = wait_until(lambda: _notices(hub, token), 30, "no idle warning from the server's readings",
                              log=hub.log)
        assert notice["kind"] == "idle"
        hub.wait_stopped("alice", timeout=40)
        with sqlite3.connect(hub.data_dir / "workbench.sqlite") as db:
            reasons = db.execute("SELECT reason FROM gpu_usage WHERE user = 'alice'").fetchall()
        assert reasons == [("reclaimed: GPU idle 15 s",)]
    finally:
        shut_down(hub)


def _notices(hub, token: str) -> list[dict]:
    """The notices the service put on alice's server (what her JupyterLab shows)."""
    import requests

    r = requests.get(f"{hub.url}/user/alice/api/gpu/notices", headers={"Authorization": f"token {token}"},
                     timeout=10)
    return r.json()["notices"] if r.status_code == 200 else []
