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
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from workbench_spawner.backends.kubernetes.cluster import ENDED_PHASES, pod_gpu_request, pod_slice_requests
from workbench_spawner.backends.kubernetes.manifests import ANNOTATION_GPUS, LABEL_SERVER, LABEL_USER
from workbench_spawner.ledger.store import Lease

log = logging.getLogger("workbench.kubernetes")


@dataclass(frozen=True)
class Action:
    """What reconcile did with one pod: "adopted", "deleted" (with why) or "left"."""

    pod: str
    what: str
    why: str = ""


def _created(pod: Mapping[str, Any]) -> float:
    stamp = (pod.get("metadata") or {}).get("creationTimestamp") or ""
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _started(pod: Mapping[str, Any]) -> datetime | None:
    stamp = (pod.get("status") or {}).get("startTime") or ""
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None


def reconcile_pods(
    pods: Sequence[Mapping[str, Any]],
    leases: Iterable[Lease],
    adopt: Callable[..., bool],
    delete: Callable[[str], None],
    created_before: float | None = None,
    resource: str = "nvidia.com/gpu",
) -> list[Action]:
    """Apply the rule above to this hub's ``pods`` (dicts as the API gives them); every decision is returned."""
    leased = {lease.ref for lease in leases}
    actions = []
    for pod in pods:
        metadata = pod.get("metadata") or {}
        annotations = metadata.get("annotations") or {}
        name = str(metadata.get("name", ""))
        namespace = str(metadata.get("namespace", ""))
        user = annotations.get(LABEL_USER) or (metadata.get("labels") or {}).get(LABEL_USER, "")
        server = annotations.get(LABEL_SERVER, "")
        ref = f"k8s:{namespace}/{name}"
        if ref in leased or metadata.get("deletionTimestamp"):
            continue
        if created_before is not None and _created(pod) >= created_before:
            actions.append(Action(name, "left", "created by this hub process"))
            continue
        status = pod.get("status") or {}
        if status.get("phase") in ENDED_PHASES:
            continue
        if not (pod.get("spec") or {}).get("nodeName"):
            log.warning("Deleting unscheduled pod %s of %s: no spawn waits for it any more", name, user)
            delete(name)
            actions.append(Action(name, "deleted", "not scheduled, no spawn waiting"))
            continue
        # Whole GPUs, or MIG slices (nvidia.com/mig-<profile>): a slice pod is not a CPU-only one.
        wanted = pod_gpu_request(pod, resource) + sum(pod_slice_requests(pod).values())
        if not wanted:
            actions.append(Action(name, "left", "CPU-only"))
            continue
        uuids = [u for u in (annotations.get(ANNOTATION_GPUS) or "").split(",") if u]
        node = str(pod["spec"]["nodeName"])
        if len(uuids) == wanted and adopt(user, server, uuids, ref, _started(pod), node):
            log.info("Adopted pod %s of %s/%s on %s with GPU(s) %s", name, user, server, node, ", ".join(uuids))
            actions.append(Action(name, "adopted"))
            continue
        why = "its GPUs are leased to another server" if len(uuids) == wanted else "its GPUs were never recorded"
        log.warning("Deleting pod %s of %s/%s: %s", name, user, server, why)
        delete(name)
        actions.append(Action(name, "deleted", why))
    return actions
