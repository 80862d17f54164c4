"""The ledger's view of this hub's pods: which lease's pod runs, why one is gone, and the pods left over.

The reconciler's side of ``KubernetesGPUSpawner`` (blocking functions, run in
its worker thread): the spawner's contract members ``gpu_lease_alive``,
``gpu_lease_gone_reason`` and ``gpu_reconcile_orphans`` call these with the
hub's id, so a lease is only ever matched with a pod of this hub. The rule
for pods without a lease is ``reconcile.py``'s; why a pod ended,
``ending.py``'s. Pods whose stop failed while the API server was away are
remembered here by uid and deleted by the next pass.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from workbench_spawner.backends.kubernetes import cluster
from workbench_spawner.backends.kubernetes.cluster import NodeState
from workbench_spawner.backends.kubernetes.ending import needs_node, node_name, pod_ending
from workbench_spawner.backends.kubernetes.manifests import LABEL_HUB
from workbench_spawner.backends.kubernetes.reconcile import WORDS, reconcile_pods
from workbench_spawner.ledger.endings import Ending
from workbench_spawner.ledger.reconcile_book import SERVER_STOPPED
from workbench_spawner.ledger.store import Lease
from workbench_spawner.placement.engine_fleet import Recent
from workbench_spawner.placement.engine_reconcile import adopter
from workbench_spawner.policy.gpu_policy import GPUPolicy

# Pods created after this are this process's own spawns, never orphans of an earlier hub.
PROCESS_STARTED = time.time()

# "namespace/pod" of the pods the hub is deleting now (a stop): their disappearance is no outside deletion.
hub_deleting: set[str] = set()
# "namespace/pod" -> uid of pods whose stop failed (the API server was away): deleted by the next reconcile pass.
left_pods: dict[str, str] = {}
# (namespace, selector) -> that listing of pods, read at most every 2 s (reconcile asks once per lease).
_pods_cache: dict[tuple[str, str], Recent[list[dict[str, Any]]]] = {}


def lease_pod_key(lease: Lease) -> str:
    """ "namespace/pod" of a ``k8s:<namespace>/<name>`` lease ("" for a lease of anything else)."""
    if not lease.ref.startswith("k8s:") or not lease.ref[4:].partition("/")[2]:
        return ""
    return lease.ref[4:]


def pod_of(lease: Lease, hub: str) -> dict | None:
    """The pod a ``k8s:`` lease names, as the API lists it now (None: no such pod of this hub); blocking, and
    KubernetesUnavailableError when the API server cannot say."""
    namespace, _, name = lease_pod_key(lease).partition("/")
    pods = recent_pods(namespace, f"{LABEL_HUB}={hub}")
    return next((p for p in pods if p["metadata"]["name"] == name), None)


def lease_alive(lease: Lease, hub: str) -> bool | None:
    """Whether the lease's pod runs. None, unknown, while the API server does not answer and while the hub
    itself is deleting the pod (its stop records why it ended)."""
    key = lease_pod_key(lease)
    if not key:
        return False
    if key in hub_deleting:
        return None
    try:
        pod = pod_of(lease, hub)
    except cluster.KubernetesUnavailableError:
        return None
    return bool(pod and not pod["metadata"].get("deletionTimestamp") and pod["status"].get("phase") == "Running")


def lease_gone_reason(lease: Lease, hub: str) -> Ending | None:
    """Why the pod of ``lease`` is gone, from the pod as the API lists it now (None: the API cannot say)."""
    if not lease_pod_key(lease):
        return None
    try:
        pod = pod_of(lease, hub)
    except cluster.KubernetesUnavailableError:
        return None
    node, condition = NodeState.UNKNOWN, ""
    if needs_node(pod, pod is None):
        node, condition = cluster.node_condition(node_name(pod) or lease.node)
    return pod_ending(pod, pod is None, node, condition)


def reconcile_orphans(policy: GPUPolicy, namespace: str, hub: str, log: logging.Logger) -> None:
    """Delete the pods whose stop failed, then adopt or delete this hub's pods without a lease (``reconcile.py``)."""
    for line in delete_left_pods(log):
        policy.record_fix(SERVER_STOPPED, line)
    store = policy.store
    try:
        pods = cluster.list_pods(namespace, f"{LABEL_HUB}={hub}")
    except cluster.KubernetesUnavailableError as exc:
        log.warning("Cannot list pods to reconcile GPU leases: %s", exc)
        return
    actions = reconcile_pods(
        pods,
        store.leases(),
        adopter(store, policy.inventory),
        lambda name: cluster.delete_pod(namespace, name, 0),
        PROCESS_STARTED,
    )
    policy.count_fixes([action.what for action in actions], WORDS.fixes)  # counted on /metrics; each was logged


def delete_left_pods(log: logging.Logger) -> list[str]:
    """Delete the pods whose stop failed while the API server was away (the reconciler's pass); returns one
    line for each pod deleted (a fix to count and log).

    By uid: a new pod of the same server (same name) started since is never touched. One that is gone
    already, or replaced, is forgotten; one the API server still does not answer for is tried next pass."""
    done = []
    for key, uid in list(left_pods.items()):
        namespace, _, name = key.partition("/")
        try:
            cluster.delete_pod(namespace, name, 0, uid=uid)
        except cluster.KubernetesUnavailableError as exc:
            log.warning("Pod %s, whose stop failed, is still to be deleted: %s", key, exc)
            continue
        left_pods.pop(key, None)
        done.append(f"reconcile: deleted pod {key}, whose stop failed while the Kubernetes API did not answer")
    return done


def recent_pods(namespace: str, selector: str) -> list[dict[str, Any]]:
    """The pods ``selector`` picks in ``namespace``, read at most every 2 s; KubernetesUnavailableError reaches
    the caller."""
    listing = Recent(lambda: cluster.list_pods(namespace, selector), max_age=2.0)
    return _pods_cache.setdefault((namespace, selector), listing)() or []
