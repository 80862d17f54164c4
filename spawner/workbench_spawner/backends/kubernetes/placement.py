"""Placement on Kubernetes: the scheduler places the pod, we learn its node and GPUs and write the lease.

Admission came first, so a refusal created nothing. ``admit_to_queue`` holds
back a request that would eat into GPUs an open reservation keeps
(``EngineReservations``, with the nodes' allocatable minus what every pod
requests as "free"). Once the pod exists, ``KubernetesPlacement.place``
follows it through KubeSpawner's pod and event watches: while it is
unscheduled the user sees the scheduler's own words ("0/3 nodes are
available: 3 Insufficient nvidia.com/gpu") and their place among this hub's
pending pods; past the queue timeout it fails (the spawner then deletes the
pod). Once scheduled, the pod's start-up reports the GPUs the device plugin
gave it (``report_api``); the report must name the pod's node and as many
GPUs as the pod asked for, on that node (``NodeUUIDs``), before the lease is
written with ``ref`` ``k8s:<namespace>/<pod>``.

MIG slices (``pins_slices``): a request for slices of a profile is a pod
asking ``nvidia.com/mig-<profile>: 1`` (one slice a server; the device plugin's mixed strategy);
its report must name that many slices of that profile on the pod's node, and
the lease records each slice's share of a GPU (GPU-hours by share). Open
reservations hold whole GPUs, so a slice request is never held back for them.

Queue order: the scheduler takes pending pods by priority, then by arrival,
so the hub's FIFO is the scheduler's; fair-share order is not applied on
Kubernetes (a PriorityClass per group is the cluster's own tool, docs/kubernetes.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workbench_devices import DeviceInventory
from workbench_spawner.backends.kubernetes.inventory import is_placeholder
from workbench_spawner.ledger.store import AllocationStore
from workbench_spawner.placement.engine import (
    EngineJob,
    Look,
    ReportMismatchError,
)
from workbench_spawner.placement.engine_reservations import EngineReservations
from workbench_spawner.placement.engine_template import EngineTemplate, EngineWords

log = logging.getLogger("workbench.kubernetes")

MAX_REPORTED = 64


def _none() -> None:
    return None


def _no_events() -> list[dict]:
    return []


@dataclass(frozen=True)
class PodJob(EngineJob):
    """A submitted pod: ``pod()`` its latest state from the watch (None while unseen), ``events()`` its events;
    ``profile`` the MIG profile its slices are of ("" for whole GPUs)."""

    pod: Callable[[], Mapping[str, Any] | None] = _none
    events: Callable[[], list[dict]] = _no_events
    profile: str = ""


@dataclass(frozen=True)
class PodReport:
    """What a pod's start-up reported: its node and the GPU UUIDs in ``NVIDIA_VISIBLE_DEVICES``."""

    node: str
    gpus: tuple[str, ...]

    @classmethod
    def from_json(cls, data: object) -> PodReport | None:
        if not isinstance(data, Mapping) or not isinstance(data.get("node"), str) or not data["node"]:
            return None
        gpus = data.get("gpus")
        if not isinstance(gpus, list) or not all(isinstance(g, str) and g for g in gpus):
            return None
        return cls(data["node"], tuple(gpus))


def scheduler_words(events: Sequence[Mapping[str, Any]]) -> str:
    """The scheduler's latest reason for not placing the pod ("0/3 nodes are available: ..."), or ""."""
    for event in reversed(list(events)):
        if event.get("reason") == "FailedScheduling" and event.get("message"):
            return str(event["message"]).strip().rstrip(".")
    return ""


def container_trouble(pod: Mapping[str, Any]) -> str:
    """Why the pod's container cannot start, in Kubernetes' words (image missing, crash loop), or ""."""
    statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
    for status in [*statuses, *((pod.get("status") or {}).get("containerStatuses") or [])]:
        waiting = (status.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason") or ""
        if reason in ("ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName", "CrashLoopBackOff"):
            return f"{reason}: {waiting.get('message') or ''}".strip(": ")
        terminated = (status.get("state") or {}).get("terminated")
        if terminated:
            return f"the container exited with code {terminated.get('exitCode')} ({terminated.get('reason') or ''})"
    return ""


class KubernetesPlacement(EngineTemplate):
    """Leases for pods the scheduler placed; the wait is the scheduler's queue (``EngineTemplate``'s hooks)."""

    pins_slices = True  # a gpu_profile request asks for the device plugin's nvidia.com/mig-<profile>
    words = EngineWords(
        engine="Kubernetes",
        the_job="the pod",
        job_noun="pod",
        job_gone="the pod was deleted",
        answerer="the Kubernetes API",
        placed="Kubernetes scheduled the pod on {node}; waiting for it to report its GPUs",
        no_report="The server in pod {job} on {node} did not report its GPUs within {timeout:g} seconds; the pod was "
        "deleted. Is the image the workbench's (its start-up reports), and can the pod reach the hub's API?",
        held="Kubernetes gave the pod GPUs {uuids} on {node}, which the workbench ledger still shows as held by "
        "another server after {grace:g} seconds; the pod was deleted. Try again in a minute; if it happens again, "
        "tell a hub admin.",
        conflict="The pod {job} reported GPUs that contradict what the hub knows: {problem}; the pod was deleted.",
        place_verb="place",
        nothing_made="no pod was created",
        nothing_submitted="No pod was created, so there is nothing to place.",
    )
    Job = PodJob
    ref_prefix = "k8s"
    unavailable_errors = (RuntimeError,)  # KubernetesUnavailableError
    report_poll = 0.05

    def __init__(
        self,
        store: AllocationStore,
        inventory: Callable[[], DeviceInventory],
        reservations: EngineReservations,
        free_gpus: Callable[[DeviceInventory], list[str]],
        poll_interval: float = 1.0,
        report_timeout: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
        learn: Callable[[str, Sequence[str], str], None] = lambda node, uuids, profile: None,
        release_grace: float = 60.0,
    ):
        super().__init__(store, inventory, reservations, poll_interval, report_timeout, clock, release_grace)
        self._free_gpus = free_gpus
        # What the hub learns from a checked report: (node, UUIDs, the MIG profile of its slices, "" for whole GPUs).
        self.learn = learn

    def free_gpus(self, inventory: DeviceInventory) -> list[str]:
        return self._free_gpus(inventory)

    def holds_reserved(self, job: EngineJob) -> bool:
        return not getattr(job, "profile", "")  # open reservations hold whole GPUs

    async def look(self, job: EngineJob, what: str, kind: str | None, memo: dict[str, Any]) -> Look:
        assert isinstance(job, PodJob)
        pod = job.pod()
        if pod is not None:
            memo["seen"] = True
            status = pod.get("status") or {}
            deleted = (pod.get("metadata") or {}).get("deletionTimestamp")
            if deleted or status.get("phase") in ("Succeeded", "Failed"):
                how = "deleted" if deleted else str(status.get("phase"))
                return Look(ended=self.ended_before_start(job.job_id, how))
            node = (pod.get("spec") or {}).get("nodeName")
            if node:
                return Look(node=str(node), record=pod)
        elif memo.get("seen"):
            return Look(ended=f"The pod {job.job_id} was deleted before the server started.")
        ahead = self.ahead_in_line(job.job_id)
        words = scheduler_words(job.events())
        text = f"Waiting for {what}: " + (
            f"{ahead} ahead of you among this hub's servers" if ahead else "you are next in line"
        )
        text += f"; Kubernetes says: {words}" if words else "; waiting for the Kubernetes scheduler"
        return Look(text=text, report=(ahead, words), detail=words)

    def trouble(self, job: EngineJob, node: str) -> str:
        assert isinstance(job, PodJob)
        pod = job.pod()
        trouble = container_trouble(pod) if pod else "the pod was deleted"
        if not trouble:
            return ""
        namespace, _, name = job.job_id.partition("/")
        return (
            f"The server's pod {job.job_id} on {node} cannot start: {trouble} "
            f"(`kubectl logs -n {namespace} {name}` says why)."
        )

    async def ended(self, job: EngineJob) -> str:
        assert isinstance(job, PodJob)
        pod = job.pod()
        if pod is None or (pod.get("metadata") or {}).get("deletionTimestamp"):
            return f"The pod {job.job_id} was deleted before the server started."
        return ""

    def uuids(self, job: EngineJob, look: Look, report: Any, count: int) -> list[str]:
        problem = self._check(report, look.node, count, getattr(job, "profile", ""))
        if problem:
            raise ReportMismatchError(
                f"The pod {job.job_id} on {look.node} reported GPUs the hub cannot accept: {problem}; the pod was "
                "deleted. Tell a hub admin."
            )
        return list(report.gpus)

    def learn_from(self, job: EngineJob, look: Look, report: Any) -> None:
        self.learn(look.node, report.gpus, getattr(job, "profile", ""))

    def _check(self, pod_report: PodReport, node: str, count: int, profile: str = "") -> str:
        """Why a report cannot be taken ("" when it can): node, count, duplicates, and names on that node
        of the kind asked for (whole GPUs, or slices of ``profile``)."""
        if pod_report.node != node:
            return f"it says it runs on {pod_report.node!r}, Kubernetes says {node!r}"
        if len(pod_report.gpus) != count or len(set(pod_report.gpus)) != count:
            return f"{len(pod_report.gpus)} GPU(s) {list(pod_report.gpus)}, but the pod asked for {count}"
        on_node = {
            d.uuid for d in self.inventory().devices if d.node == node and (d.profile if d.mig else "") == profile
        }
        placeholders = any(is_placeholder(u) for u in on_node)
        unknown = [u for u in pod_report.gpus if u not in on_node]
        if unknown and not placeholders:
            what = f"a {profile} MIG slice" if profile else "a GPU"
            return f"{', '.join(unknown)} is not {what} of {node}"
        if profile and not all(u.startswith("MIG-") for u in pod_report.gpus):
            return f"{', '.join(pod_report.gpus)} is not a MIG UUID (MIG-...), but the pod asked for {profile} slices"
        return ""
