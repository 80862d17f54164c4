"""The day-of-class benchmark drives the real code on simulated time (benchmarks/class_day.py).

Small sizes, so it stays a unit test: what matters is that the replay goes through the real wait
list, placement and reclaim loop (refusals at the queue timeout, warnings before stops, fifo in
arrival order) and that the virtual-time loop keeps asyncio's semantics.
"""

from __future__ import annotations

import asyncio

import pytest

import class_day
from class_day_trace import CLASS_MINUTES, make_trace
from virtual_time import virtual_loop


def test_the_virtual_loop_jumps_timers_runs_threads_inline_and_keeps_errors():
    loop = virtual_loop()
    order = []

    async def sleeper(name, seconds):
        await asyncio.sleep(seconds)
        order.append((name, loop.time()))

    async def main():
        await asyncio.gather(sleeper("late", 7200), sleeper("early", 300))
        assert await asyncio.to_thread(lambda: 42) == 42
        with pytest.raises(ZeroDivisionError):
            await asyncio.to_thread(lambda: 1 / 0)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), 60)
        return loop.time()

    try:
        assert loop.run_until_complete(main()) == 7260
    finally:
        loop.close()
    assert order == [("early", 300), ("late", 7200)]


def test_a_stuck_simulation_says_so_instead_of_hanging():
    loop = virtual_loop()
    try:
        with pytest.raises(RuntimeError, match="simulation stuck"):
            loop.run_until_complete(asyncio.Event().wait())
    finally:
        loop.close()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    trace = make_trace(24, 13, 4)
    out = {}
    for name, options in [
        ("fifo", {}),
        ("reclaim", {"reclaim": 5.0}),
        ("fair", {"fair": True}),
        ("reserve", {"reserve": True}),
    ]:
        workdir = tmp_path_factory.mktemp(name)
        out[name] = class_day.run(trace, 4, workdir, seed=13, **options)
    return out


def test_the_replay_goes_through_the_queue_timeout_and_keeps_fifo_order(results):
    fifo = results["fifo"]
    assert fifo.refusals > 0, "spawns are refused at the 300 s queue timeout and tried again"
    assert fifo.out_of_order == 0, "first come, first served, across refusals and retries"
    assert fifo.waits
    assert all(0 <= w <= CLASS_MINUTES + 30 for w in fifo.waits)
    assert fifo.reclaims == fifo.warned == 0
    assert 0 < fifo.idle_hours + fifo.used_hours <= 4 * CLASS_MINUTES / 60 + 1e-9, "4 GPUs, 2 hours at most"


def test_idle_reclaim_warns_before_it_stops_and_frees_gpus(results):
    fifo, reclaim = results["fifo"], results["reclaim"]
    assert reclaim.reclaims > 0
    assert reclaim.warned >= reclaim.reclaims
    assert reclaim.idle_hours < fifo.idle_hours
    assert reclaim.never < fifo.never


def test_fair_share_and_the_reservation_decide_on_this_trace(results):
    assert results["fair"].out_of_order > 0, "fair share served someone before an earlier, heavier user"
    assert results["reserve"].out_of_order > 0, "the reservation served a member before an earlier non-member"


# -- sharing: MIG slices and time-slicing (--sharing) --------------------------------------


def test_the_mig_lab_builds_its_slices_as_the_simulated_spec_does():
    from class_day_lab import simulated_inventory
    from workbench_devices.inventory import parse_simulated_spec

    lab = simulated_inventory(8, "7x1g.18gb").devices
    assert lab == parse_simulated_spec("8xH200-141GB:mig=7x1g.18gb")
    assert len(lab) == 56
    assert all(d.mig and d.profile == "1g.18gb" and d.share == pytest.approx(1 / 7) for d in lab)
    assert simulated_inventory(3).devices == parse_simulated_spec("3xH200-141GB")


def test_sharing_plans_every_lab_and_a_mig_lab_has_nothing_to_reserve():
    labs = class_day.sharing_modes(["whole", "mig", "timesliced"], "7x1g.18gb", 4)
    rows = class_day.plan(["baseline", "idle-reclaim", "reservation", "all"], [10.0], labs)
    by_lab = {}
    for label, options in rows:
        by_lab.setdefault(options["sharing"].name, []).append(label)
    assert by_lab["mig"] == ["baseline", "idle-reclaim (10 min)"]
    every = ["baseline", "idle-reclaim (10 min)", "reservation", "all three (reclaim 10 min)"]
    assert by_lab["whole"] == by_lab["timesliced"] == every
    assert labs[2].servers_per_gpu == 4
    assert labs[1].layout == "7x1g.18gb"
    for bad in (["--sharing", "mps"], ["--mig-layout", "8x1g.18gb"], ["--servers-per-gpu", "0"]):
        with pytest.raises(SystemExit):
            class_day.main(bad)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    trace = make_trace(24, 13, 4)
    labs = dict(zip(class_day.SHARINGS, class_day.sharing_modes(list(class_day.SHARINGS)), strict=True))
    return {
        name: class_day.run(trace, 4, tmp_path_factory.mktemp(name), seed=13, sharing=labs[name])
        for name in ("mig", "timesliced", "timesliced-slowdown")
    }


def test_slices_serve_the_small_class_at_once_and_count_a_slice_hour_as_a_seventh(results, shared):
    mig, whole = shared["mig"], results["fifo"]
    assert mig.lab == "mig"
    assert mig.never == 0 < whole.never
    assert max(mig.waits) < 5, "28 slices for 24 students and their guests"
    assert mig.refusals == 0, "28 slices for 24 students and their guests"
    assert mig.contended_hours == 0, "a slice is one server's"
    assert mig.used_hours == pytest.approx(mig.busy_server_hours / 7), "a busy 1g slice-hour is 1/7 GPU-hour"
    assert 0 < mig.idle_hours + mig.used_hours <= 4 * CLASS_MINUTES / 60 + 1e-9


def test_time_slicing_shares_gpus_and_the_slowdown_stretches_the_work(results, shared):
    ts, slow, whole = shared["timesliced"], shared["timesliced-slowdown"], results["fifo"]
    assert ts.never < whole.never, "4 servers per GPU serve more students"
    assert ts.contended_hours > 0, "a GPU busy for two counts once"
    assert ts.busy_server_hours > ts.used_hours, "a GPU busy for two counts once"
    assert ts.idle_hours + ts.used_hours <= 4 * CLASS_MINUTES / 60 + 1e-9, "still 4 GPUs, 2 hours at most"
    assert slow.busy_server_hours > ts.busy_server_hours, "at 1/k speed the same work keeps servers busy longer"


def test_every_module_that_reads_the_ledgers_now_is_on_the_simulated_clock():
    """A module that imports ``utcnow`` by name and is left on the wall clock mixes real time into a
    simulated day (GPU-hours, and with them fair share, once did)."""
    names = {m.__name__ for m in class_day.ledger_clock_modules()}
    assert {
        "workbench_spawner.ledger.store",
        "workbench_spawner.ledger.gpu_hours",
        "workbench_spawner.ledger.quota_book",
        "workbench_spawner.ledger.notices",
        "workbench_hub.service.gpu_reclaim",
    } <= names
