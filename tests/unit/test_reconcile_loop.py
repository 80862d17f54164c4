"""The reconciler is a loop in the hub: a pass on a timer and on demand (``reconcile_soon``), one pass at a
time in its own thread, that closes the leases of servers that are gone with the backend's reason, leaves
spawns in flight alone, counts and logs every fix, and goes on after a pass that raised.

The backend here is a table of answers (which refs run, why the others ended) or the fake host backend
(``tests/unit/fake_backends.py``) with its runtime, the ``FakeWorld``.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest

from tests.conftest import wait_until
from tests.unit.fake_backends import FakeHostSpawner, FakeWorld
from workbench_devices import DeviceInventory, parse_simulated_spec
from workbench_spawner.ledger import reasons
from workbench_spawner.ledger.reconcile_book import ReconcileBook
from workbench_spawner.ledger.store import AllocationStore, Lease, LeaseRow, utcnow
from workbench_spawner.policy.gpu_policy import GPUPolicy, _policies
from workbench_spawner.policy.settings import PolicySettings


class World:
    """What runs out there, by lease ref, and why what ended ended; every answer is logged."""

    def __init__(self) -> None:
        self.running: set[str] = set()
        self.why: dict[str, str] = {}
        self.asked: list[str] = []
        self.orphan_passes = 0

    def alive(self, lease: Lease) -> bool | None:
        self.asked.append(lease.user)
        return lease.ref in self.running

    def gone_reason(self, lease: Lease) -> str | None:
        return self.why.get(lease.ref)

    def orphans(self) -> None:
        self.orphan_passes += 1


@pytest.fixture
def policies():
    """make(every=...) -> a policy on a fresh SQLite file; every loop is stopped after the test."""
    made: list[GPUPolicy] = []

    def make(tmp_path, every: float = 30.0, grace: float = 0.0) -> GPUPolicy:
        url = f"sqlite:///{tmp_path / f'wb{len(made)}.sqlite'}"
        devices = parse_simulated_spec("4")
        settings = PolicySettings(url, DeviceInventory("simulated", devices, "test"), node="n", reconcile_seconds=every)
        policy = GPUPolicy(settings, AllocationStore(url))
        policy.reconcile_grace_seconds = grace
        made.append(policy)
        return policy

    yield make
    for policy in made:
        policy.stop_reconciler()
        policy.store.dispose()


def lease(policy: GPUPolicy, user: str, ref: str, count: int = 1) -> Lease:
    free = [d.uuid for d in policy.devices if d.uuid not in policy.store.holders()]
    taken = policy.store.allocate(user, "", count, free)
    policy.store.set_ref(user, "", ref)
    return taken


def reason_of(policy: GPUPolicy, user: str) -> list[str]:
    return [row.reason for row in policy.store.usage(user=user)]


def test_a_server_that_dies_while_the_hub_runs_loses_its_lease_on_the_next_timed_pass(tmp_path, policies, caplog):
    policy = policies(tmp_path, every=0.2)
    world = World()
    world.running |= {"pid:1", "pid:2"}
    ann = lease(policy, "ann", "pid:1")
    lease(policy, "bob", "pid:2")
    assert policy.reconcile(world.alive, world.orphans, world.gone_reason) == []
    caplog.set_level(logging.WARNING, logger="workbench.policy")

    world.running.discard("pid:1")  # killed outside the hub; nobody calls anything
    world.why["pid:1"] = reasons.OUT_OF_MEMORY
    wait_until(lambda: policy.store.lease_of("ann", "") is None, 5, "the loop to close ann's lease")
    assert reason_of(policy, "ann") == [reasons.OUT_OF_MEMORY], "the backend's reason, not a made-up one"
    assert policy.store.lease_of("bob", "") is not None
    assert ReconcileBook(policy.store).counts()["lease_closed"] == 1
    line = f"reconcile: closed the lease of ann/ on {ann.gpu_uuids[0]}: out of memory"
    # This policy's loop only: a loop of an earlier test's policy may still run in this process until it is
    # collected, and log that its database (a dropped PostgreSQL one) is gone.
    mine = {policy.reconcile_thread.ident, threading.get_ident()}
    said = [r.getMessage() for r in caplog.records if r.thread in mine]
    assert [m for m in said if m.startswith("reconcile:")] == [line]
    passes = world.orphan_passes
    wait_until(lambda: world.orphan_passes >= passes + 2, 5, "the loop to go on, orphans included")
    assert ReconcileBook(policy.store).counts()["lease_closed"] == 1, "a fix is counted once"


def test_without_a_reason_from_the_backend_the_lease_closes_as_server_gone(tmp_path, policies):
    policy = policies(tmp_path, every=0)
    world = World()
    lease(policy, "ann", "pid:1")
    world.running.add("pid:1")
    policy.reconcile(world.alive)
    world.running.clear()
    policy.reconcile_now()
    assert reason_of(policy, "ann") == [reasons.SERVER_GONE]


def test_with_no_timer_only_reconcile_soon_runs_a_pass(tmp_path, policies):
    policy = policies(tmp_path, every=0)
    world = World()
    world.running.add("pid:1")
    lease(policy, "ann", "pid:1")
    policy.reconcile(world.alive, world.orphans)
    world.running.clear()
    time.sleep(0.6)
    assert policy.store.lease_of("ann", "") is not None, "0: no timed pass"
    policy.reconcile_soon()  # an inventory change, an engine reconnecting
    wait_until(lambda: policy.store.lease_of("ann", "") is None, 5, "reconcile_soon to run a pass now")


def test_reconcile_soon_before_the_timer_runs_a_pass_at_once(tmp_path, policies):
    policy = policies(tmp_path, every=3600)
    world = World()
    world.running.add("pid:1")
    lease(policy, "ann", "pid:1")
    policy.reconcile(world.alive, world.orphans)
    world.running.clear()
    started = time.monotonic()
    threading.Thread(target=policy.reconcile_soon).start()  # thread-safe: from any thread
    wait_until(lambda: policy.store.lease_of("ann", "") is None, 5, "the pass reconcile_soon asked for")
    assert time.monotonic() - started < 5


def test_spawns_in_flight_and_young_leases_without_a_ref_are_left_alone(tmp_path, policies):
    policy = policies(tmp_path, every=0, grace=30.0)
    world = World()  # nothing runs: every lease's server looks gone
    policy.reconcile(world.alive)  # the first pass, on an empty ledger
    lease(policy, "starting", "")
    policy.starting.add(("starting", ""))
    lease(policy, "young", "")  # allocated a moment ago, its process not forked yet
    old = lease(policy, "old", "pid:9")
    with policy.store.writes().begin() as session:  # its lease began a minute ago
        for row in session.query(LeaseRow).filter(LeaseRow.user == "old"):
            row.since = old.since - timedelta(minutes=1)
    assert [closed.user for closed in policy.reconcile_now()] == ["old"]
    assert {held.user for held in policy.store.leases()} == {"starting", "young"}
    assert "starting" not in world.asked, "a spawn in flight is not even asked about"
    policy.reconcile_grace_seconds = 0.0
    policy.starting.discard(("starting", ""))
    assert {closed.user for closed in policy.reconcile_now()} == {"starting", "young"}


def test_a_lease_replaced_by_a_new_start_while_the_pass_asked_is_kept(tmp_path, policies):
    policy = policies(tmp_path, every=0)
    devices = [d.uuid for d in policy.devices]

    def alive(old: Lease) -> bool:
        # While the backend is asked about the old lease, a new start of the same server takes a new one.
        time.sleep(0.01)
        policy.store.allocate(old.user, old.server, 1, devices[1:])
        return False

    lease(policy, "ann", "pid:1")
    policy.reconcile(lambda held: True)
    policy._backend_hooks = policy._backend_hooks.__class__(alive, lambda: None, lambda held: None)
    assert policy.reconcile_now() == []
    kept = policy.store.lease_of("ann", "")
    assert kept is not None, "the new start's lease stays"
    assert kept.gpu_uuids == (devices[1],), "the new start's lease stays"
    assert ReconcileBook(policy.store).counts()["lease_closed"] == 0


def test_a_pass_that_raises_is_logged_and_the_loop_goes_on(tmp_path, policies, caplog):
    policy = policies(tmp_path, every=0.1)
    world = World()
    world.running.add("pid:1")
    lease(policy, "ann", "pid:1")
    failures = iter([RuntimeError("docker: connection refused")])

    def alive(held: Lease) -> bool:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return world.alive(held)

    policy.reconcile(lambda held: True, world.orphans)
    policy._backend_hooks = policy._backend_hooks.__class__(alive, world.orphans, world.gone_reason)
    world.running.clear()
    caplog.set_level(logging.ERROR, logger="workbench.policy")
    wait_until(lambda: policy.store.lease_of("ann", "") is None, 5, "a later pass to close the lease")
    assert any("reconcile: a pass failed" in r.getMessage() and r.exc_info for r in caplog.records)


def test_passes_never_overlap_and_the_first_call_is_the_only_one_that_waits(tmp_path, policies):
    policy = policies(tmp_path, every=0.01)
    inside, most = [0], [0]
    lock = threading.Lock()
    release = threading.Event()

    def alive(held: Lease) -> bool:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        release.wait(0.05)
        with lock:
            inside[0] -= 1
        return True

    lease(policy, "ann", "pid:1")
    policy.reconcile(alive)
    for _ in range(20):
        threading.Thread(target=policy.reconcile_soon).start()
        threading.Thread(target=policy.reconcile_now).start()
    started = time.monotonic()
    assert policy.reconcile(alive) == [], "later calls (each spawn's) return at once"
    assert time.monotonic() - started < 0.05
    time.sleep(1.0)
    assert most[0] == 1


def test_the_loop_ends_with_its_policy(tmp_path, policies):
    policy = policies(tmp_path, every=0.05)
    # Only this policy's loop: other tests' policies may still have theirs in this process.
    before = {t for t in threading.enumerate() if t.name == "workbench-reconcile"}
    policy.reconcile(lambda held: True)
    loops = [t for t in threading.enumerate() if t.name == "workbench-reconcile" and t not in before]
    assert len(loops) == 1
    assert loops[0].is_alive()
    policy.stop_reconciler()
    wait_until(lambda: not loops[0].is_alive(), 5, "the loop to end")


# -- the fake host backend: its hooks, through the spawner, as the hub runs them --------------------------------


def fake_spawner(world: FakeWorld, db_url: str, user: str):
    cls = type("ReconciledFakeHostSpawner", (FakeHostSpawner,), {"world": world})
    return cls(
        user=SimpleNamespace(name=user, url=f"/user/{user}/", escaped_name=user, groups=[]),
        hub=SimpleNamespace(public_host="", api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/"),
        orm_spawner=SimpleNamespace(name="", server=None),
        gpu_db_url=db_url,
        simulated_gpus="2",
        default_max_gpus=2,
        gpu_queue_timeout=0.3,
        reconcile_seconds=0,
    )


@pytest.fixture
def fake_hub(tmp_path):
    _policies.clear()
    yield f"sqlite:///{tmp_path / 'fake.sqlite'}"
    for policy in _policies.values():
        policy.stop_reconciler()
    _policies.clear()


def test_the_backends_own_gone_reason_is_the_ledgers_reason(fake_hub):
    world = FakeWorld()
    ann = fake_spawner(world, fake_hub, "ann")
    policy = ann.gpu_policy  # the first use: the first pass, with ann's bound hooks
    policy.reconcile_grace_seconds = 0.0
    policy.store.adopt("ann", "", ["GPU-sim-00-h100-80gb"], "fake:ann/", utcnow())
    world.ended["fake:ann/"] = reasons.EVICTED  # its runtime evicted it: no spawner polls it
    policy.reconcile_now()
    assert [row.reason for row in policy.store.usage(user="ann")] == [reasons.EVICTED]


def test_a_server_starting_is_never_taken_for_an_orphan(fake_hub):
    """A start whose process runs and whose lease has no ref yet: a pass in between adopts nothing and
    ends nothing; once it is no longer starting and has no lease, it is adopted on free GPUs or ended."""
    world = FakeWorld()
    probe = fake_spawner(world, fake_hub, "probe")
    policy = probe.gpu_policy
    policy.reconcile_grace_seconds = 0.0
    gpu0, gpu1 = (d.uuid for d in policy.devices)
    policy.store.allocate("ann", "", 1, [gpu0])  # its spawn placed it; start() forked the server...
    world.running["fake:ann/"] = ("ann", "", (gpu0,))  # ...which runs, before its lease names it
    policy.starting.add(("ann", ""))
    policy.reconcile_now()
    assert world.running
    assert world.cancelled == []
    assert policy.store.lease_of("ann", "").ref == ""
    policy.starting.discard(("ann", ""))
    policy.store.set_ref("ann", "", "fake:ann/")  # start() returned
    policy.reconcile_now()
    assert world.cancelled == []
    assert policy.store.lease_of("ann", "").gpu_uuids == (gpu0,)
    # An orphan on a GPU leased to another server is ended, one on free GPUs adopted; both counted.
    world.running["fake:old/"] = ("old", "", (gpu0,))
    world.running["fake:lost/"] = ("lost", "", (gpu1,))
    policy.reconcile_now()
    assert world.cancelled == ["fake:old/"]
    assert policy.store.lease_of("lost", "").ref == "fake:lost/"
    counts = ReconcileBook(policy.store).counts()
    assert (counts["server_stopped"], counts["server_adopted"]) == (1, 1)


def test_fixes_counted_by_many_writers_at_once_are_all_kept(store):
    # Two hubs (or a hub and its backend's orphan rule) count at once: no increment may be lost.
    from concurrent.futures import ThreadPoolExecutor

    from workbench_spawner.ledger.reconcile_book import LEASE_CLOSED, ReconcileBook

    book = ReconcileBook(store)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: book.count(LEASE_CLOSED), range(80)))
    assert book.counts()[LEASE_CLOSED] == 80
