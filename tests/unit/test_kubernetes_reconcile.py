"""Reconcile after a hub restart on Kubernetes, as a table of this hub's pods: each is adopted (a lease
with its user, server, GPUs, node and start), deleted (with why) or left, against the real ledger.
(Pods that survive a real hub restart: tests/kubernetes.)"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from workbench_spawner.backends.kubernetes.cluster import KubernetesUnavailableError
from workbench_spawner.backends.kubernetes.manifests import ANNOTATION_GPUS, LABEL_HUB, LABEL_SERVER, LABEL_USER
from workbench_spawner.backends.kubernetes.reconcile import WORDS, reconcile_pods
from workbench_spawner.ledger.reconcile_book import SERVER_ADOPTED, SERVER_STOPPED
from workbench_spawner.placement.engine_reconcile import Action

HUB_STARTED = datetime(2026, 12, 8, 10, 0, tzinfo=UTC).timestamp()
BEFORE = "2026-12-08T09:00:00Z"
AFTER = "2026-12-08T10:00:05Z"


def pod(
    name: str,
    user: str = "carol",
    server: str = "",
    node: str | None = "n1",
    gpus: int = 1,
    annotated: str | None = None,
    phase: str = "Running",
    created: str = BEFORE,
    namespace: str = "wb",
    deleting: bool = False,
) -> dict:
    """One of this hub's pods as the API lists it (names, labels and annotations as the spawner writes them)."""
    annotations = {LABEL_USER: user, LABEL_SERVER: server}
    if annotated is not None:
        annotations[ANNOTATION_GPUS] = annotated
    metadata = {
        "name": name,
        "namespace": namespace,
        "creationTimestamp": created,
        "labels": {LABEL_HUB: "1a2b3c4d", LABEL_USER: user.lower(), LABEL_SERVER: server or "default"},
        "annotations": annotations,
    }
    if deleting:
        metadata["deletionTimestamp"] = "2026-12-08T10:00:01Z"
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    spec = {"containers": [{"name": "notebook", "resources": {"limits": limits}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": metadata, "spec": spec, "status": {"phase": phase, "startTime": "2026-12-08T09:00:30Z"}}


def reconcile(store, pods: list[dict]) -> tuple[list[tuple[str, str, str]], list[str]]:
    deleted: list[str] = []
    actions = reconcile_pods(pods, store.leases(), store.adopt, deleted.append, HUB_STARTED)
    return [(a.ident, a.what, a.why) for a in actions], deleted


@pytest.mark.parametrize(
    ("the_pod", "action"),
    [
        # its lease survived the restart: nothing to do
        (pod("held", user="dave", annotated="GPU-h"), None),
        # created by this hub process: a spawn is following it
        (pod("new", node=None, created=AFTER), ("new", "left", "created by this hub process")),
        # pending, and the spawn that waited for it is gone: it must not take a GPU later
        (pod("pending", node=None, phase="Pending"), ("pending", "deleted", "not scheduled, no spawn waiting")),
        # CPU-only: JupyterHub's own business
        (pod("cpu", gpus=0), ("cpu", "left", "CPU-only")),
        # the hub stopped between the lease and the annotation: nobody can say which GPUs it has
        (pod("unnamed"), ("unnamed", "deleted", "its GPUs were never recorded")),
        (pod("half", gpus=2, annotated="GPU-c"), ("half", "deleted", "its GPUs were never recorded")),
        # its GPU is another server's now
        (pod("taken", annotated="GPU-h"), ("taken", "deleted", "its GPUs are leased to another server")),
        # ended or ending pods hold nothing and are JupyterHub's to clean up
        (pod("done", annotated="GPU-c", phase="Succeeded"), None),
        (pod("failed", node=None, phase="Failed"), None),
        (pod("going", annotated="GPU-c", deleting=True), None),
    ],
)
def test_reconcile_rule(store, the_pod, action):
    store.adopt("dave", "", ["GPU-h"], "k8s:wb/held", node="n1")
    actions, deleted = reconcile(store, [the_pod])
    assert actions == ([action] if action else [])
    assert deleted == ([action[0]] if action and action[1] == "deleted" else [])
    assert [(lease.user, lease.ref) for lease in store.leases()] == [("dave", "k8s:wb/held")]  # nobody else got one


def test_a_running_annotated_pod_whose_gpus_are_free_is_adopted_as_it_was(store):
    the_pod = pod("wb-1a2b3c4d-carol-2dlab", user="Carol", server="lab", node="n2", gpus=2, annotated="GPU-c,GPU-d")
    actions, deleted = reconcile(store, [the_pod])
    assert actions == [("wb-1a2b3c4d-carol-2dlab", "adopted", "")]
    assert deleted == []
    lease = store.lease_of("Carol", "lab")  # the exact names from the annotations, not the label slugs
    assert lease.gpu_uuids == ("GPU-c", "GPU-d")
    assert lease.node == "n2"
    assert lease.ref == "k8s:wb/wb-1a2b3c4d-carol-2dlab"
    assert lease.since == datetime(2026, 12, 8, 9, 0, 30, tzinfo=UTC)  # when the pod started, not now


def test_a_lease_in_another_namespace_is_not_this_pods(store):
    store.adopt("dave", "", ["GPU-h"], "k8s:other/same-name", node="n1")
    actions, deleted = reconcile(store, [pod("same-name", annotated="GPU-c", namespace="wb")])
    assert actions == [("same-name", "adopted", "")]
    assert deleted == []
    assert store.lease_of("carol", "").ref == "k8s:wb/same-name"
    # and the pod of the lease's own namespace is left alone
    assert reconcile(store, [pod("same-name", user="dave", annotated="GPU-h", namespace="other")]) == ([], [])


def test_one_pass_over_many_pods_decides_each_once(store):
    store.adopt("dave", "", ["GPU-h"], "k8s:wb/held", node="n1")
    pods = [
        pod("held", user="dave", annotated="GPU-h"),
        pod("a", user="erin", annotated="GPU-e"),
        pod("b", user="fay", annotated="GPU-e"),  # the same GPU: the first pod got it
        pod("c", node=None, phase="Pending"),
        pod("d", gpus=0),
    ]
    actions = reconcile_pods(pods, store.leases(), store.adopt, lambda name: None, HUB_STARTED)
    assert actions == [
        Action("a", "adopted"),
        Action("b", "deleted", "its GPUs are leased to another server"),
        Action("c", "deleted", "not scheduled, no spawn waiting"),
        Action("d", "left", "CPU-only"),
    ]
    assert sorted((lease.user, lease.gpu_uuids) for lease in store.leases()) == [
        ("dave", ("GPU-h",)),
        ("erin", ("GPU-e",)),
    ]


def test_without_a_process_start_every_pod_is_an_orphan(store):
    deleted: list[str] = []
    actions = reconcile_pods([pod("new", node=None, created=AFTER)], [], store.adopt, deleted.append)
    assert [(a.ident, a.what) for a in actions] == [("new", "deleted")]
    assert deleted == ["new"]


def test_a_pod_the_api_server_does_not_delete_is_logged_and_the_next_one_is_still_deleted(store, caplog):
    deleted: list[str] = []

    def delete(name: str) -> None:
        if name == "first":
            raise KubernetesUnavailableError("connection refused")
        deleted.append(name)

    pods = [pod("first", node=None), pod("second", node=None)]
    actions = reconcile_pods(pods, [], store.adopt, delete, HUB_STARTED)
    assert [(a.ident, a.what) for a in actions] == [("first", "deleted"), ("second", "deleted")]
    assert deleted == ["second"]
    assert "Could not delete pod first: connection refused" in caplog.text
    assert WORDS.fixes == {"adopted": SERVER_ADOPTED, "deleted": SERVER_STOPPED}
