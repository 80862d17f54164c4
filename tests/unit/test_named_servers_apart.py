"""Two servers of one student are two servers to every rule of the hub: each is judged, warned, stopped and
counted on its own, keyed by (user, server), never by the user alone.

One test per rule, each with a GPU server ``big`` and a second server of the same student that must come out
differently: idle reclaim (``big`` idle, ``small`` busy: only ``big`` is reclaimed), session limits (recorded
per server: only the one past its limit stops), drains (only the server on the drained GPU is warned and
stopped), reservations' preemption (only the newer server goes), the save before a stop (only the stopped
server's tabs are asked, only its stop box is written), the notices a start forgets, ``api/allocations`` and
``api/usage`` (GPU-hours and GPUs per server, adding up to the student's). SSH per server is in
``tests/ssh/test_ssh_units.py`` (``test_a_named_servers_page_gives_the_entry_for_that_server``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from tornado.httpclient import AsyncHTTPClient

from tests.service.openapi_check import check
from tests.service.test_stopping import FakeHub as StoppingHub
from tests.unit.test_idle_reclaim import GPU, NODE, passes
from tests.unit.test_idle_reclaim import world as world  # a fixture, for pytest to find
from tests.unit.test_quota_service import PREFIX, service_document
from tests.unit.test_quota_service import live_service as live_service  # a fixture, for pytest to find
from workbench_devices import GPUDevice
from workbench_hub.service.drain_stops import DrainStops, warn_holders
from workbench_hub.service.fleet import Fleet, server_usage
from workbench_hub.service.session_limits import stop_overlong_servers
from workbench_hub.service.stopping import Stopper
from workbench_spawner.ledger import reasons
from workbench_spawner.ledger.drain_book import DrainBook
from workbench_spawner.ledger.gpu_hours import HELD_NOW, gpu_hours_by_user, gpu_hours_split
from workbench_spawner.ledger.notices import NoticeBook
from workbench_spawner.ledger.quota_book import QuotaBook
from workbench_spawner.ledger.store import AllocationStore, UsageRow, utcnow
from workbench_spawner.placement.host import holdings
from workbench_spawner.rules.reservations import Reservation, preemption_plan
from workbench_spawner.rules.window import parse_window

OTHER = "GPU-sim-01-h100-80gb"


# -- idle reclaim ------------------------------------------------------------------------------------------


async def test_only_the_idle_server_of_two_is_warned_and_reclaimed(world):
    store, _fleet, hub, source, clock, reclaimer, _delivery = world
    store.allocate("alice", "big", 1, [GPU], node=NODE)
    store.allocate("alice", "small", 1, [OTHER], node=NODE)
    hub.add("alice", "big")
    hub.add("alice", "small")
    source.values.update({GPU: 0.0, OTHER: 90.0})  # big idles, small trains
    reports = await passes(reclaimer, clock, range(0, 31))
    assert next(r.warned for r in reports if r.warned) == [("alice", "big")]
    assert reports[-1].stopped == [("alice", "big")]
    assert hub.stopped == [("alice", "big")], "small keeps running"
    assert NoticeBook(store).last_done("alice", "big").reason == "reclaimed: GPU idle 30 min"
    assert NoticeBook(store).last_done("alice", "small") is None
    assert NoticeBook(store).pending("alice", "small") == []


# -- session limits ----------------------------------------------------------------------------------------


def started(ago: timedelta) -> dict:
    when = (datetime.now(UTC) - ago).isoformat().replace("+00:00", "Z")
    return {"ready": True, "pending": None, "started": when, "url": ""}


async def test_a_session_limit_is_recorded_and_enforced_per_server(store):
    book = QuotaBook(store)
    book.record_session_limit("alice", "big", 1.0)  # big started under a quota of 1 hour
    book.record_session_limit("alice", "small", 4.0)  # small under a later one of 4 hours
    assert book.session_limits() == {("alice", "big"): 1.0, ("alice", "small"): 4.0}
    hub = StoppingHub(
        [{"name": "alice", "servers": {"big": started(timedelta(hours=2)), "small": started(timedelta(hours=2))}}]
    )
    stopper = Stopper(NoticeBook(store), hub, None, save_wait=0)
    assert await stop_overlong_servers(book, hub, stopper) == [("alice", "big")]
    assert hub.stopped == [("alice", "big")]
    assert "session limit of 1 hour reached" in NoticeBook(store).last_done("alice", "big").message
    assert NoticeBook(store).last_done("alice", "small") is None


# -- drains --------------------------------------------------------------------------------------------------


async def test_a_drain_warns_and_stops_only_the_server_on_the_drained_gpu(store):
    devices = [GPUDevice(f"GPU-{i}", i, "H100", 80 * 1024**3, model="H100-80GB") for i in range(2)]
    store.allocate("alice", "big", 1, ["GPU-0"])
    store.allocate("alice", "small", 1, ["GPU-1"])
    DrainBook(store).drain(["GPU-0"], "new MIG layout", by="admin")
    now = utcnow()
    warned = warn_holders(store, devices, ["GPU-0"], 10, UTC, now=now)
    assert [(n.user, n.server) for n in warned] == [("alice", "big")]
    hub = StoppingHub()
    stopper = Stopper(NoticeBook(store, clock=lambda: now + timedelta(minutes=11)), hub, None, save_wait=0)
    fleet = SimpleNamespace(
        store=store, inventory=SimpleNamespace(devices=devices), settings=SimpleNamespace(time_zone="UTC")
    )
    drains = DrainStops(fleet, hub, stopper, clock=lambda: now + timedelta(minutes=11))
    assert (await drains.check()).stopped == [("alice", "big")]
    assert hub.stopped == [("alice", "big")]


# -- reservations' preemption --------------------------------------------------------------------------------


def test_preemption_stops_the_newer_of_two_servers_not_the_student(store):
    store.allocate("alice", "old", 1, ["GPU-0"])
    store.allocate("alice", "new", 1, ["GPU-1"])
    reservation = Reservation("ml-course", 1, parse_window("Tue 10:00-12:00"), preempt=True)
    plan = preemption_plan(reservation, holdings(store.leases()), [], {"GPU-0": "H100", "GPU-1": "H100"})
    assert [(h.user, h.server) for h in plan] == [("alice", "new")], "one GPU short: one server goes, the newest"


# -- the save before a stop ------------------------------------------------------------------------------------


class Servers:
    """The user servers' monitors as ``Stopper`` reaches them: which server was told what."""

    def __init__(self):
        self.told: list[tuple[str, list[int]]] = []

    async def put_notices(self, path, notices, sharing):
        self.told.append((path, [n["id"] for n in notices]))

    async def saves(self, path, notice_id):
        return {"done": True, "saved": 2, "failed": 0}


async def test_the_save_round_and_the_stop_box_are_the_stopped_servers_only(store):
    book = NoticeBook(store)
    other = book.warn("alice", "small", kind="session", message="small: stopped at 16:00", stop_at=utcnow())
    servers = Servers()
    stopper = Stopper(book, StoppingHub(), servers, save_wait=5, poll=0.05)
    done = await stopper.stop_for(
        "alice", "big", kind="idle", cause="idle GPU reclaimed", reason="reclaimed: GPU idle 30 min", path="/b/"
    )
    assert done.stopped
    assert "We saved 2 notebooks first." in done.message
    [(path, told)] = servers.told
    assert path == "/b/"
    assert other.id not in told, "small's notices stay with small"
    assert [n.id for n in book.pending("alice", "small")] == [other.id]
    assert book.last_done("alice", "small") is None
    # Starting big again forgets big's stop box, not small's warning.
    book.acknowledge("alice", "big")
    assert book.last_done("alice", "big") is None
    assert [n.id for n in book.pending("alice", "small")] == [other.id]


# -- api/allocations and api/usage name the server -----------------------------------------------------------


def ended(store: AllocationStore, server: str, hours: float, reason: str) -> None:
    end = utcnow() - timedelta(hours=1)
    with store.writes().begin() as session:
        session.add(
            UsageRow(
                gpu_uuid="GPU-x",
                user="ann",
                server=server,
                started=end - timedelta(hours=hours),
                ended=end,
                reason=reason,
            )
        )


def test_gpu_hours_split_by_server_add_up_to_the_students_total(store):
    ended(store, "big", 3.0, reasons.STOPPED_BY_USER)
    ended(store, "", 1.0, "reclaimed: GPU idle 30 min")
    store.allocate("ann", "big", 1, ["GPU-held"])
    now = utcnow()
    split = gpu_hours_split(store, now)["ann"]
    assert split[("big", reasons.STOPPED_BY_USER)] == pytest.approx(3.0)
    assert split[("", "reclaimed")] == pytest.approx(1.0)
    assert set(split) == {("big", reasons.STOPPED_BY_USER), ("", "reclaimed"), ("big", HELD_NOW)}
    # One read and one clock: the same seconds, summed in another order.
    assert sum(split.values()) == pytest.approx(gpu_hours_by_user(store, now)["ann"], rel=1e-12)
    usage = server_usage({"ann": split}, {"ann": {"big": 1}})["ann"]
    assert list(usage) == ["", "big"]
    assert usage[""] == {"gpu_hours_week": 1.0, "held_gpus": 0}
    assert usage["big"]["held_gpus"] == 1
    assert usage["big"]["gpu_hours_week"] == pytest.approx(3.0, abs=1e-3)


async def test_the_api_names_the_server_of_each_lease_and_splits_usage_by_server(live_service, store):
    doc = service_document()
    fleet = Fleet(store, refresh_seconds=0)
    big, small = (d.uuid for d in fleet.inventory.devices)
    store.allocate("ann", "big", 1, [big])
    store.allocate("ann", "", 1, [small])
    ended(store, "big", 2.0, reasons.STOPPED_BY_USER)
    client = AsyncHTTPClient()
    r = await client.fetch(f"{live_service}{PREFIX}api/allocations")
    check(doc, "GET", "api/allocations", r.code, r.headers["Content-Type"], r.body)
    assert sorted((a["user"], a["server"], a["gpu_uuids"][0]) for a in json.loads(r.body)["allocations"]) == [
        ("ann", "", small),
        ("ann", "big", big),
    ]
    r = await client.fetch(f"{live_service}{PREFIX}api/usage?user=ann")
    check(doc, "GET", "api/usage?user=ann", r.code, r.headers["Content-Type"], r.body)
    (ann,) = json.loads(r.body)["users"]
    assert ann["held_gpus"] == 2
    assert {name: s["held_gpus"] for name, s in ann["servers"].items()} == {"": 1, "big": 1}
    assert ann["servers"]["big"]["gpu_hours_week"] == pytest.approx(2.0, abs=1e-3)
    assert sum(s["gpu_hours_week"] for s in ann["servers"].values()) == pytest.approx(ann["gpu_hours_week"], abs=1e-3)
