"""Idle reclaim of MIG slices by their DCGM reading: a real dcgm-exporter stand-in (an HTTP server on
127.0.0.1 serving exporter text) read by the service's real fleet, source chooser and reclaim pass, against a
real GPU database, a fake hub API and a test clock (as test_idle_reclaim.py). A slice at 0 % is warned, then
stopped; one at 80 % is left alone; one without a series is never touched, and the fleet page says why."""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.unit.test_idle_reclaim import Clock, FakeDelivery, FakeHub, passes
from workbench_devices import discover_devices
from workbench_hub.service.dcgm import DcgmReadings
from workbench_hub.service.fleet import Fleet
from workbench_hub.service.gpu_reclaim import Reclaimer
from workbench_hub.service.utilization import HostReadings, ServerMonitorReadings, SourceChooser
from workbench_spawner.ledger.notices import NoticeBook
from workbench_spawner.ledger.store import AllocationStore
from workbench_spawner.policy.settings import PolicySettings
from workbench_spawner.rules.quota import Quota

NODE = "node-1"
PARENT = "GPU-sim-00-h200-141gb"
IDLE, BUSY, UNSEEN, WHOLE = (f"MIG-sim-00-h200-141gb-{i}-1g.18gb" for i in range(4))
FREE = "MIG-sim-00-h200-141gb-4-1g.18gb"


def exporter_text(ratios: dict[int, str]) -> str:
    """dcgm-exporter's answer for GPU instances (GPU_I_ID) of the simulated H200, as it labels them."""
    lines = [
        "# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active.",
        "# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge",
    ]
    for gi, ratio in ratios.items():
        lines.append(
            f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu="0",UUID="{PARENT}",pci_bus_id="00000000:18:00.0",device="nvidia0",'
            f'modelName="NVIDIA H200",GPU_I_PROFILE="1g.18gb",GPU_I_ID="{gi}",Hostname="{NODE}",'
            f'DCGM_FI_DRIVER_VERSION="550.90.07"}} {ratio}'
        )
    return "\n".join(lines) + "\n"


class Handler(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(type(self).body)

    def log_message(self, *args):
        pass


@pytest.fixture
def exporter():
    handler = type("Exporter", (Handler,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.serve = lambda ratios: setattr(handler, "body", exporter_text(ratios).encode())
    yield server
    server.shutdown()
    server.server_close()


def make_world(tmp_path, urls: tuple[str, ...]):
    store = AllocationStore(f"sqlite:///{tmp_path / 'wb.sqlite'}")
    settings = PolicySettings(
        store.url,
        discover_devices("1xH200-141GB:mig=7x1g.18gb"),
        node=NODE,
        default_quota=Quota(2),
        gpu_idle_minutes=30,
        gpu_idle_threshold=5,
        gpu_idle_warn_minutes=10,
        dcgm_exporter_urls=urls,
    )
    fleet = Fleet(store, settings=settings)
    fleet.dcgm.cache_seconds = 0  # the test clock moves minutes between passes that run milliseconds apart
    hub, clock = FakeHub(), Clock()
    # As the service makes it (make_reclaimer): the host's readings, the servers' monitors, and the exporters.
    chooser = SourceChooser(HostReadings(fleet), ServerMonitorReadings(None), NODE, dcgm=DcgmReadings(fleet))
    return store, fleet, hub, clock, Reclaimer(fleet, hub, chooser, FakeDelivery(), clock=clock, interval=60)


def hold(store, hub, user: str, uuid: str) -> None:
    store.allocate(user, "", 1, [uuid], node=NODE)
    hub.add(user, "")


def rows(fleet) -> dict[str, dict]:
    return {g["uuid"]: g for g in fleet.gpus()}


async def test_a_slice_idle_by_dcgm_is_reclaimed_a_busy_one_kept_one_without_a_series_never_touched(
    tmp_path, exporter, caplog
):
    caplog.set_level(logging.INFO, logger="workbench.service")
    store, fleet, hub, clock, reclaimer = make_world(tmp_path, (exporter.url,))
    exporter.serve({1: "0.000000", 2: "0.800000"})  # GPU instance 3 (carol's slice) has no series
    hold(store, hub, "alice", IDLE)
    hold(store, hub, "bob", BUSY)
    hold(store, hub, "carol", UNSEEN)

    reports = await passes(reclaimer, clock, range(0, 20))
    assert not any(r.warned or r.stopped for r in reports)
    assert all(r.unknown == [("carol", "")] for r in reports), "no series: no reading, every pass"
    page = rows(fleet)
    assert (page[IDLE]["utilization_percent"], page[IDLE]["reading_source"]) == (0.0, "dcgm")
    assert (page[BUSY]["utilization_percent"], page[BUSY]["reading_source"]) == (80.0, "dcgm")
    assert page[IDLE]["idle_seconds"] is not None
    assert page[BUSY]["idle_seconds"] is None
    assert page[UNSEEN]["utilization_percent"] is None
    assert page[UNSEEN]["idle_seconds"] is None
    assert page[UNSEEN]["no_reading_reason"] == "no series for this slice"
    assert page[IDLE]["no_reading_reason"] is None, "free: no rule needed"
    assert page[FREE]["no_reading_reason"] is None, "free: no rule needed"

    [r20] = await passes(reclaimer, clock, [20])
    assert r20.warned == [("alice", "")]
    reports = await passes(reclaimer, clock, range(21, 30))
    assert not any(r.stopped for r in reports)
    [r30] = await passes(reclaimer, clock, [30])
    assert r30.stopped == [("alice", "")]
    assert hub.stopped == [("alice", "")]
    assert NoticeBook(store).last_done("alice").reason == "reclaimed: GPU idle 30 min"
    reports = await passes(reclaimer, clock, range(31, 90))
    assert hub.stopped == [("alice", "")], "80 % and no series: neither is ever stopped"
    assert not any(("bob", "") in r.warned or ("carol", "") in r.warned for r in reports)
    assert NoticeBook(store).pending("bob") == []
    assert NoticeBook(store).pending("carol") == []
    said = [m for m in caplog.messages if m.startswith("No DCGM reading")]
    assert said == [f"No DCGM reading for MIG slice {UNSEEN} of carol/default: no series for this slice"], "once"
    assert sum("leaves carol/default alone" in m for m in caplog.messages) == 1


async def test_an_exporter_that_stops_answering_is_no_reading_not_idle(tmp_path, exporter, caplog):
    store, fleet, hub, clock, reclaimer = make_world(tmp_path, (exporter.url,))
    exporter.serve({1: "0.0"})
    hold(store, hub, "alice", IDLE)
    await passes(reclaimer, clock, range(0, 21))
    assert NoticeBook(store).pending("alice"), "warned at 20 idle minutes"
    exporter.shutdown()
    exporter.server_close()
    reports = await passes(reclaimer, clock, range(21, 60))
    assert all(r.unknown == [("alice", "")] for r in reports)
    assert not hub.stopped
    assert NoticeBook(store).pending("alice") == [], "the warning is withdrawn: nobody knows she is idle"
    assert rows(fleet)[IDLE]["no_reading_reason"] == "exporter unreachable"
    assert sum("unreachable" in m and exporter.url in m for m in caplog.messages) == 1, "logged once"


async def test_without_an_exporter_a_slice_has_no_idle_rule_and_the_page_says_so(tmp_path):
    store, fleet, hub, clock, reclaimer = make_world(tmp_path, ())
    hold(store, hub, "alice", IDLE)
    reports = await passes(reclaimer, clock, range(0, 45))
    assert all(r.unknown == [("alice", "")] for r in reports)
    assert not hub.stopped
    row = rows(fleet)[IDLE]
    assert row["utilization_percent"] is None
    assert row["reading_source"] != "dcgm"
    assert row["no_reading_reason"] == "no exporter configured"
    assert reclaimer.chooser.for_lease(store.lease_of("alice", "")).name == "host", "NVML's answer: none"


async def test_a_whole_gpu_keeps_its_own_reading_beside_an_exporter(tmp_path, exporter):
    """Whole GPUs are read as before (NVML or simulated, here a scripted 0 %), slices from DCGM."""
    store = AllocationStore(f"sqlite:///{tmp_path / 'wb.sqlite'}")
    script = tmp_path / "utilization.json"
    script.write_text('{"GPU-sim-01-h100-80gb": 0}')
    settings = PolicySettings(
        store.url,
        discover_devices("1xH200-141GB:mig=7x1g.18gb,1xH100-80GB"),
        node=NODE,
        default_quota=Quota(2),
        gpu_idle_minutes=30,
        dcgm_exporter_urls=(exporter.url,),
        simulated_utilization=str(script),
    )
    fleet = Fleet(store, settings=settings)
    exporter.serve({})
    chooser = SourceChooser(HostReadings(fleet), ServerMonitorReadings(None), NODE, dcgm=DcgmReadings(fleet))
    store.allocate("dora", "", 1, ["GPU-sim-01-h100-80gb"], node=NODE)
    assert chooser.for_lease(store.lease_of("dora", "")).name == "host"
    row = rows(fleet)["GPU-sim-01-h100-80gb"]
    assert (row["utilization_percent"], row["reading_source"], row["no_reading_reason"]) == (0.0, "simulated", None)
