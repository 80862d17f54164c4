"""The reconciler's view of a lease's pod (backends/kubernetes/pod_leases.py), with the API's pod list stubbed."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from workbench_devices import DeviceInventory, parse_simulated_spec
from workbench_spawner.backends.kubernetes import cluster, pod_leases
from workbench_spawner.backends.kubernetes.manifests import ANNOTATION_GPUS, LABEL_HUB, LABEL_SERVER, LABEL_USER
from workbench_spawner.ledger import reasons
from workbench_spawner.ledger.store import Lease

HUB = "1a2b3c4d"


def lease(ref: str) -> Lease:
    return Lease("alice", "", ("GPU-a",), datetime(2026, 1, 1, tzinfo=UTC), ref=ref, node="n1")


def pod(name: str, phase: str = "Running", deleting: bool = False) -> dict:
    metadata = {"name": name, "labels": {LABEL_HUB: HUB}, **({"deletionTimestamp": "now"} if deleting else {})}
    return {"metadata": metadata, "spec": {"nodeName": "n1"}, "status": {"phase": phase}}


@pytest.fixture
def pods(monkeypatch):
    """The pods the API lists (``None``: the API server does not answer); each test a fresh cache."""
    listed: dict[str, list[dict] | None] = {"pods": []}

    def list_pods(namespace: str, selector: str) -> list[dict]:
        assert (namespace, selector) == ("ns", f"{LABEL_HUB}={HUB}")  # only this hub's pods, ever
        if listed["pods"] is None:
            raise cluster.KubernetesUnavailableError("the API server did not answer (timeout)")
        return listed["pods"]

    monkeypatch.setattr(cluster, "list_pods", list_pods)
    monkeypatch.setattr(pod_leases, "_pods_cache", {})
    monkeypatch.setattr(pod_leases, "hub_deleting", set())
    return listed


@pytest.mark.parametrize(
    ("ref", "listed", "alive"),
    [
        ("k8s:ns/jupyter-alice", [pod("jupyter-alice")], True),
        ("k8s:ns/jupyter-alice", [pod("jupyter-alice", "Pending")], False),
        ("k8s:ns/jupyter-alice", [pod("jupyter-alice", deleting=True)], False),
        ("k8s:ns/jupyter-alice", [pod("jupyter-bob")], False),
        ("k8s:ns/jupyter-alice", None, None),  # the API server cannot say
        ("pid:123", [pod("jupyter-alice")], False),  # not a pod's lease
        ("k8s:ns", [pod("jupyter-alice")], False),  # no pod named
    ],
)
def test_whether_a_leases_pod_runs(pods, ref, listed, alive):
    pods["pods"] = listed
    assert pod_leases.lease_alive(lease(ref), HUB) is alive


def test_one_listing_answers_every_lease_of_a_reconcile_pass(pods, monkeypatch):
    calls = []
    listed = cluster.list_pods
    monkeypatch.setattr(cluster, "list_pods", lambda *args: calls.append(args) or listed(*args))
    pods["pods"] = [pod("jupyter-alice")]
    alive = [pod_leases.lease_alive(lease(f"k8s:ns/{name}"), HUB) for name in ("jupyter-alice", "jupyter-bob")]
    assert (alive, len(calls)) == ([True, False], 1)


def test_each_namespace_and_selector_is_a_listing_of_its_own(monkeypatch):
    monkeypatch.setattr(cluster, "list_pods", lambda namespace, selector: [pod(f"{namespace}/{selector}")])
    monkeypatch.setattr(pod_leases, "_pods_cache", {})
    keys = [("ns", "a=1"), ("ns", "a=2"), ("other", "a=1")]
    assert [pod_leases.recent_pods(*key)[0]["metadata"]["name"] for key in keys] == ["ns/a=1", "ns/a=2", "other/a=1"]


def test_a_pod_the_hub_is_deleting_is_neither_alive_nor_gone(pods):
    pods["pods"] = [pod("jupyter-alice")]
    pod_leases.hub_deleting.add("ns/jupyter-alice")
    assert pod_leases.lease_alive(lease("k8s:ns/jupyter-alice"), HUB) is None


def test_why_a_leases_pod_is_gone(pods, monkeypatch):
    monkeypatch.setattr(cluster, "node_condition", lambda name: (cluster.NodeState.READY, ""))
    pods["pods"] = [pod("jupyter-alice", deleting=True)]
    ending = pod_leases.lease_gone_reason(lease("k8s:ns/jupyter-alice"), HUB)
    assert ending is not None
    assert ending.reason == reasons.POD_DELETED
    pods["pods"] = None
    pod_leases._pods_cache.clear()
    assert pod_leases.lease_gone_reason(lease("k8s:ns/jupyter-alice"), HUB) is None  # the API cannot say
    assert pod_leases.lease_gone_reason(lease("pid:123"), HUB) is None


def test_reconcile_deletes_the_pods_whose_stop_failed_and_adopts_a_slice_pod_by_its_share(pods, store, monkeypatch):
    inventory = DeviceInventory("simulated", parse_simulated_spec("1xH200-141GB:mig=1x1g.18gb", "n1"))
    (mig,) = [d.uuid for d in inventory.devices if d.mig]
    orphan = pod("wb-1a2b3c4d-carol")
    orphan["metadata"].update(
        creationTimestamp="2026-01-01T09:00:00Z",  # before this hub process: an earlier hub's spawn
        annotations={LABEL_USER: "carol", LABEL_SERVER: "", ANNOTATION_GPUS: mig},
    )
    orphan["spec"]["containers"] = [{"resources": {"limits": {"nvidia.com/mig-1g.18gb": "1"}}}]
    pods["pods"] = [orphan]
    deleted = []
    monkeypatch.setattr(cluster, "delete_pod", lambda *args, **kwargs: deleted.append((args, kwargs)))
    monkeypatch.setattr(pod_leases, "left_pods", {"ns/wb-1a2b3c4d-bob": "uid-1"})
    fixes: list[str] = []
    policy = SimpleNamespace(
        store=store,
        inventory=inventory,
        record_fix=lambda kind, line: fixes.append(line),
        count_fixes=lambda whats, kinds: fixes.extend(whats),
    )

    pod_leases.reconcile_orphans(policy, "ns", HUB, logging.getLogger("test"))

    assert deleted == [(("ns", "wb-1a2b3c4d-bob", 0), {"uid": "uid-1"})]  # by uid: never a newer pod of the name
    assert pod_leases.left_pods == {}
    (lease,) = store.leases()
    assert (lease.user, lease.gpu_uuids, lease.shares) == ("carol", (mig,), pytest.approx((1 / 7,)))
    assert fixes == [
        "reconcile: deleted pod ns/wb-1a2b3c4d-bob, whose stop failed while the Kubernetes API did not answer",
        "adopted",
    ]
