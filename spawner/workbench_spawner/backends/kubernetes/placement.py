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

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workbench_devices import DeviceInventory
from workbench_spawner.backends.kubernetes.inventory import UUIDConflict, is_placeholder
from workbench_spawner.ledger.store import AllocationStore, Lease
from workbench_spawner.placement.engine import EngineJob, EnginePlacement
from workbench_spawner.placement.engine_reservations import EngineReservations, wait_to_submit
from workbench_spawner.placement.host import NoGPUAvailable, Report, _nothing
from workbench_spawner.rules.reservations import gpus_text

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
    submitted: float = 0.0
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


class PodEnded(NoGPUAvailable):
    """The pod ended or was deleted before its server started."""


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


class KubernetesPlacement(EnginePlacement):
    """Leases for pods the scheduler placed; the wait is the scheduler's queue."""

    pins_slices = True  # a gpu_profile request asks for the device plugin's nvidia.com/mig-<profile>

    def __init__(
        self,
        store: AllocationStore,
        inventory: Callable[[], DeviceInventory],
        reservations: EngineReservations,
        free_gpus: Callable[[DeviceInventory], list[str]],
        poll_interval: float = 1.0,
        report_timeout: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
        learn: Callable[[str, Sequence[str]], None] = lambda node, uuids: None,
        total_gpus: Callable[[], int] | None = None,
        release_grace: float = 60.0,
        learn_slices: Callable[[str, Sequence[str], str], None] = lambda node, uuids, profile: None,
    ):
        super().__init__(store)
        self.release_grace = release_grace
        self.inventory = inventory
        self.reservations = reservations
        self.free_gpus = free_gpus
        self.poll_interval = poll_interval
        self.report_timeout = report_timeout
        self.clock = clock
        self.learn = learn
        self.learn_slices = learn_slices
        self._total_gpus = total_gpus
        # pod -> when it joined, for every pod of ours not scheduled yet (the hub's own FIFO).
        self._pending: dict[str, float] = {}
        self._admitting = asyncio.Lock()

    def waiting(self) -> int:
        return len(self._pending)

    def waiting_by_group(self) -> dict[str, int]:
        return self.reservations.waiting_by_group()

    def total_gpus(self) -> int:
        return self._total_gpus() if self._total_gpus else len(self.inventory().devices)

    # -- before the pod exists -----------------------------------------------------------------

    async def admit_to_queue(
        self,
        key: str,
        count: int,
        model: str | None,
        groups: Sequence[str],
        deadline: float,
        describe: Callable[[str], None] = lambda text: None,
    ) -> None:
        def check() -> tuple[bool, str]:
            try:
                return self.reservations.may_submit(groups, count, model, self.free_gpus)
            except RuntimeError as exc:  # KubernetesUnavailable
                return False, f"the Kubernetes API did not answer ({exc})"

        await wait_to_submit(
            self.reservations,
            self._admitting,
            key,
            (frozenset(groups), count, model),
            deadline,
            check,
            self.clock,
            self.poll_interval,
            describe,
            "no pod was created",
        )

    def withdraw(self, key: str) -> None:
        self.reservations.asking.pop(key, None)

    # -- after the pod exists ------------------------------------------------------------------

    async def place(
        self,
        user: str,
        server: str,
        count: int,
        model: str | None,
        timeout: float,
        report: Report = _nothing,
        groups: Sequence[str] = (),
        job: EngineJob | None = None,
    ) -> Lease | None:
        """The lease of the pod once scheduled and reported (None for 0 GPUs), or NoGPUAvailable."""
        if not isinstance(job, PodJob) or not job.job_id:
            raise NoGPUAvailable("No pod was created, so there is nothing to place.")
        what = gpus_text(count, f"{model} {job.profile}" if model and job.profile else job.profile or model)
        deadline = self.clock() + timeout if job.deadline is None else job.deadline
        self._pending[job.job_id] = job.submitted or self.clock()
        if not job.profile:
            self.reservations.asking[job.job_id] = (frozenset(groups), count, model)
        self.withdraw(job.admitted)
        try:
            pod = await self._until_scheduled(job, what, deadline, timeout, report)
        finally:
            self._pending.pop(job.job_id, None)
            self.reservations.asking.pop(job.job_id, None)
        node = str(pod["spec"]["nodeName"])
        job.describe(f"Kubernetes scheduled the pod on {node}; waiting for it to report its GPUs")
        pod_report = await self._until_reported(job, node)
        if not count:
            return None
        problem = self._check(pod_report, node, count, job.profile)
        if problem:
            raise NoGPUAvailable(
                f"The pod {job.job_id} on {node} reported GPUs the hub cannot accept: {problem}; the pod was "
                "deleted. Tell a hub admin."
            )
        try:
            if job.profile:
                await asyncio.to_thread(self.learn_slices, node, pod_report.gpus, job.profile)
            else:
                await asyncio.to_thread(self.learn, node, pod_report.gpus)
        except UUIDConflict as exc:
            raise NoGPUAvailable(
                f"The pod {job.job_id} reported GPUs that contradict what the hub knows: {exc}; the pod was deleted."
            ) from None
        await self._adopt(job, user, server, list(pod_report.gpus), node, groups)
        lease = await asyncio.to_thread(self.store.lease_of, user, server)
        if lease is None:
            raise NoGPUAvailable(f"The lease of pod {job.job_id} was released while the server started.")
        return lease

    async def _adopt(
        self, job: PodJob, user: str, server: str, uuids: list[str], node: str, groups: Sequence[str]
    ) -> None:
        """Write the lease; while another server's lease still names these GPUs, wait for its release.

        The scheduler gives a GPU away as soon as the pod that held it is gone,
        and the hub releases that pod's lease when its stop (or poll) sees it gone:
        for a moment the ledger lags the engine. Only a lease that stays past
        ``release_grace`` is a real conflict (the ledger names GPUs Kubernetes
        gave to someone else): then the pod is deleted."""
        end = self.clock() + self.release_grace
        told = False
        # GPU-hours by share: a 1g slice is 1/7 of a GPU (the inventory, resolved after learning, knows it).
        devices = self.inventory().by_uuid()
        shares = {u: devices[u].share for u in uuids if u in devices}
        while not await asyncio.to_thread(
            lambda: self.store.adopt(user, server, uuids, f"k8s:{job.job_id}", None, node, tuple(groups), shares=shares)
        ):
            if self.clock() >= end:
                raise NoGPUAvailable(
                    f"Kubernetes gave the pod GPUs {', '.join(uuids)} on {node}, which the workbench ledger still "
                    f"shows as held by another server after {self.release_grace:g} seconds; the pod was deleted. "
                    "Try again in a minute; if it happens again, tell a hub admin."
                )
            pod = job.pod()
            if pod is None or (pod.get("metadata") or {}).get("deletionTimestamp"):
                raise PodEnded(f"The pod {job.job_id} was deleted before the server started.")
            if not told:
                given = ", ".join(uuids)
                job.describe(f"Kubernetes gave the pod {given}; waiting for its previous server to release it")
                told = True
            await asyncio.sleep(self.poll_interval)

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

    async def _until_scheduled(
        self, job: PodJob, what: str, deadline: float, timeout: float, report: Report
    ) -> Mapping[str, Any]:
        last = ""
        seen = False
        while True:
            pod = job.pod()
            if pod is not None:
                seen = True
                status = pod.get("status") or {}
                deleted = (pod.get("metadata") or {}).get("deletionTimestamp")
                if deleted or status.get("phase") in ("Succeeded", "Failed"):
                    how = "deleted" if deleted else status.get("phase")
                    raise PodEnded(f"The pod {job.job_id} ended before the server started ({how}).")
                if (pod.get("spec") or {}).get("nodeName"):
                    return pod
            elif seen:
                raise PodEnded(f"The pod {job.job_id} was deleted before the server started.")
            ahead = self._ahead(job.job_id)
            words = scheduler_words(job.events())
            text = f"Waiting for {what}: " + (
                f"{ahead} ahead of you among this hub's servers" if ahead else "you are next in line"
            )
            text += f"; Kubernetes says: {words}" if words else "; waiting for the Kubernetes scheduler"
            if text != last:
                report(ahead, words)
                job.describe(text)
                last = text
            if self.clock() >= deadline:
                raise NoGPUAvailable(
                    f"Kubernetes did not place the pod for {what} within {timeout:g} seconds "
                    f"({words or 'pending'}); the pod was deleted. Try again later, ask for fewer GPUs, or start a "
                    "CPU-only server (0 GPUs)."
                )
            await asyncio.sleep(self.poll_interval)

    def _ahead(self, job_id: str) -> int:
        mine = self._pending.get(job_id)
        return 0 if mine is None else sum(1 for k, t in self._pending.items() if k != job_id and t < mine)

    async def _until_reported(self, job: PodJob, node: str) -> PodReport:
        end = self.clock() + self.report_timeout
        while self.clock() < end:
            found = await asyncio.to_thread(job.started)
            if found is not None:
                return found
            pod = job.pod()
            trouble = container_trouble(pod) if pod else "the pod was deleted"
            if trouble:
                namespace, _, name = job.job_id.partition("/")
                raise PodEnded(
                    f"The server's pod {job.job_id} on {node} cannot start: {trouble} "
                    f"(`kubectl logs -n {namespace} {name}` says why)."
                )
            await asyncio.sleep(min(0.05, self.poll_interval))
        raise NoGPUAvailable(
            f"The server in pod {job.job_id} on {node} did not report its GPUs within {self.report_timeout:g} "
            "seconds; the pod was deleted. Is the image the workbench's (its start-up reports), and can the pod "
            "reach the hub's API?"
        )
