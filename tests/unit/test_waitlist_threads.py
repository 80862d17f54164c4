"""A release in a worker thread wakes a waiting spawn through its own loop.

The release's database write runs in ``asyncio.to_thread``; asyncio objects
may only be touched from their loop's thread. In debug mode asyncio checks
that and raises, so these tests run the loop with ``debug=True``: a
cross-thread ``Event.set`` fails them.
"""

from __future__ import annotations

import asyncio
import threading
import time

from workbench_devices import DeviceInventory, parse_simulated_spec
from workbench_spawner.ledger.store import AllocationStore
from workbench_spawner.policy.gpu_policy import GPUPolicy
from workbench_spawner.policy.settings import PolicySettings


def run_debug(main, timeout: float = 15.0):
    """asyncio.run(main(), debug=True) in a daemon thread: a loop left wedged by a
    cross-thread call fails the test instead of hanging the run."""
    result: dict = {}

    def target() -> None:
        try:
            result["value"] = asyncio.run(main(), debug=True)
        except BaseException as exc:  # noqa: BLE001 - a thread's error, raised again on the test's thread
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "the event loop hung (a cross-thread call broke it)"
    if "error" in result:
        raise result["error"]
    return result.get("value")


def test_release_in_a_worker_thread_wakes_the_waiter_at_once(tmp_path):
    url = f"sqlite:///{tmp_path / 'wb.sqlite'}"
    settings = PolicySettings(url, DeviceInventory("simulated", parse_simulated_spec("1"), "test"), node="n1")
    # A re-check every 30 s: only the wake-up can serve the waiter within the test.
    policy = GPUPolicy(settings, AllocationStore(url), recheck_interval=30)

    async def main() -> float:
        await policy.place("holder", "", 1, None, 1)
        waiter = asyncio.create_task(policy.place("waiter", "", 1, None, 20))
        await asyncio.sleep(0.1)
        assert not waiter.done()
        started = time.monotonic()
        await asyncio.to_thread(policy.release, "holder", "", "stopped")
        lease = await asyncio.wait_for(waiter, 5)
        assert lease.user == "waiter"
        assert lease.node == "n1"
        return time.monotonic() - started

    assert run_debug(main) < 2.0


def test_notify_from_a_thread_after_the_loop_closed_is_harmless(tmp_path):
    url = f"sqlite:///{tmp_path / 'wb.sqlite'}"
    settings = PolicySettings(url, DeviceInventory("simulated", parse_simulated_spec("1"), "test"))
    policy = GPUPolicy(settings, AllocationStore(url), recheck_interval=30)

    async def main() -> None:
        await policy.place("holder", "", 1, None, 1)
        waiter = asyncio.create_task(policy.place("waiter", "", 1, None, 20))
        await asyncio.sleep(0.1)
        waiter.cancel()

    run_debug(main)
    policy.release("holder", "", "stopped")  # no loop is running any more: nothing to wake, no error
