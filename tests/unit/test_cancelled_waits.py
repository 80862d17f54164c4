"""Waits that are cancelled, and the cost of a release: the rules behind tests/integration/test_cancelled_waits.

* a release wakes only the head(s) that may try, not the whole line;
* many waits cancelled while GPUs come free all end cancelled: none is served after its cancel;
* an allocation still running in a worker thread when its wait is cancelled is given back;
* a cancel that lands as start() returns, which JupyterHub's own wait for start() lets through on
  Python 3.11 (its asyncio.wait_for), is given again and ends the spawn (lost_cancel.py);
* who asked for a stop, as a ledger reason (stop_requester), and how usage groups reasons.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
import time
from collections.abc import Callable
from types import SimpleNamespace

import pytest
from jupyterhub.user import User

from tests.unit.fake_backends import FakeHostSpawner
from workbench_devices import DeviceInventory, parse_simulated_spec
from workbench_spawner.ledger import reasons
from workbench_spawner.ledger.store import AllocationStore
from workbench_spawner.placement.waitlist import WaitList
from workbench_spawner.policy.gpu_policy import GPUPolicy
from workbench_spawner.policy.settings import PolicySettings
from workbench_spawner.stop_requester import stop_reason_for


class CountingLine(WaitList[str]):
    """A WaitList that counts how often its waiters look at their place (once per wake-up each)."""

    looks = 0

    def position(self, ticket) -> int:
        type(self).looks += 1
        return super().position(ticket)


def test_a_release_wakes_only_the_head_not_the_whole_line():
    async def main() -> int:
        # Long re-checks: only wake-ups make anyone look during the test.
        line = CountingLine(recheck_interval=30, idle_recheck_interval=30)
        free: list[str] = []

        async def take() -> str | None:
            return free.pop() if free else None

        waiters = [asyncio.create_task(line.wait_for(f"u{i}/", 1, take, 60)) for i in range(50)]
        await asyncio.sleep(0.2)  # everyone joined and looked once
        CountingLine.looks = 0
        for _ in range(10):  # ten releases that free nothing this line can use
            line.notify()
            await asyncio.sleep(0.01)
        looks = CountingLine.looks
        for w in waiters:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        return looks

    # The head looks once per release; before, all 50 did (500 looks).
    assert asyncio.run(main()) <= 10


def test_a_burst_of_served_releases_wakes_the_rest_once_not_per_release():
    async def main() -> int:
        line = CountingLine(recheck_interval=30, idle_recheck_interval=30)
        free: list[str] = []

        async def take() -> str | None:
            return free.pop() if free else None

        waiters = [asyncio.create_task(line.wait_for(f"u{i}/", 1, take, 60)) for i in range(60)]
        await asyncio.sleep(0.2)
        CountingLine.looks = 0
        for i in range(10):  # ten GPUs come free within 0.1 s: ten served, each leaving the line
            free.append(f"gpu{i}")
            line.notify()
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.7)  # past one place refresh: the other 50 hear their new place
        looks = CountingLine.looks
        served = sum(1 for w in waiters if w.done() and not w.cancelled())
        for w in waiters:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        assert served == 10
        return looks

    # Heads: about two looks per served release; the rest: once or twice each (50-100). Before: 50 per release.
    assert asyncio.run(main()) < 150


def test_no_cancelled_wait_is_served_after_its_cancel():
    async def main() -> tuple[int, int, int]:
        line: WaitList[str] = WaitList(recheck_interval=0.005)
        free: list[str] = []
        served_after_cancel = 0
        served_before_cancel = 0
        cancelled = False

        async def take() -> str | None:
            nonlocal served_after_cancel, served_before_cancel
            await asyncio.sleep(0)
            if free:
                if cancelled:
                    served_after_cancel += 1
                else:  # a waiter already at this sleep when the cancel came: served before it, rightly
                    served_before_cancel += 1
                return free.pop()
            return None

        waiters = [asyncio.create_task(line.wait_for(f"u{i}/", 1, take, 60)) for i in range(100)]
        await asyncio.sleep(0.1)
        for i in range(8):  # releases that land just before the mass cancel, waking heads
            free.append(f"gpu{i}")
            line.notify()
        await asyncio.sleep(0)
        cancelled = True
        for w in waiters:
            w.cancel()
        for i in range(8, 40):  # and more right after it
            free.append(f"gpu{i}")
            line.notify()
        results = await asyncio.gather(*waiters, return_exceptions=True)
        await asyncio.sleep(0.1)
        finished = sum(1 for r in results if isinstance(r, str))
        return served_after_cancel, finished - served_before_cancel, len(line.waiting())

    served_after_cancel, finished_after_cancel, waiting = asyncio.run(main())
    assert served_after_cancel == 0, "a cancelled wait took a GPU after its cancel"
    # A wait served in the same loop turn as the cancel (its take ran first) returns its GPU; any other
    # finished wait carried on past its cancel.
    assert finished_after_cancel == 0, "a cancelled wait carried on and returned a GPU"
    assert waiting == 0, "a cancelled wait stayed in line"


@pytest.fixture
def policy(db_url: str) -> GPUPolicy:
    inventory = DeviceInventory("simulated", parse_simulated_spec("1"), "test")
    return GPUPolicy(PolicySettings(db_url, inventory, node="n1"), AllocationStore(db_url), recheck_interval=0.05)


def test_an_allocation_that_finishes_after_its_wait_was_cancelled_is_given_back(policy: GPUPolicy):
    store = policy.store
    real_allocate = store.allocate

    def slow_allocate(*args, **kwargs):
        time.sleep(0.4)  # the transaction is still running when the cancel lands
        return real_allocate(*args, **kwargs)

    store.allocate = slow_allocate

    async def main() -> None:
        task = asyncio.create_task(policy.place("ann", "", 1, None, 30))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(1.0)  # the transaction commits, then the give-back runs

    asyncio.run(main())
    assert store.leases() == [], "the cancelled wait's GPU stayed leased"
    assert [row.reason for row in store.usage()] == [reasons.START_CANCELLED]


def test_a_late_give_back_never_ends_the_lease_of_a_new_start(policy: GPUPolicy):
    store = policy.store
    first = store.allocate("ann", "", 1, ["GPU-sim-00-h100-80gb"])
    second = store.allocate("ann", "", 1, ["GPU-sim-00-h100-80gb"])  # a new start replaced it
    assert first is not None
    assert second is not None
    assert policy.release("ann", "", reasons.START_CANCELLED, first.since) == ()
    assert [lease.since for lease in store.leases()] == [second.since]
    assert policy.release("ann", "", reasons.STOPPED, second.since) == ("GPU-sim-00-h100-80gb",)


@pytest.fixture
def host_spawner(tmp_path):
    from workbench_spawner.policy.gpu_policy import _policies

    _policies.clear()
    spawner = FakeHostSpawner(
        user=SimpleNamespace(name="ann", url="/user/ann/", escaped_name="ann"),
        hub=SimpleNamespace(public_host="", api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/"),
        orm_spawner=SimpleNamespace(name="", server=None),
        gpu_db_url=f"sqlite:///{tmp_path / 'wb.sqlite'}",
        simulated_gpus="1",
    )
    yield spawner
    spawner.stop_polling()
    _policies.clear()


async def spawn_as_jupyterhub(spawner, started: Callable[[asyncio.Task], None], past_the_wait: list[bool]) -> None:
    """JupyterHub's ``User.spawn`` (6.1, user.py) around ``start()``: its task waits for the start with
    ``asyncio.wait_for(f, timeout=start_timeout)``, calls ``spawner.start_polling()``, then waits for the server
    to answer (``_wait_up``: here it never does). ``started(f)`` gets the start's task."""
    await spawner._apply_gpu_options({"gpus": 1})
    f = asyncio.ensure_future(spawner.start())
    started(f)
    await asyncio.wait_for(f, timeout=60)
    past_the_wait.append(True)
    spawner.start_polling()
    await asyncio.sleep(3600)


def test_jupyterhub_polls_a_started_server_in_the_spawns_task_right_after_its_wait_for_start():
    # What give_lost_cancel_again relies on: User.spawn waits for start() and calls start_polling() next, in
    # its own task (the lines between await nothing once start() succeeded), before it waits for the server.
    source = inspect.getsource(User.spawn)
    wait = source.index("await asyncio.wait_for(f, timeout=spawner.start_timeout)")
    polling = source.index("spawner.start_polling()")
    answer = source.index("await self._wait_up(spawner)")
    assert wait < polling < answer


async def test_a_cancel_that_lands_as_start_returns_ends_the_spawn(host_spawner):
    """A DELETE of the pending spawn cancels the spawn's task just after start() finished (its process
    launched): JupyterHub's wait_for let that cancel through and the spawn went on to a running server."""
    past_the_wait: list[bool] = []
    spawn: asyncio.Task | None = None

    def cancel_as_it_returns(start_task: asyncio.Task) -> None:
        start_task.add_done_callback(lambda _: spawn.cancel() if spawn is not None else None)

    spawn = asyncio.ensure_future(spawn_as_jupyterhub(host_spawner, cancel_as_it_returns, past_the_wait))
    done, _ = await asyncio.wait({spawn}, timeout=10)
    assert spawn in done, "the cancelled spawn went on to wait for its server"
    assert spawn.cancelled()
    if sys.version_info < (3, 12):
        assert past_the_wait == [True], "Python 3.11's wait_for kept the cancel this time: the test proves nothing"
    # The DELETE then stops what was launched: the server and its GPU.
    assert host_spawner.alive
    assert host_spawner.gpu_policy.store.leases() != []
    await host_spawner.stop()
    assert not host_spawner.alive
    assert host_spawner.gpu_policy.store.leases() == []


async def test_a_spawn_nobody_cancelled_goes_on_to_wait_for_its_server(host_spawner):
    past_the_wait: list[bool] = []
    spawn = asyncio.ensure_future(spawn_as_jupyterhub(host_spawner, lambda f: None, past_the_wait))
    # Until the start returned (a fixed half second was too short on a loaded CI machine), however long that takes.
    deadline = time.monotonic() + 60
    while not past_the_wait and not spawn.done() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert past_the_wait == [True]
    await asyncio.sleep(0.2)  # start_polling ran, and the spawn went on to wait for its server
    assert not spawn.done()
    spawn.cancel()
    await asyncio.wait({spawn})
    await host_spawner.stop()


USER = SimpleNamespace(kind="user", name="ann")
ADMIN = SimpleNamespace(kind="user", name="prof")
CULLER = SimpleNamespace(kind="service", name="idle-culler")
CHART_CULLER = SimpleNamespace(kind="service", name="jupyterhub-idle-culler")
SCRIPT = SimpleNamespace(kind="service", name="workbench-admin")


@pytest.mark.parametrize(
    ("requester", "reason"),
    [
        (USER, reasons.STOPPED_BY_USER),
        (ADMIN, reasons.STOPPED_BY_ADMIN),
        (CULLER, reasons.STOPPED_BY_CULLER),
        (CHART_CULLER, reasons.STOPPED_BY_CULLER),
        (SCRIPT, reasons.STOPPED_BY_SERVICE),
        (None, None),
        (SimpleNamespace(kind="deleted", name="x"), None),
    ],
)
def test_who_asked_for_a_stop(requester, reason):
    ending = stop_reason_for("ann", requester)
    assert (ending.reason if ending else None) == reason
    if ending is not None:
        assert ending.message.endswith("stopped this server.") or "idle culler" in ending.message


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        ("reclaimed: GPU idle 30 min", "reclaimed"),
        (reasons.STOPPED_BY_ADMIN, reasons.STOPPED_BY_ADMIN),
        (reasons.OUT_OF_MEMORY, reasons.OUT_OF_MEMORY),
        ("", "unknown"),
        ("something else", "something else"),
    ],
)
def test_usage_groups_reasons_by_kind(reason, kind):
    assert reasons.reason_kind(reason) == kind
