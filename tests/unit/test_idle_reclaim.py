"""The reclaim pass (service/gpu_reclaim.py) against a real GPU database, a fake hub API and a test clock."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from workbench_devices import discover_devices
from workbench_hub.service.fleet import Fleet
from workbench_hub.service.gpu_reclaim import Reclaimer
from workbench_hub.service.utilization import HostReadings, ServerMonitorReadings, SourceChooser
from workbench_spawner.ledger.idle_book import IdleBook
from workbench_spawner.ledger.notices import NoticeBook
from workbench_spawner.ledger.quota_book import QuotaBook
from workbench_spawner.ledger.store import AllocationStore
from workbench_spawner.policy.settings import PolicySettings
from workbench_spawner.rules.quota import Quota

T0 = datetime(2026, 12, 8, 10, 0, tzinfo=UTC)
NODE = "node-1"
GPU = "GPU-sim-00-h100-80gb"


class Clock:
    def __init__(self):
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def at(self, minutes: float) -> None:
        self.now = T0 + timedelta(minutes=minutes)


class FakeHub:
    """The two hub API calls the pass makes; stopping marks the server as no longer ready."""

    def __init__(self):
        self.models = {}
        self.stopped = []
        self.token = "t"

    def add(self, user: str, server: str = "", groups=(), ready: bool = True):
        model = self.models.setdefault(user, {"name": user, "groups": list(groups), "servers": {}})
        model["servers"][server] = {
            "ready": ready,
            "pending": None if ready else "spawn",
            "url": f"/user/{user}/{server}",
        }

    async def users(self):
        return list(self.models.values())

    async def stop_server(self, user, server):
        self.stopped.append((user, server))
        self.models[user]["servers"][server].update(ready=False, pending="stop")


class FakeSource:
    name = "host"

    def __init__(self):
        self.values: dict[str, float | None] = {}

    async def read(self, lease, server_path):
        return {uuid: self.values.get(uuid) for uuid in lease.gpu_uuids}


class FakeDelivery:
    def __init__(self):
        self.calls = []

    async def deliver(self, running):
        self.calls.append(dict(running))
        return []


@pytest.fixture
def world(tmp_path):
    store = AllocationStore(f"sqlite:///{tmp_path / 'wb.sqlite'}")
    settings = PolicySettings(
        store.url,
        discover_devices("4"),
        node=NODE,
        default_quota=Quota(2),
        gpu_idle_minutes=30,
        gpu_idle_threshold=5,
        gpu_idle_warn_minutes=10,
    )
    fleet = Fleet(store, settings=settings)
    hub, source, clock, delivery = FakeHub(), FakeSource(), Clock(), FakeDelivery()
    chooser = SourceChooser(HostReadings(fleet), ServerMonitorReadings(None), NODE)
    chooser.register(NODE, source)
    reclaimer = Reclaimer(fleet, hub, chooser, delivery, clock=clock, interval=60)
    yield store, fleet, hub, source, clock, reclaimer, delivery
    store.dispose()


def hold(store, hub, user="alice", gpus=(GPU,), groups=()):
    store.allocate(user, "", len(gpus), list(gpus), node=NODE)
    hub.add(user, "", groups)


async def passes(reclaimer, clock, minutes):
    reports = []
    for m in minutes:
        clock.at(m)
        reports.append(await reclaimer.run_pass())
    return reports


async def test_an_idle_server_is_warned_then_stopped_and_the_ledger_says_why(world):
    store, _fleet, hub, source, clock, reclaimer, delivery = world
    hold(store, hub)
    source.values[GPU] = 0.0
    reports = await passes(reclaimer, clock, range(0, 20))  # a pass a minute, as interval=60 says
    assert not any(r.warned or r.stopped for r in reports)
    [r20] = await passes(reclaimer, clock, [20])
    assert r20.warned == [("alice", "")]
    assert not r20.stopped
    [notice] = NoticeBook(store).pending("alice")
    assert notice.kind == "idle"
    assert notice.stop_at == T0 + timedelta(minutes=30)
    assert "10:30" in notice.message
    assert "CPU-only server" in notice.hint
    reports = await passes(reclaimer, clock, range(21, 30))
    assert all(r.warned and not r.stopped for r in reports)
    assert not hub.stopped
    [r30] = await passes(reclaimer, clock, [30])
    assert r30.stopped == [("alice", "")]
    assert hub.stopped == [("alice", "")]
    assert NoticeBook(store).pending("alice") == []
    done = NoticeBook(store).last_done("alice")
    assert done.reason == "reclaimed: GPU idle 30 min"
    assert "files are kept" in done.message
    # The spawner's stop reads the announced reason into the ledger.
    lease = store.lease_of("alice", "")
    reason = NoticeBook(store).announced("alice", "", lease.since).reason
    store.release("alice", "", reason)
    assert [u.reason for u in store.usage(user="alice")] == ["reclaimed: GPU idle 30 min"]
    # Every pass delivered notices to the running servers (alice while she ran).
    assert delivery.calls[0] == {("alice", ""): "/user/alice/"}


async def test_using_the_gpu_after_the_warning_withdraws_it(world):
    store, _fleet, hub, source, clock, reclaimer, _ = world
    hold(store, hub)
    source.values[GPU] = 1.0
    await passes(reclaimer, clock, range(0, 21))
    assert NoticeBook(store).pending("alice")
    source.values[GPU] = 85.0
    [r] = await passes(reclaimer, clock, [21])
    assert r.cleared == [("alice", "")]
    assert NoticeBook(store).pending("alice") == []
    source.values[GPU] = 0.0
    reports = await passes(reclaimer, clock, range(22, 52))  # the clock starts again at 22
    assert not any(r.stopped for r in reports)
    assert reports[41 - 22].warned == []
    assert reports[42 - 22].warned
    assert (await passes(reclaimer, clock, [52]))[0].stopped == [("alice", "")]


async def test_missing_readings_leave_the_server_alone_and_withdraw_a_warning(world, caplog):
    store, _fleet, hub, source, clock, reclaimer, _ = world
    hold(store, hub)
    source.values[GPU] = 0.0
    await passes(reclaimer, clock, range(0, 21))
    assert NoticeBook(store).pending("alice")
    source.values[GPU] = None
    reports = await passes(reclaimer, clock, [21, 40, 90])
    assert all(r.unknown == [("alice", "")] for r in reports)
    assert not hub.stopped
    assert NoticeBook(store).pending("alice") == []
    assert sum("leaves alice/default alone" in m for m in caplog.messages) == 1, "logged once, not every pass"


async def test_a_server_past_its_limit_but_never_warned_is_warned_first(world):
    """The limit was lowered while the GPU idled: past the new limit with no warning, it is warned first."""
    store, _fleet, hub, source, clock, reclaimer, _ = world
    hold(store, hub)
    source.values[GPU] = 0.0
    QuotaBook(store).set("user", "alice", Quota(2, gpu_idle_minutes=60))
    reports = await passes(reclaimer, clock, range(0, 36))  # a pass every minute: 35 idle minutes, all watched
    assert not any(r.warned or r.stopped for r in reports)
    QuotaBook(store).set("user", "alice", Quota(2, gpu_idle_minutes=30))
    [r36] = await passes(reclaimer, clock, [36])
    assert r36.warned
    assert not r36.stopped
    [notice] = NoticeBook(store).pending("alice")
    assert notice.stop_at == T0 + timedelta(minutes=46), "a full warning lead from now"
    assert not any(r.stopped for r in await passes(reclaimer, clock, range(37, 46)))
    assert (await passes(reclaimer, clock, [46]))[0].stopped == [("alice", "")]


async def test_time_the_service_did_not_watch_is_not_idle_time(world):
    """The service was down 35 minutes (passes every minute, so readings go stale after 3): the idle clock
    starts again at the first reading after the gap, not at the last one before it."""
    store, _fleet, hub, source, clock, reclaimer, _ = world
    hold(store, hub)
    source.values[GPU] = 0.0
    await passes(reclaimer, clock, [0, 1])
    [r36] = await passes(reclaimer, clock, [36])
    assert not r36.warned
    assert not r36.stopped
    assert IdleBook(store).tracks()[0].idle_since == T0 + timedelta(minutes=36)
    reports = await passes(reclaimer, clock, range(37, 56))
    assert not any(r.warned or r.stopped for r in reports), "not warned before 20 watched idle minutes"
    [r56] = await passes(reclaimer, clock, [56])
    assert r56.warned == [("alice", "")]
    assert NoticeBook(store).pending("alice")[0].stop_at == T0 + timedelta(minutes=66)
    await passes(reclaimer, clock, range(57, 66))
    assert (await passes(reclaimer, clock, [66]))[0].stopped == [("alice", "")]


@pytest.mark.parametrize("how", ["exempt group", "quota off", "hub off", "starting"])
async def test_exempt_off_and_starting_servers_are_never_reclaimed(world, how):
    store, fleet, hub, source, clock, reclaimer, _ = world
    hold(store, hub, groups=["research"])
    source.values[GPU] = 0.0
    if how == "exempt group":
        IdleBook(store).exempt("research", "long preprocessing")
    elif how == "quota off":
        QuotaBook(store).set("user", "alice", Quota(2, gpu_idle_minutes=0))
    elif how == "hub off":
        fleet._settings = PolicySettings(store.url, fleet.inventory, node=NODE, default_quota=Quota(2))
    else:
        hub.add("alice", "", ready=False)
    reports = await passes(reclaimer, clock, range(0, 61))
    assert not any(r.warned or r.stopped for r in reports)
    assert not hub.stopped


async def test_a_quota_sets_its_own_minutes_and_threshold(world):
    store, _fleet, hub, source, clock, reclaimer, _ = world
    hold(store, hub)
    QuotaBook(store).set("user", "alice", Quota(2, gpu_idle_minutes=10, gpu_idle_threshold=20))
    source.values[GPU] = 15.0  # busy under the hub's 5 %, idle under the quota's 20 %
    reports = await passes(reclaimer, clock, range(0, 11))
    assert not reports[4].warned
    assert reports[5].warned
    assert reports[10].stopped == [("alice", "")]
    assert NoticeBook(store).last_done("alice").reason == "reclaimed: GPU idle 10 min"


async def test_idle_clocks_survive_a_restart_of_the_service_and_show_per_gpu(world):
    store, fleet, hub, source, clock, reclaimer, delivery = world
    hold(store, hub, gpus=(GPU, "GPU-sim-01-h100-80gb"))
    source.values.update({GPU: 0.0, "GPU-sim-01-h100-80gb": 2.0})
    await passes(reclaimer, clock, range(0, 16))
    # The service restarts within the staleness bound (3 passes): a new process, the same clocks.
    again = Reclaimer(fleet, hub, reclaimer.chooser, delivery, clock=clock, interval=60)
    reports = await passes(again, clock, [17, 18, 19, 20])
    assert reports[-1].warned == [("alice", "")], "the new process kept the 20 idle minutes"
    tracks = {t.gpu_uuid: t for t in IdleBook(store).tracks()}
    assert set(tracks) == {GPU, "GPU-sim-01-h100-80gb"}
    assert tracks[GPU].idle_since == T0
    store.release("alice", "", "stopped")
    hub.models.clear()
    await passes(again, clock, [21])
    assert IdleBook(store).tracks() == []
    assert NoticeBook(store).pending() == []


async def test_a_restart_slower_than_the_staleness_bound_starts_the_clocks_again(world):
    store, fleet, hub, source, clock, reclaimer, delivery = world
    hold(store, hub)
    source.values[GPU] = 0.0
    await passes(reclaimer, clock, range(0, 16))
    again = Reclaimer(fleet, hub, reclaimer.chooser, delivery, clock=clock, interval=60)
    [r20] = await passes(again, clock, [20])  # 5 minutes without a pass: more than 3 passes
    assert not r20.warned
    assert IdleBook(store).tracks()[0].idle_since == T0 + timedelta(minutes=20)


async def test_host_readings_follow_the_scripted_utilization(tmp_path):
    store = AllocationStore(f"sqlite:///{tmp_path / 'wb.sqlite'}")
    script = tmp_path / "util.json"
    script.write_text(json.dumps({GPU: 0, "1": None}))
    settings = PolicySettings(store.url, discover_devices("2"), node=NODE, simulated_utilization=str(script))
    fleet = Fleet(store, settings=settings)
    lease = store.allocate("alice", "", 2, [GPU, "GPU-sim-01-h100-80gb"], node=NODE)
    host = HostReadings(fleet)
    assert host.can_read()
    assert await host.read(lease, None) == {GPU: 0.0, "GPU-sim-01-h100-80gb": None}
    chooser = SourceChooser(host, ServerMonitorReadings(None), NODE)
    assert chooser.for_lease(lease) is host
    other = store.allocate("bob", "", 1, ["GPU-sim-01-h100-80gb"], node="slurm-node-3") or lease
    assert chooser.for_lease(type(lease)("bob", "", ("GPU-x",), T0, node="slurm-node-3")) is chooser.server
    del other
    store.dispose()


def test_slow_monitors_do_not_keep_idle_gpus_from_coming_back(tmp_path):
    """Eight servers whose monitors each take the client's full 10 s timeout to answer (nodes the hub
    cannot see): read one after another, a pass took 80 s, the next began 110 s after the last reading,
    and every idle clock restarted, so nothing was ever reclaimed. Read together, each stamped with its
    own time, a pass takes 10 s and the idle servers are warned and stopped on time. Simulated time
    (benchmarks/virtual_time.py): the real loop, its interval and the reads' sleeps, in milliseconds."""
    import asyncio

    from virtual_time import virtual_loop

    store = AllocationStore(f"sqlite:///{tmp_path / 'wb.sqlite'}")
    devices = discover_devices("8")
    settings = PolicySettings(
        store.url,
        devices,
        node=NODE,
        default_quota=Quota(8),
        gpu_idle_minutes=10,
        gpu_idle_threshold=5,
        gpu_idle_warn_minutes=5,
    )
    fleet = Fleet(store, settings=settings)
    hub = FakeHub()
    loop = virtual_loop()

    def clock() -> datetime:
        return T0 + timedelta(seconds=loop.time())

    class SlowMonitor(FakeSource):
        name = "server"

        async def read(self, lease, server_path):
            await asyncio.sleep(10.0)  # answers only at the client's timeout: idle (0 %)
            return {uuid: 0.0 for uuid in lease.gpu_uuids}

    chooser = SourceChooser(HostReadings(fleet), ServerMonitorReadings(None), NODE)
    chooser.register(NODE, SlowMonitor())
    users = [f"student{i}" for i in range(8)]
    for user, device in zip(users, devices.devices, strict=True):
        store.allocate(user, "", 1, [device.uuid], node=NODE)
        hub.add(user)
    reclaimer = Reclaimer(fleet, hub, chooser, FakeDelivery(), clock=clock, interval=30)
    try:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(asyncio.wait_for(reclaimer.run_forever(), timeout=13 * 60))
    except TimeoutError:
        pass
    finally:
        asyncio.set_event_loop(None)
        loop.close()
        store.dispose()
    assert sorted(user for user, _ in hub.stopped) == users, "idle GPUs behind slow monitors never came back"
