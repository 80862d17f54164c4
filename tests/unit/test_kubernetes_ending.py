"""Why a pod ended, as the usage ledger records it (``backends/kubernetes/ending.py``): a table of pod states as
the API gives them (deleted, evicted, OOMKilled, its node lost) and the reason each becomes. The real cluster's
deleted pod, and one deleted while the API server was away: tests/kubernetes/test_kubernetes_outage.py."""

from __future__ import annotations

import pytest

from workbench_spawner.backends.kubernetes.cluster import NodeState
from workbench_spawner.backends.kubernetes.ending import needs_node, pod_end_reason
from workbench_spawner.ledger import reasons


def pod(
    phase: str = "Running",
    reason: str | None = None,
    deleting: bool = False,
    terminated: str | None = None,
    disruption: str | None = None,
    node: str = "n1",
) -> dict:
    """A user pod as the API lists it: its phase, status reason, notebook container's state, conditions."""
    state = {"terminated": {"exitCode": 137, "reason": terminated}} if terminated else {"running": {}}
    status: dict = {"phase": phase, "containerStatuses": [{"name": "notebook", "state": state}]}
    if reason:
        status["reason"] = reason
    if disruption:
        status["conditions"] = [{"type": "DisruptionTarget", "status": "True", "reason": disruption}]
    metadata: dict = {"name": "wb-1a2b3c4d-ann", "namespace": "wb"}
    if deleting:
        metadata["deletionTimestamp"] = "2026-12-06T10:00:00Z"
    return {"metadata": metadata, "spec": {"nodeName": node}, "status": status}


READY, NOT_READY, GONE, UNKNOWN = NodeState.READY, NodeState.NOT_READY, NodeState.GONE, NodeState.UNKNOWN


@pytest.mark.parametrize(
    ("last_seen", "gone", "node", "reason"),
    [
        # Deleted outside the hub: gone from the API, or still terminating.
        (pod(), True, READY, reasons.POD_DELETED),
        (pod(), True, UNKNOWN, reasons.POD_DELETED),
        (None, True, READY, reasons.POD_DELETED),
        (pod(deleting=True), False, READY, reasons.POD_DELETED),
        (pod(deleting=True), True, READY, reasons.POD_DELETED),
        # Gone while its node was briefly not Ready (after an API server outage the node controller may say
        # so for a moment): somebody deleted it, the node did not.
        (pod(), True, NOT_READY, reasons.POD_DELETED),
        # Evicted by the kubelet under node pressure (the pod stays, Failed), then perhaps deleted.
        (pod("Failed", "Evicted", terminated="Error"), False, READY, reasons.EVICTED),
        (pod("Failed", "Evicted"), True, READY, reasons.EVICTED),
        # 1.26+: the DisruptionTarget condition says who ended it.
        (pod(deleting=True, disruption="EvictionByEvictionAPI"), False, READY, reasons.EVICTED),
        (pod(deleting=True, disruption="PreemptionByScheduler"), True, READY, reasons.EVICTED),
        (pod("Failed", disruption="TerminationByKubelet"), False, READY, reasons.EVICTED),
        (pod(deleting=True, disruption="DeletionByTaintManager"), False, UNKNOWN, reasons.NODE_FAILED),
        (pod(disruption="DeletionByPodGC"), True, UNKNOWN, reasons.NODE_FAILED),
        # Its container was killed for memory (restartPolicy Never, or seen before the restart).
        (pod("Failed", terminated="OOMKilled"), False, READY, reasons.OUT_OF_MEMORY),
        (pod("Running", terminated="OOMKilled"), True, READY, reasons.OUT_OF_MEMORY),
        # Its node: lost (older node controller), shut down gracefully, deleted, or unreachable while the
        # taint manager deletes the pod.
        (pod("Unknown", "NodeLost"), False, NOT_READY, reasons.NODE_FAILED),
        (pod("Failed", "Terminated"), False, READY, reasons.NODE_FAILED),
        (pod("Failed", "Shutdown"), True, READY, reasons.NODE_FAILED),
        (pod(), True, GONE, reasons.NODE_FAILED),
        (None, True, GONE, reasons.NODE_FAILED),
        (pod(deleting=True), False, NOT_READY, reasons.NODE_FAILED),
        # Its process ended on its own: None, which the ledger writes as "server exited".
        (pod("Failed", terminated="Error"), False, READY, None),
        (pod("Succeeded", terminated="Completed"), False, UNKNOWN, None),
        (pod("Failed", "DeadlineExceeded"), False, READY, None),
        (pod(), False, NOT_READY, None),
    ],
    ids=lambda v: repr(v) if not isinstance(v, dict) else "",
)
def test_a_pods_last_state_gives_the_ledger_its_reason(last_seen, gone, node, reason):
    assert pod_end_reason(last_seen, gone, node) == reason


@pytest.mark.parametrize(
    ("last_seen", "gone", "asks"),
    [
        (pod(), True, True),  # gone: deleted, or its node is gone?
        (pod(deleting=True), False, True),  # terminating: by hand, or the taint manager on a lost node?
        (pod("Failed", "Evicted"), True, False),  # the pod says it already
        (pod("Failed", terminated="OOMKilled"), False, False),
        (pod("Failed", terminated="Error"), False, False),  # ended on its own: no node question
    ],
)
def test_the_node_is_asked_about_only_when_the_table_looks_at_it(last_seen, gone, asks):
    assert needs_node(last_seen, gone) is asks


def test_every_reason_is_one_the_ledger_knows():
    seen = {
        pod_end_reason(p, g, n) for p in (pod(), pod("Failed", "Evicted")) for g in (True, False) for n in NodeState
    }
    assert seen - {None} <= set(reasons.ALL)
