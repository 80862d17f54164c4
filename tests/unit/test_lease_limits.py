"""The quota where the lease is written: ``ledger.lease_limits`` inside ``allocate`` and ``adopt``.

Admission counts what a user holds when it looks, so two spawns of one user at once both passed it and
both got a GPU. These tests hold the store, the host allocator's line, an engine's adopt and the spawner to
the quota under concurrency, on SQLite and PostgreSQL (``db_url``), and pin the one sentence the student
reads whichever check caught the spawn.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from types import SimpleNamespace

import pytest
from jupyterhub.spawner import SpawnException

from tests.unit.fake_backends import FakeEngineSpawner, FakeHostSpawner, FakeWorld
from workbench_devices import discover_devices
from workbench_spawner.ledger.lease_limits import LeaseLimits, QuotaExceededError, refusal
from workbench_spawner.ledger.store import AllocationStore, Lease, UsageRow, utcnow
from workbench_spawner.placement.engine import EngineJob
from workbench_spawner.placement.host import HostAllocator, NoGPUAvailableError
from workbench_spawner.policy.gpu_policy import _policies
from workbench_spawner.rules.quota import Quota

GPUS = [f"GPU-sim-{i:02d}-h100-80gb" for i in range(4)]
KINDS = dict.fromkeys(GPUS, "H100-80GB")
SLICE = "MIG-sim-00-h200-141gb-0-1g.18gb"
ASK = "ask a hub admin to raise your GPU quota"
NOW = utcnow()


def one_gpu(**kw) -> LeaseLimits:
    return LeaseLimits(**({"max_gpus": 1, "kinds": KINDS} | kw))


def lease(server: str, *uuids: str, user: str = "alice") -> Lease:
    return Lease(user, server, tuple(uuids), NOW)


def never() -> float:
    raise AssertionError("GPU-hours are read only where the quota has a budget")


# (limits, server asked for, devices asked, leases held now, GPU-hours used, the refusal or None)
RULES = [
    (one_gpu(), "r2", 1, [], never, None),
    (one_gpu(), "r2", 1, [lease("r2", GPUS[0])], never, None),  # its own old lease: replaced, not counted
    (one_gpu(), "r2", 1, [lease("", GPUS[0], user="bob")], never, None),  # another user's
    (
        one_gpu(),
        "r2",
        1,
        [lease("r1", GPUS[0])],
        never,
        "Cannot start the server: you asked for 1 GPU, but the default quota allows 1 at once and your other "
        f"server r1 holds 1 (H100-80GB). Stop r1 first, ask for fewer, or {ASK}.",
    ),
    (
        one_gpu(source="your own GPU quota", contact="the course staff"),
        "r1",
        1,
        [lease("", GPUS[1])],
        never,
        "Cannot start the server: you asked for 1 GPU, but your own GPU quota allows 1 at once and your default "
        "server holds 1 (H100-80GB). Stop your default server first, ask for fewer, or ask the course staff to "
        "raise your GPU quota.",
    ),
    (one_gpu(max_gpus=2), "r2", 1, [lease("", GPUS[0])], never, None),
    (
        one_gpu(max_gpus=2),
        "r3",
        2,
        [lease("", GPUS[0]), lease("r1", GPUS[1])],
        never,
        "Cannot start the server: you asked for 2 GPUs, but the default quota allows 2 at once and your other "
        f"servers hold 2 (your default server: 1 H100-80GB; r1: 1 H100-80GB). Stop your default server and r1 "
        f"first, ask for fewer, or {ASK}.",
    ),
    (
        one_gpu(max_gpus=2),
        "r2",
        3,
        [],
        never,
        "Cannot start the server: you asked for 3 GPUs, but the default quota allows 2 at once. "
        f"Ask for fewer, or {ASK}.",
    ),
    # A MIG slice counts one device, as a whole GPU does; the sentence counts slices where slices were asked.
    (
        one_gpu(kind="1g.18gb", kinds={SLICE: "H200-141GB 1g.18gb"}),
        "small",
        1,
        [lease("big", SLICE)],
        never,
        "Cannot start the server: you asked for 1 slice, but the default quota allows 1 at once and your other "
        f"server big holds 1 (H200-141GB 1g.18gb). Stop big first, ask for fewer, or {ASK}.",
    ),
    # A time-sliced share counts one too (the same GPU held by two of the user's servers is two).
    (one_gpu(max_gpus=2), "r3", 1, [lease("r1", GPUS[0]), lease("r2", GPUS[0])], never, "...2 (r1: 1"),
    # Devices the inventory does not know (a node gone) are counted, only not named.
    (
        one_gpu(kinds={}),
        "r2",
        1,
        [lease("r1", "GPU-gone")],
        never,
        f"Cannot start the server: you asked for 1 GPU, but the default quota allows 1 at once and your other "
        f"server r1 holds 1. Stop r1 first, ask for fewer, or {ASK}.",
    ),
    (one_gpu(gpu_hours_per_week=10.0), "r1", 1, [], lambda: 9.99, None),
    (
        one_gpu(gpu_hours_per_week=10.0, max_gpus=4),
        "r1",
        1,
        [],
        lambda: 10.0,
        "Cannot start the server: the default quota allows 10 GPU-hours per week and you used 10.0 in the last 7 "
        f"days. Start a CPU-only server (0 GPUs), wait until older use leaves the 7-day window, or {ASK}.",
    ),
    (
        one_gpu(max_gpus=0),
        "",
        1,
        [],
        never,
        "Cannot start the server: you asked for 1 GPU, but the default quota allows 0 at once. "
        f"Ask for fewer, or {ASK}.",
    ),
]


@pytest.mark.parametrize(("limits", "server", "count", "leases", "hours", "expected"), RULES)
def test_the_rule_table(limits, server, count, leases, hours, expected):
    said = refusal(limits, "alice", server, count, leases, hours)
    if expected is not None and expected.startswith("..."):
        assert said is not None
        assert expected[3:] in said
    else:
        assert said == expected


def test_limits_of_an_effective_quota():
    from workbench_spawner.rules.quota import EffectiveQuota

    limits = LeaseLimits.of(EffectiveQuota(Quota(3, gpu_hours_per_week=5.0), "group", "ml"), "the course staff")
    assert (limits.max_gpus, limits.gpu_hours_per_week, limits.source, limits.contact) == (
        3,
        5.0,
        "the GPU quota of group ml",
        "the course staff",
    )


def test_the_refusal_is_a_403_no_gpu_error():
    assert issubclass(QuotaExceededError, NoGPUAvailableError)
    assert (QuotaExceededError.status, QuotaExceededError.reason) == (403, "quota")


# -- in the store's transaction ------------------------------------------------------------------------------


def at_once(db_url: str, calls: list[Callable[[AllocationStore], object]]) -> list[object]:
    """Run each call at the same moment in its own thread with its own store (its own connections), as
    separate hub workers would; each result is what the call returned or the exception it raised."""
    AllocationStore(db_url).dispose()  # the schema, once, as the hub makes it
    barrier = threading.Barrier(len(calls))
    results: list[object] = [None] * len(calls)

    def one(i: int) -> None:
        store = AllocationStore(db_url)
        try:
            barrier.wait()
            results[i] = calls[i](store)
        except Exception as exc:  # noqa: BLE001 - handed to the assertions
            results[i] = exc
        finally:
            store.dispose()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_twelve_spawns_of_one_user_at_once_leave_one_lease(db_url):
    def spawn(i: int) -> Callable[[AllocationStore], object]:
        return lambda store: store.allocate("alice", f"s{i}", 1, GPUS, node="n", limits=one_gpu())

    results = at_once(db_url, [spawn(i) for i in range(12)])
    granted = [r for r in results if isinstance(r, Lease)]
    refused = [r for r in results if isinstance(r, QuotaExceededError)]
    assert (len(granted), len(refused)) == (1, 11), results
    holder = granted[0].server
    for exc in refused:
        assert str(exc) == (
            "Cannot start the server: you asked for 1 GPU, but the default quota allows 1 at once and your other "
            f"server {holder} holds 1 (H100-80GB). Stop {holder} first, ask for fewer, or {ASK}."
        )
    store = AllocationStore(db_url)
    assert [(x.user, x.server, len(x.gpu_uuids)) for x in store.leases()] == [("alice", holder, 1)]
    assert store.usage() == [], "a refused allocation writes nothing, not even a replaced lease"


def test_spawns_of_two_users_at_once_each_get_their_quota(db_url):
    def spawn(user: str, i: int) -> Callable[[AllocationStore], object]:
        return lambda store: store.allocate(user, f"s{i}", 1, GPUS, limits=one_gpu(max_gpus=2))

    results = at_once(db_url, [spawn(user, i) for user in ("alice", "bob") for i in range(6)])
    held: dict[str, int] = {}
    for lease_ in AllocationStore(db_url).leases():
        held[lease_.user] = held.get(lease_.user, 0) + len(lease_.gpu_uuids)
    assert held == {"alice": 2, "bob": 2}
    assert sum(isinstance(r, QuotaExceededError) for r in results) == 8


def test_a_refusal_rolls_back_and_keeps_the_servers_own_old_lease(store):
    store.allocate("alice", "r1", 1, GPUS)
    old = store.allocate("alice", "r2", 1, GPUS)
    with pytest.raises(QuotaExceededError):
        store.allocate("alice", "r2", 2, GPUS, limits=one_gpu(max_gpus=2))
    assert store.lease_of("alice", "r2") == old, "the refused start replaced nothing"
    assert store.usage() == []
    # A start of the same server that fits replaces its own old lease, which is not counted against it.
    again = store.allocate("alice", "r2", 1, GPUS, limits=one_gpu(max_gpus=2))
    assert again is not None
    assert [row.reason for row in store.usage()] == ["replaced by a new start"]


def test_the_quota_is_checked_before_a_free_gpu_is_looked_for(store):
    store.allocate("bob", "", 4, GPUS)  # nothing free
    store.allocate("alice", "r1", 1, ["GPU-elsewhere"])
    with pytest.raises(QuotaExceededError):  # not None (wait): no GPU that comes free could be hers
        store.allocate("alice", "r2", 1, GPUS, limits=one_gpu())
    assert store.allocate("carol", "", 1, GPUS, limits=one_gpu()) is None  # within quota: waits for a GPU


def test_time_sliced_shares_count_one_each(store):
    assert store.allocate("alice", "r1", 1, GPUS[:1], slots_per_gpu=4, limits=one_gpu(max_gpus=2))
    assert store.allocate("alice", "r2", 1, GPUS[:1], slots_per_gpu=4, limits=one_gpu(max_gpus=2))
    with pytest.raises(QuotaExceededError) as info:
        store.allocate("alice", "r3", 1, GPUS[:1], slots_per_gpu=4, limits=one_gpu(max_gpus=2))
    assert "your other servers hold 2 (r1: 1 H100-80GB; r2: 1 H100-80GB)" in str(info.value)
    assert [len(x.gpu_uuids) for x in store.leases()] == [1, 1]


def test_mig_slices_count_one_each(store):
    inventory = discover_devices("1xH200-141GB:mig=7x1g.18gb")
    slices = [d.uuid for d in inventory.devices]
    kinds = {d.uuid: d.kind for d in inventory.devices}
    shares = {d.uuid: d.share for d in inventory.devices}
    limits = one_gpu(kind="H200-141GB 1g.18gb", kinds=kinds)
    assert store.allocate("alice", "big", 1, slices, shares=shares, limits=limits)
    with pytest.raises(QuotaExceededError) as info:
        store.allocate("alice", "small", 1, slices, shares=shares, limits=limits)
    assert str(info.value) == (
        "Cannot start the server: you asked for 1 slice, but the default quota allows 1 at once and your other "
        f"server big holds 1 (H200-141GB 1g.18gb). Stop big first, ask for fewer, or {ASK}."
    )


def test_a_spent_gpu_hour_budget_refuses_in_the_transaction(store):
    # 6 GPU-hours in the ledger and a lease held for 4 hours: 10 of a 10-hour budget.
    with store.writes().begin() as session:
        session.add(
            UsageRow(
                gpu_uuid=GPUS[3],
                user="alice",
                server="old",
                started=NOW - timedelta(hours=8),
                ended=NOW - timedelta(hours=2),
            )
        )
    assert store.adopt("alice", "running", [GPUS[0]], "pid:1", since=utcnow() - timedelta(hours=4))
    with pytest.raises(QuotaExceededError) as info:
        store.allocate("alice", "new", 1, GPUS, limits=one_gpu(max_gpus=4, gpu_hours_per_week=10.0))
    assert str(info.value) == (
        "Cannot start the server: the default quota allows 10 GPU-hours per week and you used 10.0 in the last 7 "
        f"days. Start a CPU-only server (0 GPUs), wait until older use leaves the 7-day window, or {ASK}."
    )
    assert [x.server for x in store.leases()] == ["running"]
    assert store.allocate("alice", "new", 1, GPUS, limits=one_gpu(max_gpus=4, gpu_hours_per_week=10.5))


def test_an_engines_adopt_over_quota_is_refused_and_writes_nothing(store):
    assert store.adopt("alice", "r1", [GPUS[0]], "slurm:1", node="n1", limits=one_gpu())
    with pytest.raises(QuotaExceededError) as info:
        store.adopt("alice", "r2", [GPUS[1]], "slurm:2", node="n1", limits=one_gpu())
    assert "your other server r1 holds 1 (H100-80GB). Stop r1 first" in str(info.value)
    assert [x.server for x in store.leases()] == ["r1"]
    # GPUs still leased (the ledger lagging the engine) are answered first: the caller waits, not refused.
    assert store.adopt("alice", "r2", [GPUS[0]], "slurm:2", node="n1", limits=one_gpu()) is False


def test_twelve_adopts_of_one_user_at_once_leave_one_lease(db_url):
    def adopt(i: int) -> Callable[[AllocationStore], object]:
        return lambda store: store.adopt("alice", f"s{i}", [f"GPU-{i}"], f"engine:{i}", limits=one_gpu())

    results = at_once(db_url, [adopt(i) for i in range(12)])
    assert results.count(True) == 1
    assert sum(isinstance(r, QuotaExceededError) for r in results) == 11
    assert len(AllocationStore(db_url).leases()) == 1


def test_a_running_server_is_adopted_over_quota(db_url, tmp_path):
    """Reconcile and restore record what runs: a fact, not a request; only a start is limited."""
    store = AllocationStore(db_url)
    assert store.allocate("alice", "r1", 1, GPUS, limits=one_gpu())
    assert store.adopt("alice", "r2", [GPUS[1]], "pid:2")  # the reconciler's adopt: no limits
    from workbench_spawner.policy.gpu_policy import GPUPolicy
    from workbench_spawner.policy.settings import PolicySettings

    settings = PolicySettings(inventory=discover_devices("4"), db_url=db_url, default_quota=Quota(1))
    policy = GPUPolicy(settings, store)
    assert policy.restore("alice", "r3", [GPUS[2]], "pid:3") == (GPUS[2],)
    assert sorted(x.server for x in store.leases()) == ["r1", "r2", "r3"]


# -- host placement: the line -------------------------------------------------------------------------------


def allocator(store: AllocationStore, spec: str = "1") -> HostAllocator:
    return HostAllocator(store, discover_devices(spec), "node", recheck_interval=0.05)


async def test_a_refusal_while_waiting_in_line_ends_that_spawn_at_once(store):
    placement = allocator(store)
    assert store.allocate("bob", "", 1, [d.uuid for d in placement.inventory.devices])
    first = asyncio.ensure_future(placement.place("alice", "r1", 1, None, 60, limits=one_gpu()))
    second = asyncio.ensure_future(placement.place("alice", "r2", 1, None, 60, limits=one_gpu()))
    while placement.waiting() < 2:
        await asyncio.sleep(0.01)
    began = time.monotonic()
    await asyncio.to_thread(placement.release, "bob", "", "stopped")
    done, _ = await asyncio.wait({first, second}, timeout=10, return_when=asyncio.ALL_COMPLETED)
    assert time.monotonic() - began < 5, "the refused spawn did not wait out its 60-second queue timeout"
    granted = [t.result() for t in done if t.exception() is None]
    refused = [t.exception() for t in done if t.exception() is not None]
    assert (len(granted), len(refused)) == (1, 1)
    assert isinstance(refused[0], QuotaExceededError)
    holder = granted[0].server
    assert f"your other server {holder} holds 1 (H100-80GB). Stop {holder} first" in str(refused[0])
    # Nobody is left in line, and a later spawn finds the line working.
    assert placement.waiting() == 0
    assert placement.waitlist.waiting() == []
    assert (placement._asking, placement._requests) == ({}, {})
    await asyncio.to_thread(placement.release, "alice", holder, "stopped")
    again = await placement.place("carol", "", 1, None, 5, limits=one_gpu())
    assert again.user == "carol"


async def test_a_spawn_over_quota_behind_others_in_line_is_refused_when_it_joins(store):
    placement = allocator(store, "2")
    uuids = [d.uuid for d in placement.inventory.devices]
    assert store.allocate("alice", "r1", 1, uuids[:1])
    assert store.allocate("bob", "", 1, uuids[1:])  # nothing free: carol waits, at the head of the line
    carol = asyncio.ensure_future(placement.place("carol", "", 1, None, 60, limits=one_gpu()))
    while placement.waiting() < 1:
        await asyncio.sleep(0.01)
    began = time.monotonic()
    with pytest.raises(QuotaExceededError) as info:  # alice may not try behind carol, and is over quota anyway
        await placement.place("alice", "r2", 1, None, 60, limits=one_gpu())
    assert time.monotonic() - began < 5
    assert "your other server r1 holds 1 (H100-80GB)" in str(info.value)
    assert [t.key for t in placement.waitlist.waiting()] == ["carol/"]
    await asyncio.to_thread(placement.release, "bob", "", "stopped")
    assert (await asyncio.wait_for(carol, 5)).user == "carol"


async def test_a_gpu_given_to_the_users_other_spawn_refuses_the_one_still_behind_others(store):
    placement = allocator(store, "2")
    uuids = [d.uuid for d in placement.inventory.devices]
    assert store.allocate("bob", "", 2, uuids)
    line = ["alice/r1", "carol/", "alice/r2"]
    waits = {}
    for key in line:
        user, server = key.split("/")
        waits[key] = asyncio.ensure_future(placement.place(user, server, 1, None, 60, limits=one_gpu()))
        while placement.waiting() < len(waits):
            await asyncio.sleep(0.01)
    assert [t.key for t in placement.waitlist.waiting()] == line
    began = time.monotonic()
    await asyncio.to_thread(lambda: store.release("bob", ""))  # both GPUs free; only the head is woken at first
    placement.released()
    assert (await asyncio.wait_for(waits["alice/r1"], 5)).server == "r1"
    with pytest.raises(QuotaExceededError) as info:
        await asyncio.wait_for(waits["alice/r2"], 5)
    assert time.monotonic() - began < 5
    assert "your other server r1 holds 1 (H100-80GB). Stop r1 first" in str(info.value)
    assert (await asyncio.wait_for(waits["carol/"], 5)).user == "carol"
    assert placement.waitlist.waiting() == []


def test_the_line_lets_a_recheck_end_a_wait_and_keeps_the_others():
    from workbench_spawner.placement.waitlist import WaitList

    async def main() -> None:
        line: WaitList[str] = WaitList(recheck_interval=0.05)
        free = asyncio.Event()

        async def take() -> str | None:
            return "gpu" if free.is_set() else None

        async def over() -> None:
            raise QuotaExceededError("over")

        head = asyncio.ensure_future(line.wait_for("a/1", 1, take, 30, user="a"))
        behind = asyncio.ensure_future(line.wait_for("b/", 1, take, 30, user="b", recheck=over))
        await asyncio.sleep(0.1)
        assert [t.key for t in line.waiting()] == ["a/1", "b/"]
        assert line.ask_recheck(lambda t: t.user == "b") == 1
        with pytest.raises(QuotaExceededError):
            await asyncio.wait_for(behind, 5)
        assert [t.key for t in line.waiting()] == ["a/1"]
        free.set()
        line.notify()
        assert await asyncio.wait_for(head, 5) == "gpu"
        assert line.waiting() == []

    asyncio.run(main())


# -- the spawner: both placement modes ------------------------------------------------------------------------


@pytest.fixture
def make_spawner(db_url):
    _policies.clear()
    world = FakeWorld()

    def make(cls, name: str, user: str = "alice", **traits):
        traits = {"gpu_db_url": db_url, "simulated_gpus": "4", "gpu_queue_recheck_interval": 0.05} | traits
        user_obj = SimpleNamespace(name=user, url=f"/user/{user}/", escaped_name=user, groups=[])
        hub = SimpleNamespace(public_host="", api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/")
        spawner = cls(user=user_obj, hub=hub, orm_spawner=SimpleNamespace(name=name, server=None), **traits)
        spawner.world = world
        return spawner

    yield make, world
    _policies.clear()


@pytest.mark.parametrize("cls", [FakeHostSpawner, FakeEngineSpawner], ids=["host", "engine"])
async def test_two_spawns_that_passed_admission_together_get_one_gpu(make_spawner, cls):
    make, world = make_spawner
    spawners = [make(cls, name) for name in ("r1", "r2", "")]
    for spawner in spawners:  # all pass admission: nothing is held yet
        await spawner._apply_gpu_options({"gpus": 1})
    results = await asyncio.gather(*(s.start() for s in spawners), return_exceptions=True)
    refused = [r for r in results if isinstance(r, SpawnException)]
    started = [s for s, r in zip(spawners, results, strict=True) if not isinstance(r, BaseException)]
    assert (len(started), len(refused)) == (1, 2), results
    name = started[0].name
    holds = f"your other server {name} holds" if name else "your default server holds"
    for exc in refused:
        assert (exc.status_code, exc.reason) == (403, "quota")
        assert exc.message == (
            f"Cannot start the server: you asked for 1 GPU, but the default quota allows 1 at once and {holds} 1 "
            f"(H100-80GB). Stop {name or 'your default server'} first, ask for fewer, or {ASK}."
        )
    leases = started[0].gpu_policy.store.leases()
    assert [(x.user, x.server, len(x.gpu_uuids)) for x in leases] == [("alice", started[0].name, 1)]
    # Only the holder's server runs (the engine template's cancel of a refused job: the Toy test below).
    assert list(world.running) == [started[0].runtime_key()]
    for spawner in started:
        await spawner.stop()


async def test_an_engine_adopt_refused_cancels_the_job(store):
    from tests.unit.test_engine_template import DEVICES, Toy

    assert store.adopt("alice", "r1", ["GPU-0"], "toy:t-1", node="t1")
    toy = Toy(store, "pending", "running")
    job = EngineJob(job_id="t-7", started=lambda: {"node": "t1", "gpus": ["GPU-1"]})
    assert {d.kind for d in DEVICES.devices} == {""}, "the toy's GPUs have no model: the sentence names none"
    with pytest.raises(QuotaExceededError) as info:
        await toy.place("alice", "r2", 1, None, 5.0, job=job, limits=one_gpu(kinds={}))
    assert str(info.value) == (
        "Cannot start the server: you asked for 1 GPU, but the default quota allows 1 at once and your other "
        f"server r1 holds 1. Stop r1 first, ask for fewer, or {ASK}."
    )
    assert toy.cancelled == [("t-7", "its user is over their GPU quota")]
    assert [x.server for x in store.leases()] == ["r1"]
