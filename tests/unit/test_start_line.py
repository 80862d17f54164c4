"""The class-start limits: how they are derived, and the line in front of the host (start_line.py)."""

from __future__ import annotations

import asyncio
import time

import pytest

from workbench_devices import discover_devices
from workbench_spawner.placement.start_line import LineFullError, SlotTimeoutError, StartLine
from workbench_spawner.policy.settings import PolicySettings
from workbench_spawner.policy.spawn_limits import derive_spawn_limits


@pytest.mark.parametrize(
    ("devices", "cores", "max_waiting", "max_starting", "expected"),
    [
        # 8 GPUs on a 16-core host: every free GPU starts its server at once, plus 4 CPU-only ones.
        (8, 16, 1000, 0, (1000, 12, 1024)),
        # 8 GPUs on this 2-core host: at most 2 per core start together.
        (8, 2, 1000, 0, (1000, 4, 1008)),
        # 8 H200 cut into 56 slices on a 64-core host: 60 start at once.
        (56, 64, 1000, 0, (1000, 60, 1120)),
        # The same slices on 2 cores: 4 at a time, not 56 JupyterLabs together.
        (56, 2, 1000, 0, (1000, 4, 1008)),
        # A CPU-only hub: still a few at once.
        (0, 8, 1000, 0, (1000, 4, 1008)),
        # One core: never fewer than 4.
        (2, 1, 1000, 0, (1000, 4, 1008)),
        # The operator's numbers win; JupyterHub's limit stays above them.
        (8, 2, 500, 20, (500, 20, 540)),
        (8, 2, 1, 1, (1, 1, 3)),
    ],
)
def test_limits_derived_from_the_devices_and_cores(devices, cores, max_waiting, max_starting, expected):
    limits = derive_spawn_limits(devices, cores, max_waiting, max_starting)
    assert (limits.max_waiting, limits.max_starting, limits.concurrent_spawn_limit) == expected
    assert limits.derived_starting == (max_starting == 0)
    # A class of 500 queues without a single 429 at the defaults.
    if max_waiting == 1000:
        assert limits.concurrent_spawn_limit > 500 + limits.max_starting


@pytest.mark.parametrize(("max_waiting", "max_starting"), [(0, 0), (-1, 0), (10, -1)])
def test_bad_limits_are_refused_with_a_sentence(max_waiting, max_starting):
    with pytest.raises(ValueError, match="WORKBENCH_MAX_"):
        derive_spawn_limits(8, 2, max_waiting, max_starting)


def test_settings_count_each_share_of_a_time_sliced_gpu_and_each_slice():
    shared = PolicySettings(db_url="sqlite://", inventory=discover_devices("2"), servers_per_gpu=4)
    assert shared.spawn_limits(cores=64).max_starting == 2 * 4 + 4
    slices = PolicySettings(db_url="sqlite://", inventory=discover_devices("1xH200-141GB:mig=7x1g.18gb"))
    assert slices.spawn_limits(cores=64).max_starting == 7 + 4
    assert (
        PolicySettings(db_url="sqlite://", inventory=discover_devices("2"), max_waiting=50)
        .spawn_limits(cores=64)
        .concurrent_spawn_limit
        == 50 + 2 * 6
    )


def test_the_line_refuses_past_max_waiting_and_counts_who_left():
    line = StartLine(max_waiting=2, max_starting=1)
    first, second = line.join(), line.join()
    with pytest.raises(LineFullError, match="2 students are already waiting"):
        line.join()
    line.leave(first)
    line.leave(first)  # twice is harmless
    third = line.join()
    assert line.in_line == 2
    line.leave(second)
    line.leave(third)
    assert line.in_line == 0


async def test_slots_go_first_come_first_served_with_places_told():
    line = StartLine(max_waiting=10, max_starting=2, refresh=0.02)
    deadline = time.monotonic() + 5
    a = await line.start_slot(deadline, lambda n: None)
    b = await line.start_slot(deadline, lambda n: None)
    told: dict[str, list[int]] = {"c": [], "d": []}
    c = asyncio.ensure_future(line.start_slot(deadline, told["c"].append))
    d = asyncio.ensure_future(line.start_slot(deadline, told["d"].append))
    await asyncio.sleep(0.05)
    assert (line.starting, line.waiting_to_start) == (2, 2)
    assert told == {"c": [2], "d": [3]}
    line.release(a)
    await asyncio.sleep(0.05)
    assert c.done()
    assert not d.done()
    assert told["d"] == [3, 2], "d is told when the line moved"
    line.release(b)
    line.release(b)  # twice is harmless: it frees one slot, not two
    await asyncio.wait_for(d, 1)
    assert (line.starting, line.waiting_to_start) == (2, 0)


async def test_a_cancelled_wait_leaves_and_a_slot_handed_over_as_it_is_cancelled_is_passed_on():
    line = StartLine(max_waiting=10, max_starting=1, refresh=0.02)
    deadline = time.monotonic() + 5
    holder = await line.start_slot(deadline, lambda n: None)
    gone = asyncio.ensure_future(line.start_slot(deadline, lambda n: None))
    nxt = asyncio.ensure_future(line.start_slot(deadline, lambda n: None))
    await asyncio.sleep(0.05)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert line.waiting_to_start == 1
    # The slot is handed to ``nxt`` and ``nxt`` is cancelled in the same instant: the slot goes on, not lost.
    later = asyncio.ensure_future(line.start_slot(deadline, lambda n: None))
    await asyncio.sleep(0.05)
    line.release(holder)
    nxt.cancel()
    with pytest.raises(asyncio.CancelledError):
        await nxt
    await asyncio.wait_for(later, 1)
    assert line.starting == 1


async def test_no_slot_before_the_deadline_is_a_timeout_and_leaves_the_line():
    line = StartLine(max_waiting=10, max_starting=1, refresh=0.02)
    await line.start_slot(time.monotonic() + 5, lambda n: None)
    with pytest.raises(SlotTimeoutError, match="1 server still starts ahead"):
        await line.start_slot(time.monotonic() + 0.1, lambda n: None)
    assert line.waiting_to_start == 0


async def test_a_slot_is_held_until_the_server_answered():
    line = StartLine(max_waiting=10, max_starting=1)
    slot = await line.start_slot(time.monotonic() + 5, lambda n: None)
    answered = False
    line.hold_until(slot, lambda: answered, limit=5, every=0.01)
    await asyncio.sleep(0.05)
    assert line.starting == 1
    answered = True
    await asyncio.sleep(0.05)
    assert line.starting == 0
    # A server that never answers gives its slot back after the limit.
    slot = await line.start_slot(time.monotonic() + 5, lambda n: None)
    line.hold_until(slot, lambda: False, limit=0.05, every=0.01)
    await asyncio.sleep(0.15)
    assert line.starting == 0
