"""The backend contract's conformance suite: the same scenarios on every backend.

Each scenario runs on six tiers (``tiers.py``, ``fake_tier.py``, ``hub_tiers.py``):

* ``fake-host`` and ``fake-engine``: the reference implementations
  (``tests/unit/fake_backends.py``), in-process, in milliseconds;
* ``local``: a real hub whose servers are processes on this machine;
* ``docker``: a real hub on the Docker engine (the stand-in NVIDIA hook);
* ``slurm``: a real hub on the two-node Slurm cluster (``tests/slurm/cluster.sh``);
* ``kubernetes``: a real hub beside a real Kubernetes 1.20 control plane and node
  (``tests/kubernetes/cluster.sh``), its pods placed by the scheduler.

Every tier offers four GPUs and a default quota of two at once. A backend
conforms when it passes all of them: start pinned or placed, two servers
never on one GPU, stop and poll release, a failed start leaves nothing,
nothing free is a 503 in words after the queue timeout, a quota refusal
starts nothing, a hub restart keeps running servers and their GPUs,
reconcile releases leases without servers and keeps servers without
leases, a server whose GPUs the ledger gave to another is ended, the
reconciler closes a lease whose server ended while the hub runs within one
pass, and the progress page names the GPUs. The contract's static checks (members,
entry points) are in ``tests/unit/test_backend_contract.py``.
"""

from __future__ import annotations

import re

import pytest

from tests.conformance.fake_tier import FakeTier
from tests.conformance.hub_tiers import DockerTier, KubernetesTier, LocalTier, SlurmTier
from tests.conformance.tiers import QUOTA
from tests.conftest import hub_pool, wait_until
from tests.unit.fake_backends import FakeEngineSpawner, FakeHostSpawner
from workbench_spawner.ledger import reasons

TIERS = [
    pytest.param("fake-host", id="fake-host"),
    pytest.param("fake-engine", id="fake-engine"),
    pytest.param("local", id="local", marks=pytest.mark.integration),
    pytest.param("docker", id="docker", marks=[pytest.mark.docker, pytest.mark.integration]),
    pytest.param("slurm", id="slurm", marks=[pytest.mark.slurm, pytest.mark.integration]),
    pytest.param("kubernetes", id="kubernetes", marks=[pytest.mark.kubernetes, pytest.mark.integration]),
]
FAKES = {"fake-host": FakeHostSpawner, "fake-engine": FakeEngineSpawner}


@pytest.fixture(scope="module", params=TIERS)
def tier_factory(request, tmp_path_factory):
    """make() -> the tier for one test: a fresh fake, or this module's one hub of that backend."""
    kind = request.param
    if kind in FAKES:
        yield lambda: FakeTier(FAKES[kind], str(tmp_path_factory.mktemp(kind) / "wb.sqlite"))
        return
    with hub_pool(tmp_path_factory.mktemp(f"conformance-{kind}")) as start:
        if kind == "local":
            hub = LocalTier(start)
        elif kind == "docker":
            hub = DockerTier(start, request.getfixturevalue("singleuser_image"))
        elif kind == "kubernetes":
            from tests.kubernetes.kube import hub_env

            cluster = request.getfixturevalue("k8s_cluster")
            namespace = request.getfixturevalue("k8s_module_namespace")
            image = request.getfixturevalue("singleuser_image")
            hub = KubernetesTier(start, hub_env(cluster, namespace, image), namespace)
        else:
            request.getfixturevalue("slurm_cluster")
            from tests.slurm.conftest import USERS, hub_env

            hub = SlurmTier(start, hub_env(), USERS[:5])
        yield lambda: hub


@pytest.fixture
def tier(tier_factory):
    tier = tier_factory()
    try:
        yield tier
    finally:
        tier.cleanup()
        if isinstance(tier, FakeTier):
            tier.close()
        else:
            assert tier.leases() == {}, "a scenario left a lease behind"


def eventually(predicate, what: str, timeout: float = 60) -> None:
    wait_until(predicate, timeout, what, every=0.5)


def test_start_pins_or_places_the_server_and_records_the_lease(tier):
    (alice,) = tier.users("alice")
    spawned = tier.spawn(alice, gpus=1)
    assert spawned.ok, spawned
    leased = tier.leases()[alice]
    assert len(leased) == 1
    assert tier.pinned(alice) == leased, "the runtime gave the server exactly its leased GPU"
    assert tier.lease_ref(alice), "the lease names the server in the runtime"
    assert tier.runs(alice)


def test_two_servers_never_share_a_gpu(tier):
    alice, bob = tier.users("alice", "bob")
    for user in (alice, bob):
        spawned = tier.spawn(user, gpus=QUOTA)
        assert spawned.ok, spawned
    leases = tier.leases()
    assert len(leases[alice]) == len(leases[bob]) == QUOTA
    assert set(leases[alice]).isdisjoint(leases[bob])
    assert tier.pinned(alice) == leases[alice]
    assert tier.pinned(bob) == leases[bob]


def test_stop_releases_and_a_server_that_ends_outside_the_hub_is_released_by_poll(tier):
    (alice,) = tier.users("alice")
    assert tier.spawn(alice, gpus=1).ok
    tier.stop(alice)
    assert alice not in tier.leases()
    eventually(lambda: not tier.runs(alice), "the stopped server to end in the runtime")

    assert tier.spawn(alice, gpus=1).ok
    tier.end_outside(alice)  # it crashed, or an operator ended it
    tier.wait_released(alice)
    assert tier.leases() == {}
    assert not tier.listed(alice)


def test_a_failed_start_leaves_no_lease_and_nothing_running(tier):
    (alice,) = tier.users("alice")
    with tier.failing():
        spawned = tier.spawn(alice, gpus=1)
        assert not spawned.ok, spawned
        tier.wait_released(alice)
        assert tier.leases() == {}
        assert not tier.runs(alice)
    # The GPU went back: the next start gets it.
    assert tier.spawn(alice, gpus=1).ok


def test_nothing_free_is_a_503_in_words_after_the_queue_timeout(tier):
    first, second, late = tier.users("first", "second", "late")
    for user in (first, second):
        assert tier.spawn(user, gpus=QUOTA).ok  # every GPU held
    spawned = tier.spawn(late, gpus=1)
    assert not spawned.ok
    # The hub answers 503 when the timeout beats its slow-spawn wait (10 s); else the spawn page says it.
    assert spawned.status in (202, 503), spawned
    assert re.search(r"\bGPUs?\b|\bjob\b", spawned.message), spawned
    assert any(re.search(r"in line|pending", m) for m in spawned.progress), spawned.progress
    tier.wait_released(late)
    assert set(tier.leases()) == {first, second}
    assert not tier.runs(late)


def test_a_refusal_by_the_quota_is_a_403_that_starts_nothing(tier):
    (alice,) = tier.users("alice")
    spawned = tier.spawn(alice, gpus=QUOTA + 1)
    assert (spawned.ok, spawned.status) == (False, 403), spawned
    assert f"allows {QUOTA} at once" in spawned.message
    assert tier.leases() == {}
    assert not tier.listed(alice)
    assert not tier.runs(alice)


def test_a_hub_restart_keeps_a_running_server_and_its_gpus(tier):
    (alice,) = tier.users("alice")
    assert tier.spawn(alice, gpus=1).ok
    leased, ref = tier.leases()[alice], tier.lease_ref(alice)
    tier.restart_hub()
    eventually(lambda: tier.listed(alice), "the restarted hub to list the running server")
    assert tier.leases() == {alice: leased}
    assert tier.lease_ref(alice) == ref
    assert tier.runs(alice)
    assert tier.pinned(alice) == leased


def test_reconcile_releases_leases_without_servers_and_keeps_servers_without_leases(tier):
    gone, kept = tier.users("gone", "kept")
    for user in (gone, kept):
        assert tier.spawn(user, gpus=1).ok
    kept_gpus, kept_ref = tier.leases()[kept], tier.lease_ref(kept)

    def while_down():
        tier.end_outside(gone)  # its server ended while the hub was down
        tier.forget_lease(kept)  # its server runs, its lease row is lost

    tier.restart_hub(while_down)
    eventually(lambda: tier.leases() == {kept: kept_gpus}, "reconcile to release one lease and restore the other")
    assert tier.lease_ref(kept) == kept_ref
    assert tier.runs(kept)
    eventually(lambda: not tier.listed(gone), "the hub to forget the server that ended")


def test_a_server_whose_gpus_the_ledger_gave_to_another_is_ended(tier):
    loser, holder = tier.users("loser", "holder")
    for user in (loser, holder):
        assert tier.spawn(user, gpus=1).ok
    taken = tier.leases()[loser]
    # While the hub is down the ledger comes to say the holder's server has the loser's GPU
    # (a database restored from a backup): the ledger wins, the loser's server must end.
    tier.restart_hub(lambda: tier.move_lease(loser, holder))
    eventually(lambda: not tier.runs(loser), "the server on another's GPU to be ended")
    eventually(lambda: not tier.listed(loser), "the hub to forget the ended server")
    assert tier.leases() == {holder: taken}
    assert tier.runs(holder)


def test_servers_the_hub_forgot_are_adopted_on_free_gpus_and_ended_on_taken_ones(tier):
    adopted, ended, holder = tier.users("adopted", "ended", "holder")
    for user in (adopted, ended, holder):
        assert tier.spawn(user, gpus=1).ok
    before, ref = tier.leases(), tier.lease_ref(adopted)

    def while_down():
        # The hub's database lost both servers and their leases (restored from an old backup),
        # and in it the holder's lease names the GPU the ended one runs on.
        tier.forget_server(adopted)
        tier.forget_lease(adopted)
        tier.forget_server(ended)
        tier.move_lease(ended, holder)

    tier.restart_hub(while_down)
    eventually(lambda: not tier.runs(ended), "the forgotten server on another's GPU to be ended")
    assert tier.leases() == {adopted: before[adopted], holder: before[ended]}
    assert tier.lease_ref(adopted) == ref, "the forgotten server on free GPUs is adopted"
    assert tier.runs(adopted), "the forgotten server on free GPUs is adopted"


def test_the_progress_page_names_the_gpus_the_server_got(tier):
    (alice,) = tier.users("alice")
    spawned = tier.spawn(alice, gpus=1)
    assert spawned.ok, spawned
    (uuid,) = tier.leases()[alice]
    assert any(uuid in message for message in spawned.progress), spawned.progress


# A reason that says the hub or the user ended the server (a stop, poll's "server exited"), not the reconciler.
# Who asked for a stop is known only to the stop itself, never to the reconciler.
ASKED_FOR = {reasons.STOPPED_BY_USER, reasons.STOPPED_BY_ADMIN, reasons.STOPPED_BY_CULLER, reasons.STOPPED_BY_SERVICE}


def test_the_reconciler_closes_a_lease_whose_server_is_gone_within_one_pass_with_its_reason(tier):
    """While the hub runs, the ledger says a server runs that does not (its release was lost; the hub
    tracks no server that a poll could find dead): the reconciler's next pass closes the lease, with the
    backend's reason in the ledger's words, counts the fix, and the GPU is free again."""
    (alice,) = tier.users("alice")
    assert tier.spawn(alice, gpus=1).ok
    rows = tier.lease_rows(alice)
    tier.stop(alice)
    eventually(lambda: not tier.runs(alice), "the stopped server to end in the runtime")
    stopped = len(tier.usage_reasons(alice))
    closed_before = tier.reconcile_fixes().get("lease_closed", 0)
    tier.put_back(rows)
    assert alice in tier.leases()

    def closed() -> bool:
        tier.reconcile_pass()
        return alice not in tier.leases()

    eventually(closed, "the reconciler to close the lease of a server that is gone", timeout=30)
    reason = tier.usage_reasons(alice)[stopped]
    # The backend's words for how it ended ("server exited" for a process or container that is gone, "stopped"
    # where the engine says this hub cancelled the job), never a requester the reconciler cannot know.
    kind = reasons.reason_kind(reason)  # the words before the detail ("server exited: exit code 0")
    assert kind in reasons.ALL, reason
    assert kind not in ASKED_FOR, reason
    assert tier.reconcile_fixes()["lease_closed"] == closed_before + 1
    assert tier.spawn(alice, gpus=1).ok, "its GPU is free again"
