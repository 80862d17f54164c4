"""The GPU policy: waiting in line, time-outs and reconciling after a restart."""

import asyncio

import pytest

from workbench_devices import DeviceInventory, parse_simulated_spec
from workbench_spawner.ledger.store import AllocationStore
from workbench_spawner.policy.gpu_policy import GPUPolicy, NoGPUAvailableError
from workbench_spawner.policy.settings import PolicySettings


def make_policy(tmp_path, spec="4", slots=1, recheck=5.0):
    devices = parse_simulated_spec(spec)
    url = f"sqlite:///{tmp_path / 'wb.sqlite'}"
    settings = PolicySettings(url, DeviceInventory("simulated", devices, "test"), servers_per_gpu=slots, node="node-a")
    return GPUPolicy(settings, AllocationStore(url), recheck_interval=recheck)


async def test_waiters_are_served_in_arrival_order(tmp_path):
    policy = make_policy(tmp_path, "2")
    await policy.place("holder", "", 2, None, 1)
    served, reports = [], {}

    async def wait(user, count):
        reports[user] = []
        lease = await policy.place(user, "", count, None, 30, reports[user].append)
        served.append(user)
        return lease

    # "big" arrives first and wants both GPUs; "small" must not overtake it.
    big = asyncio.create_task(wait("big", 2))
    await asyncio.sleep(0.05)
    small = asyncio.create_task(wait("small", 1))
    await asyncio.sleep(0.05)
    assert reports == {"big": [0], "small": [1]}, "each waiter hears its place in line"
    policy.release("holder", "", "stopped")
    await asyncio.wait_for(big, 5)
    await asyncio.sleep(0.05)
    assert served == ["big"]
    assert not small.done()
    policy.release("big", "", "stopped")
    lease = await asyncio.wait_for(small, 5)
    assert served == ["big", "small"]
    assert len(lease.gpu_uuids) == 1
    assert reports["small"] == [1, 0], "the place in line is updated as it moves"


async def test_wait_times_out_with_a_readable_message(tmp_path):
    policy = make_policy(tmp_path, "1", recheck=0.05)
    await policy.place("holder", "", 1, None, 1)
    with pytest.raises(NoGPUAvailableError, match=r"No 1 GPU became free within 0.3 seconds .*CPU-only"):
        await policy.place("late", "", 1, None, 0.3)
    assert policy.placement.waitlist.waiting() == [], "a timed-out spawn leaves the line"


async def test_cancelled_wait_leaves_the_line_and_lets_the_next_one_go(tmp_path):
    policy = make_policy(tmp_path, "1")
    await policy.place("holder", "", 1, None, 1)
    first = asyncio.create_task(policy.place("first", "", 1, None, 30))
    await asyncio.sleep(0.05)
    second = asyncio.create_task(policy.place("second", "", 1, None, 30))
    await asyncio.sleep(0.05)
    first.cancel()  # e.g. the user gave up and stopped the pending spawn
    policy.release("holder", "", "stopped")
    lease = await asyncio.wait_for(second, 5)
    assert lease.user == "second"
    assert [held.user for held in policy.store.leases()] == ["second"]


async def test_a_release_made_elsewhere_is_noticed_by_the_recheck(tmp_path):
    policy = make_policy(tmp_path, "1", recheck=0.05)
    await policy.place("holder", "", 1, None, 1)
    waiter = asyncio.create_task(policy.place("next", "", 1, None, 10))
    await asyncio.sleep(0.1)
    # Another process frees the GPU: this policy's wait list is not told.
    other = AllocationStore(policy.store.url)
    other.release("holder", "", "admin")
    lease = await asyncio.wait_for(waiter, 5)
    assert lease.user == "next"


async def test_model_choice_only_gets_that_model(tmp_path):
    policy = make_policy(tmp_path, "1xH100-80GB,2xA100-40GB")
    assert policy.models() == ["A100-40GB", "H100-80GB"]
    lease = await policy.place("alice", "", 2, "A100-40GB", 1)
    assert all("a100" in uuid for uuid in lease.gpu_uuids)
    with pytest.raises(NoGPUAvailableError):
        await policy.place("bob", "", 1, "A100-40GB", 0)
    assert policy.free_count() == 1
    assert policy.free_count("H100-80GB") == 1


async def test_reconcile_after_restart_releases_only_dead_servers(tmp_path):
    policy = make_policy(tmp_path, "4")
    await policy.place("alive", "", 2, None, 1)
    policy.store.set_ref("alive", "", "pid:1")
    await policy.place("dead", "", 1, None, 1)
    policy.store.set_ref("dead", "", "pid:2")
    await policy.place("unknown", "", 1, None, 1)

    restarted = make_policy(tmp_path, "4")  # a new hub process, same database
    verdict = {"pid:1": True, "pid:2": False, "": None}
    released = restarted.reconcile(lambda lease: verdict[lease.ref])
    assert [gone.user for gone in released] == ["dead"]
    assert restarted.reconcile(lambda lease: False) == [], "reconcile runs once per process"
    kept = {held.user: held.gpu_uuids for held in restarted.store.leases()}
    assert set(kept) == {"alive", "unknown"}
    # The freed GPU goes to a newcomer; the kept ones are never handed out twice.
    lease = await restarted.place("new", "", 1, None, 0)
    assert set(lease.gpu_uuids).isdisjoint(kept["alive"] + kept["unknown"])
    with pytest.raises(NoGPUAvailableError):
        await restarted.place("more", "", 1, None, 0)
