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
from virtual_time import virtual_loop  # noqa: E402


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
    assert fifo.waits and all(0 <= w <= CLASS_MINUTES + 30 for w in fifo.waits)
    assert fifo.reclaims == fifo.warned == 0
    assert 0 < fifo.idle_hours + fifo.used_hours <= 4 * CLASS_MINUTES / 60 + 1e-9, "4 GPUs, 2 hours at most"


def test_idle_reclaim_warns_before_it_stops_and_frees_gpus(results):
    fifo, reclaim = results["fifo"], results["reclaim"]
    assert reclaim.reclaims > 0 and reclaim.warned >= reclaim.reclaims
    assert reclaim.idle_hours < fifo.idle_hours and reclaim.never < fifo.never


def test_fair_share_and_the_reservation_decide_on_this_trace(results):
    assert results["fair"].out_of_order > 0, "fair share served someone before an earlier, heavier user"
    assert results["reserve"].out_of_order > 0, "the reservation served a member before an earlier non-member"
