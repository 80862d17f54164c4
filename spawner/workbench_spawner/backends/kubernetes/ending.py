"""Why a user's pod ended, in the usage ledger's words (``ledger.reasons``), from what Kubernetes says.

The ledger tells an admin why a GPU came free: a student's Stop is not a
pod an operator deleted, nor a node that died. JupyterHub only learns "the
server is gone"; the pod's last state says more, and one table maps it
(``pod_end_reason``), used by both places that notice a pod ended:

* the spawner's poll (``gpu_exit_reason``), with the pod as its poll last
  saw it and whether it still exists;
* the reconciler (``gpu_lease_gone_reason``), with the pod as the API lists
  it now (or gone).

The table, first match wins:

==========================================================  ==================
the pod's status says                                        reason
==========================================================  ==================
``DisruptionTarget`` condition by the taint manager or the   ``NODE_FAILED``
pod garbage collector (1.26+); ``status.reason`` NodeLost,
Terminated/Shutdown (graceful node shutdown)
``DisruptionTarget`` by the Eviction API, preemption or the  ``EVICTED``
kubelet; ``status.reason`` Evicted (node pressure)
a container terminated ``OOMKilled``                         ``OUT_OF_MEMORY``
its node object is gone                                      ``NODE_FAILED``
being deleted (``deletionTimestamp``) while its node is not  ``NODE_FAILED``
Ready: the taint manager evicting it from an unreachable node
gone, or being deleted, otherwise: deleted outside the hub   ``POD_DELETED``
anything else (its process ended on its own)                 None (server exited)
==========================================================  ==================

``pod_ending`` turns the row into the student's sentence (``ledger.endings``):
the node's name and its Ready condition ("Ready=Unknown: Kubelet stopped
posting node status."), the eviction's message, the memory limit an
``OOMKilled`` container hit, the exit code of a server that ended on its own.

The hub's own deletions never reach this table: a stop in progress is
recorded by the stop itself (the GPU mixin), and the reconciler is told
"unknown" for a pod the hub is deleting (``KubernetesGPUSpawner.gpu_lease_alive``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workbench_spawner.backends.kubernetes.cluster import NodeState, quantity
from workbench_spawner.ledger import endings, reasons
from workbench_spawner.ledger.endings import Ending

# DisruptionTarget condition reasons (Kubernetes 1.26+), by what they mean for the ledger.
_DISRUPTED_BY_NODE = {"DeletionByTaintManager", "DeletionByPodGC"}
_DISRUPTED_BY_EVICTION = {
    "EvictionByEvictionAPI",
    "PreemptionByScheduler",
    "PreemptionByKubeScheduler",
    "TerminationByKubelet",
}
# status.reason of a pod its node ended: NodeLost (node controller, older releases), graceful node shutdown.
_NODE_STATUS_REASONS = {"NodeLost", "Terminated", "Shutdown", "NodeShutdown"}


def status_reason(pod: Mapping[str, Any]) -> str | None:
    """What the pod's own status says ended it (the table's first three rows), or None."""
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            why = condition.get("reason") or ""
            if why in _DISRUPTED_BY_NODE:
                return reasons.NODE_FAILED
            if why in _DISRUPTED_BY_EVICTION:
                return reasons.EVICTED
    why = status.get("reason") or ""
    if why in _NODE_STATUS_REASONS:
        return reasons.NODE_FAILED
    if why == "Evicted":
        return reasons.EVICTED
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        terminated = (container.get("state") or {}).get("terminated") or {}
        if terminated.get("reason") == "OOMKilled":
            return reasons.OUT_OF_MEMORY
    return None


def pod_end_reason(pod: Mapping[str, Any] | None, gone: bool, node: NodeState = NodeState.UNKNOWN) -> str | None:
    """Why the server in ``pod`` ended, in the ledger's words (None: its process ended on its own).

    ``pod``: its last known state (None: never seen); ``gone``: it no longer
    exists in the API; ``node``: its node now (``node_name`` says which)."""
    if said := status_reason(pod or {}):
        return said
    if node is NodeState.GONE or (_deleting(pod) and node is NodeState.NOT_READY):
        return reasons.NODE_FAILED
    if gone or _deleting(pod):
        return reasons.POD_DELETED
    return None


def _deleting(pod: Mapping[str, Any] | None) -> bool:
    """Whether the pod is being deleted (it has a ``deletionTimestamp``)."""
    return bool(((pod or {}).get("metadata") or {}).get("deletionTimestamp"))


def node_name(pod: Mapping[str, Any] | None) -> str:
    """The node the pod was scheduled on ("" when it was not)."""
    return str(((pod or {}).get("spec") or {}).get("nodeName") or "")


def needs_node(pod: Mapping[str, Any] | None, gone: bool) -> bool:
    """Whether the table would look at the node (so a caller asks the API only then)."""
    return not status_reason(pod or {}) and (gone or _deleting(pod))


def pod_ending(
    pod: Mapping[str, Any] | None, gone: bool, node: NodeState = NodeState.UNKNOWN, node_condition: str = ""
) -> Ending | None:
    """The table's row for ``pod`` as the student's sentence; None when the pod says nothing (poll then tells
    "the server exited" with its exit code). ``node_condition``: the node's Ready condition in words, where
    the caller asked the API (``cluster.node_condition``)."""
    reason = pod_end_reason(pod, gone, node)
    status = (pod or {}).get("status") or {}
    if reason == reasons.NODE_FAILED:
        why = (
            node_condition
            or (status.get("message") or "").strip()
            or ("the node is gone" if node is NodeState.GONE else "")
        )
        return endings.node_failed(node_name(pod), why, "Kubernetes")
    if reason == reasons.EVICTED:
        return endings.evicted((status.get("message") or _disruption_message(status)).strip())
    if reason == reasons.OUT_OF_MEMORY:
        return endings.out_of_memory(memory_limit(pod))
    if reason == reasons.POD_DELETED:
        return endings.pod_deleted()
    code = exit_code(pod)
    return endings.server_exited(code) if code is not None else None


def _disruption_message(status: Mapping[str, Any]) -> str:
    for condition in status.get("conditions") or []:
        if condition.get("type") == "DisruptionTarget":
            return str(condition.get("message") or "")
    return ""


def _terminated(pod: Mapping[str, Any] | None) -> list[tuple[str, Mapping[str, Any]]]:
    """(container name, how it terminated) for each container that did: its current state, else its last."""
    out = []
    for container in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated") or (container.get("lastState") or {}).get(
            "terminated"
        )
        if terminated:
            out.append((str(container.get("name")), terminated))
    return out


def exit_code(pod: Mapping[str, Any] | None) -> int | None:
    """The exit code of the pod's first terminated container."""
    for _, terminated in _terminated(pod):
        if isinstance(terminated.get("exitCode"), int):
            return int(terminated["exitCode"])
    return None


def memory_limit(pod: Mapping[str, Any] | None) -> int | None:
    """The memory limit of the pod's container that was killed (else its first with a limit), in bytes."""
    limits = {
        str(c.get("name")): quantity(((c.get("resources") or {}).get("limits") or {}).get("memory"))
        for c in ((pod or {}).get("spec") or {}).get("containers") or []
    }
    for name, terminated in _terminated(pod):
        if terminated.get("reason") == "OOMKilled" and limits.get(name):
            return limits[name]
    return next((v for v in limits.values() if v), None)
