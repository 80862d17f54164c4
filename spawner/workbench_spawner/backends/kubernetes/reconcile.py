"""After a hub restart: this hub's pods without a lease, adopted or deleted by one rule.

Pods keep running while the hub is down (``cleanup_servers = False``). The
policy first releases every lease whose pod is gone
(``KubernetesGPUSpawner.gpu_lease_alive``). Then, for the pods labelled with
this hub's id (``workbench.hub``) that have no lease and were created before
this hub process:

* **not scheduled yet**: the spawn that waited for it is gone with the old
  hub process, so it is deleted (a pod nobody waits for must not take a GPU);
* **running** with GPUs named by its ``workbench.gpus`` annotation (written
  when its lease was) that nobody else holds: adopted, a lease is written
  with the pod's node and start time;
* **running** with GPUs but no annotation (the hub stopped between the lease
  and the annotation) or with GPUs leased to another server: deleted;
* **running CPU-only**: left to JupyterHub (it holds no GPU).

The rule is the engines' shared one (``placement.engine_reconcile``); this
module reads a pod for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from workbench_spawner.backends.kubernetes.cluster import (
    ENDED_PHASES,
    KubernetesUnavailableError,
    pod_gpu_request,
    pod_slice_requests,
)
from workbench_spawner.backends.kubernetes.manifests import ANNOTATION_GPUS, LABEL_SERVER, LABEL_USER
from workbench_spawner.ledger.store import Lease
from workbench_spawner.placement.engine_reconcile import Action, Adopt, Orphan, ReconcileWords, reconcile_walk

log = logging.getLogger("workbench.kubernetes")


def _when(stamp: str | None) -> datetime | None:
    """An API timestamp ("2024-05-01T09:00:00Z") as a UTC datetime; None if absent or unreadable."""
    try:
        return datetime.fromisoformat(stamp or "").astimezone(UTC)
    except ValueError:
        return None


WORDS = ReconcileWords(
    noun="pod",
    ended="deleted",
    end_verb="Deleting",
    end_failed="Could not delete pod",
    pending_why="not scheduled, no spawn waiting",
    unknown_why="its GPUs were never recorded",
)


def reconcile_pods(
    pods: Sequence[Mapping[str, Any]],
    leases: Iterable[Lease],
    adopt: Adopt,
    delete: Callable[[str], None],
    created_before: float | None = None,
    resource: str = "nvidia.com/gpu",
) -> list[Action]:
    """Apply the rule above to this hub's ``pods`` (dicts as the API gives them); every decision is returned."""
    leased = {lease.ref for lease in leases}
    orphans = (_orphan(p, leased, created_before, resource) for p in pods)
    return reconcile_walk(orphans, adopt, delete, WORDS, log, KubernetesUnavailableError)


def _orphan(pod: Mapping[str, Any], leased: set[str], created_before: float | None, resource: str) -> Orphan | None:
    """The pod as reconcile reads it; None: leased, being deleted or ended."""
    metadata = pod.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    name = str(metadata.get("name", ""))
    ref = f"k8s:{metadata.get('namespace', '')}/{name}"
    user = annotations.get(LABEL_USER) or (metadata.get("labels") or {}).get(LABEL_USER, "")
    server = annotations.get(LABEL_SERVER, "")
    if ref in leased or metadata.get("deletionTimestamp"):
        return None
    created = _when(metadata.get("creationTimestamp"))
    if created_before is not None and created is not None and created.timestamp() >= created_before:
        return Orphan(name, user, server, left="created by this hub process")
    if (pod.get("status") or {}).get("phase") in ENDED_PHASES:
        return None
    node = (pod.get("spec") or {}).get("nodeName")
    if not node:
        return Orphan(name, user, server, pending=True)
    # Whole GPUs, or MIG slices (nvidia.com/mig-<profile>): a slice pod is not a CPU-only one.
    wanted = pod_gpu_request(pod, resource) + sum(pod_slice_requests(pod).values())
    if not wanted:
        return Orphan(name, user, server, left="CPU-only")
    uuids: list[str | None] = [u for u in (annotations.get(ANNOTATION_GPUS) or "").split(",") if u]
    if len(uuids) != wanted:  # the hub stopped between the lease and the annotation
        uuids = [None] * wanted
    since = _when((pod.get("status") or {}).get("startTime"))
    return Orphan(name, user, server, ref, str(node), since, uuids=uuids)
