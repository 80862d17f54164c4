"""The hub side reading a real user server: utilization from its GPU monitor, and notices put on it.

This is how idle reclaim reads nodes whose GPUs the hub cannot see (``ServerMonitorReadings``) and
how every notice reaches JupyterLab (``NoticeDelivery``), against a real ``jupyter server`` with
the monitor extension (no hub: the server's own token stands in for the service's). The same reads
through a real hub and its proxy: ``tests/service/test_idle_reclaim_hub.py``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.conftest import free_port
from workbench_hub.service.notice_delivery import NoticeDelivery
from workbench_hub.service.user_servers import ServerUnreachableError, UserServers
from workbench_hub.service.utilization import ServerMonitorReadings
from workbench_spawner.ledger.notices import NoticeBook
from workbench_spawner.ledger.store import AllocationStore, Lease

OWN = "GPU-sim-02-h100-80gb"  # pinned_server holds the third of four simulated GPUs
NOW = datetime.now(UTC)


def lease(*uuids: str) -> Lease:
    return Lease("alice", "", tuple(uuids), NOW, node="slurm-node-3")


async def test_the_server_s_monitor_gives_the_utilization_of_its_gpus(pinned_server):
    readings = ServerMonitorReadings(UserServers(pinned_server.url, pinned_server.token))
    got = await readings.read(lease(OWN, "GPU-sim-00-h100-80gb"), "/")
    assert isinstance(got[OWN], float)
    assert 0 <= got[OWN] <= 100
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
    with pytest.raises(ServerUnreachableError):
        await UserServers(pinned_server.url, pinned_server.token).metrics("/no/such/server")


async def test_pending_notices_are_put_on_the_server_and_withdrawn(pinned_server, tmp_path):
    store = AllocationStore(f"sqlite:///{tmp_path / 'wb.sqlite'}")
    book = NoticeBook(store)
    delivery = NoticeDelivery(book, UserServers(pinned_server.url, pinned_server.token))
    running = {("alice", ""): "/"}
    book.warn(
        "alice",
        "",
        kind="preempt",
        message="Your server will be stopped at 10:00: reserved.",
        hint="Save your work.",
        stop_at=datetime.now(UTC) + timedelta(minutes=5),
    )
    assert await delivery.deliver(running) == [("alice", "")]
    [shown] = pinned_server.get("api/gpu/notices").json()["notices"]
    assert shown["kind"] == "preempt"
    assert 290 < shown["seconds_left"] <= 300
    assert await delivery.deliver(running) == [], "unchanged: not sent again before resend_seconds"
    book.clear("alice", "", kind="preempt")
    assert await delivery.deliver(running) == [("alice", "")]
    assert pinned_server.get("api/gpu/notices").json()["notices"] == []
    assert await delivery.deliver(running) == [], "nothing to withdraw any more"
    store.dispose()
