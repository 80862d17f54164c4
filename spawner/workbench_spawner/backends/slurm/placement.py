"""Placement on Slurm: the engine places, we learn where and write the lease.

Admission came first, so a refusal submitted nothing. Before the job is
submitted, ``admit_to_queue`` holds back a request that would eat into GPUs
an open reservation keeps for its members (``slurm_fairness``). Once
submitted, ``SlurmPlacement.place`` follows the job in Slurm's queue,
telling the user Slurm's reason in words and how many jobs are ahead (and,
in fair-share mode, reordering the workbench's pending jobs and saying why),
cancels it when the queue timeout passes or Slurm says it can never run, and
once it runs reads the node and GPU indices from Slurm's job record. The
UUIDs come from what the job's start-up reported about its node
(``NodeReport``, checked against what the hub already knows of that node,
``slurm_inventory.NodeGPUMap``); the two must agree before the lease is
written, so a confused or lying node never puts one GPU in two leases. The
lease's ``ref`` is ``slurm:<job id>``. A CPU-only server (0 GPUs) runs the
same way and gets no lease.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from workbench_devices import DeviceInventory, GPUDevice
from workbench_devices.mig import is_profile_name
from workbench_spawner.backends.slurm.fairness import SlurmReservations, reprioritize
from workbench_spawner.backends.slurm.inventory import MapConflict
from workbench_spawner.backends.slurm.jobs import (
    NodeReport,
    SlurmJob,
    SlurmNode,
    SlurmUnavailable,
    cancel,
    is_hopeless,
    list_jobs,
    list_nodes,
    pending_message,
    queue_position,
    set_priority,
)
from workbench_spawner.backends.slurm.node_states import NodeStates
from workbench_spawner.form.options import device_matches
from workbench_spawner.ledger.store import AllocationStore, Lease
from workbench_spawner.placement.engine import EngineJob, EnginePlacement
from workbench_spawner.placement.engine_reservations import wait_to_submit
from workbench_spawner.placement.host import NoGPUAvailable, Report, _nothing
from workbench_spawner.rules.queue_order import DEFAULT_AGING_MINUTES, Waiting, explain, order
from workbench_spawner.rules.reservations import gpus_text

log = logging.getLogger("workbench.slurm")

LOG_FILE = "~/workbench-slurm-{job_id}.log"  # the batch script's --output (slurm_backend.BATCH_SCRIPT)


@dataclass(frozen=True)
class SlurmEngineJob(EngineJob):
    """A submitted job with what it asked for: the mixin hands placement a whole-GPU ``model`` only.

    ``kind``: the request's ``SpawnRequest.kind`` (a model, a MIG profile, or
    ``"<model> <profile>"``; None: any whole GPU), so a slice request waits as
    "1 1g.18gb slice" among that profile's slices and its lease is charged by
    each slice's share of a GPU."""

    kind: str | None = None


class JobEnded(NoGPUAvailable):
    """The job left Slurm's queue before it ran (cancelled outside the hub, failed at once)."""


class SlurmPlacement(EnginePlacement):
    """Leases for jobs Slurm placed; the wait is Slurm's own queue."""

    # A slice is a GRES of its profile's type (``gpu:1g.18gb:1``); the job's report maps its index to the MIG UUID.
    pins_slices = True

    def __init__(
        self,
        store: AllocationStore,
        inventory: Callable[[], DeviceInventory],
        poll_interval: float = 1.0,
        report_timeout: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
        jobs: Callable[[], list[SlurmJob]] = list_jobs,
        cancel_job: Callable[[str], None] = cancel,
        nodes: Callable[[], list[SlurmNode]] = list_nodes,
        queue_order: str = "fifo",
        aging_minutes: float = DEFAULT_AGING_MINUTES,
        reservations: SlurmReservations | None = None,
        gpu_hours: Callable[[str], float] = lambda user: 0.0,
        set_job_priority: Callable[[str, int], None] = set_priority,
        learn: Callable[[NodeReport], None] = lambda report: None,
        devices: Callable[[], Sequence[GPUDevice]] | None = None,
        node_states: NodeStates | None = None,
    ):
        super().__init__(store)
        self.inventory = inventory
        self.poll_interval = poll_interval
        self.report_timeout = report_timeout
        self.clock = clock
        self.jobs = jobs
        self.cancel_job = cancel_job
        self.nodes = nodes
        self.queue_order = queue_order
        self.aging_minutes = aging_minutes
        self.reservations = reservations or SlurmReservations(store, inventory)
        self.gpu_hours = gpu_hours
        self.set_job_priority = set_job_priority
        self.learn = learn
        self._devices = devices
        # Which nodes take no job now (down, drained, not responding), from sinfo at most every 5 s.
        self.node_states = node_states or NodeStates(nodes)
        # job id -> the request as the queue order sees it, for every job of ours Slurm keeps pending.
        self._pending: dict[str, Waiting] = {}
        # The reservation check and the admission it leads to are one step: ten non-members who ask
        # at the same second do not all see the same free GPUs.
        self._admitting = asyncio.Lock()

    def waiting(self) -> int:
        return len(self._pending)

    def waiting_by_group(self) -> dict[str, int]:
        return self.reservations.waiting_by_group()

    def devices(self) -> Sequence[GPUDevice]:
        """The cluster's GPUs and slices as the wait sentence counts them (the spawner hands in the
        settings' list, read on the event loop: never the database)."""
        return self._devices() if self._devices else self.inventory().devices

    def total_gpus(self, kind: str | None = None) -> int:
        """GPUs (or slices) of ``kind`` in the cluster, usable or not: whole GPUs for None."""
        return sum(device_matches(d, kind) for d in self.devices())

    def unusable(self, devices: Sequence[GPUDevice]) -> dict[str, str]:
        """``devices`` on nodes Slurm starts no job on now, with why (``EnginePlacement.unusable``; blocking,
        sinfo at most every few seconds)."""
        bad = self.node_states.unusable()
        return {d.uuid: f"node {d.node} is {bad[d.node]}" for d in devices if d.node in bad}

    def unusable_by_node(self, kind: str | None) -> dict[str, tuple[int, str]]:
        """Node -> (its GPUs or slices of ``kind``, why it takes no job) for nodes that take none now
        (blocking: may run sinfo)."""
        bad = self.node_states.unusable()
        counts: dict[str, tuple[int, str]] = {}
        for d in self.devices():
            if d.node in bad and device_matches(d, kind):
                counts[d.node] = (counts.get(d.node, (0, ""))[0] + 1, bad[d.node])
        return counts

    async def _cancel(self, job_id: str, why: str) -> None:
        log.info("Cancelling Slurm job %s: %s", job_id, why)
        try:
            await asyncio.to_thread(self.cancel_job, job_id)
        except SlurmUnavailable as exc:
            log.warning("Could not cancel Slurm job %s: %s", job_id, exc)

    # -- before submitting ---------------------------------------------------------------------

    async def admit_to_queue(
        self,
        key: str,
        count: int,
        model: str | None,
        groups: Sequence[str],
        deadline: float,
        describe: Callable[[str], None] = lambda text: None,
    ) -> None:
        """Return once submitting leaves what open reservations keep; NoGPUAvailable at ``deadline``.

        The admitted request counts as about to take GPUs (``reservations.asking[key]``) from then on,
        until ``place`` follows its job or ``withdraw(key)``."""

        def check() -> tuple[bool, str]:
            try:
                return self.reservations.may_submit(groups, count, model, self.nodes)
            except SlurmUnavailable as exc:
                return False, f"Slurm's controller did not answer ({exc})"

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
            "nothing was submitted to Slurm",
        )

    def withdraw(self, key: str) -> None:
        """The admitted request ``key`` is not going to Slurm's queue after all (sbatch failed)."""
        self.reservations.asking.pop(key, None)

    # -- after submitting ----------------------------------------------------------------------

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
        """The lease of the running ``job`` (None for 0 GPUs), or NoGPUAvailable (the job is then cancelled).

        ``job.started`` is called in a worker thread and returns the job's ``NodeReport`` once it came;
        ``job.admitted``: the key ``admit_to_queue`` registered."""
        if job is None or not job.job_id:
            raise NoGPUAvailable("The Slurm job was not submitted, so there is nothing to place.")
        job_id, started, describe, deadline, admitted = (
            job.job_id,
            job.started,
            job.describe,
            job.deadline,
            job.admitted,
        )
        kind = getattr(job, "kind", None) or model
        what = gpus_text(count, kind)
        deadline = self.clock() + timeout if deadline is None else deadline
        hours = await asyncio.to_thread(self.gpu_hours, user) if self.queue_order == "fair-share" else 0.0
        self._pending[job_id] = Waiting(key=job_id, user=user, joined=self.clock(), gpu_hours=hours)
        self.reservations.asking[job_id] = (frozenset(groups), count, model)
        self.withdraw(admitted)
        try:
            job = await self._until_running(job_id, what, kind, deadline, timeout, report, describe)
        finally:
            self._pending.pop(job_id, None)
            self.reservations.asking.pop(job_id, None)
        describe(f"Slurm started the job on {job.node}; waiting for the server to report its GPUs")
        node_report = await self._until_reported(job, started)
        if not count:
            return None
        uuids = self._uuids(job, node_report, count)
        if not uuids:
            await self._cancel(job_id, "GPU report does not match Slurm's job record")
            raise NoGPUAvailable(
                f"Slurm gave job {job_id} GPU indices {list(job.gpu_indices)} on {job.node}, but the job "
                f"reported {list(node_report.job_gpus) if node_report else 'nothing'}; the job was cancelled. "
                "Tell a hub admin: the node's GPU list and gres.conf disagree."
            )
        try:
            # Only now, checked against Slurm's record, and only the job's node and the indices Slurm gave it.
            given = tuple(g for g in node_report.gpus if int(g.get("index", -1)) in job.gpu_indices)
            await asyncio.to_thread(self.learn, replace(node_report, gpus=given))
        except MapConflict as exc:
            await self._cancel(job_id, "its GPU report contradicts what the hub knows of the node")
            raise NoGPUAvailable(
                f"The server in Slurm job {job_id} reported GPUs the hub cannot accept: {exc}; "
                "the job was cancelled. Tell a hub admin."
            ) from None
        shares = await asyncio.to_thread(self._shares, uuids)
        ok = await asyncio.to_thread(
            lambda: self.store.adopt(
                user, server, uuids, f"slurm:{job_id}", None, job.node, tuple(groups), shares=shares
            )
        )
        if not ok:
            await self._cancel(job_id, "its GPUs are leased to another server")
            raise NoGPUAvailable(
                f"Slurm placed job {job_id} on GPUs {', '.join(uuids)} of {job.node}, which the workbench "
                "ledger shows as held by another server; the job was cancelled. Try again in a minute."
            )
        lease = await asyncio.to_thread(self.store.lease_of, user, server)
        if lease is None:  # released under us (a stop raced the start)
            raise NoGPUAvailable(f"The lease of Slurm job {job_id} was released while the server started.")
        return lease

    def _shares(self, uuids: Sequence[str]) -> dict[str, float]:
        """Each leased device's share of a GPU (a ``1g`` slice 1/7): what GPU-hours charge (reads the database)."""
        devices = self.inventory().by_uuid()
        return {uuid: devices[uuid].share for uuid in uuids if uuid in devices}

    async def _until_running(
        self,
        job_id: str,
        what: str,
        kind: str | None,
        deadline: float,
        timeout: float,
        report: Report,
        describe: Callable[[str], None],
    ) -> SlurmJob:
        # What fits the request, named as it asks: "4 GPUs", "2 1g.18gb slices".
        profile = (kind or "").split(" ")[-1]
        noun = f"{profile} slices" if is_profile_name(profile) else "GPUs"
        last = ""
        while True:
            try:
                jobs = await asyncio.to_thread(self.jobs)
            except SlurmUnavailable as exc:
                describe(f"Waiting for Slurm's controller to answer ({exc})")
                jobs = None
            if jobs is not None:
                job = next((j for j in jobs if j.job_id == job_id), None)
                if job is None or not (job.pending or job.running):
                    state = job.state if job else "gone from the queue"
                    raise JobEnded(f"The Slurm job {job_id} ended before the server started ({state}).")
                if job.running:
                    return job
                if is_hopeless(job.reason):
                    await self._cancel(job_id, f"Slurm cannot run it ({job.reason})")
                    raise NoGPUAvailable(
                        f"Slurm cannot run this request ({job.reason}); the job was cancelled. Ask for fewer "
                        "GPUs or a shorter session, or ask a hub admin about the partition."
                    )
                jobs = await self._fair_share(jobs)
                job = next((j for j in jobs if j.job_id == job_id), job)
                ahead = queue_position(jobs, job_id)
                # GPUs on nodes that are down or drained count as neither free nor in use: "all 2 GPUs
                # that fit are in use; 2 more are on a node that takes no jobs now (wbnode1: down)".
                unavailable = await asyncio.to_thread(self.unusable_by_node, kind)
                usable = self.total_gpus(kind) - sum(n for n, _why in unavailable.values())
                text = pending_message(job, ahead, usable, what, noun, unavailable) + self._why(job_id)
                if text != last:
                    report(ahead)
                    describe(text)
                    last = text
            if self.clock() >= deadline:
                await self._cancel(job_id, "queue timeout")
                raise NoGPUAvailable(
                    f"Slurm did not start the job for {what} within {timeout:g} seconds ({last or 'pending'}); "
                    "the job was cancelled. Try again later, ask for fewer GPUs, or start a CPU-only server "
                    "(0 GPUs)."
                )
            await asyncio.sleep(self.poll_interval)

    async def _fair_share(self, jobs: list[SlurmJob]) -> list[SlurmJob]:
        """Give our pending jobs Slurm priorities in fair-share order; the job list as it is then."""
        changes = reprioritize(jobs, dict(self._pending), self.queue_order, self.clock(), self.aging_minutes)
        if not changes:
            return jobs
        new = dict(changes)
        for job_id, priority in changes:
            try:
                await asyncio.to_thread(self.set_job_priority, job_id, priority)
            except SlurmUnavailable as exc:
                log.warning("Could not set the priority of Slurm job %s: %s", job_id, exc)
                new.pop(job_id, None)
        log.info("Fair share: Slurm priorities of pending jobs now %s", new)
        return [replace(j, priority=new[j.job_id]) if j.job_id in new else j for j in jobs]

    def _why(self, job_id: str) -> str:
        """In fair-share mode, why this job is where it is among ours ("" in fifo mode)."""
        mine = self._pending.get(job_id)
        if self.queue_order != "fair-share" or mine is None:
            return ""
        now = self.clock()
        ordered = order(list(self._pending.values()), self.queue_order, now, self.aging_minutes)
        why = explain(mine, ordered, self.queue_order, now, self.aging_minutes)
        return f"; {why}" if why else ""

    async def _until_reported(self, job: SlurmJob, started: Callable[[], NodeReport | None]) -> NodeReport | None:
        end = self.clock() + self.report_timeout
        while self.clock() < end:
            node_report = await asyncio.to_thread(started)
            if node_report is not None:
                return node_report
            await asyncio.sleep(min(0.2, self.poll_interval))
        await self._cancel(job.job_id, "no start report")
        raise NoGPUAvailable(
            f"The server in Slurm job {job.job_id} on {job.node} did not report back within "
            f"{self.report_timeout:g} seconds; the job was cancelled. Its log is "
            f"{LOG_FILE.format(job_id=job.job_id)}."
        )

    @staticmethod
    def _uuids(job: SlurmJob, node_report: NodeReport | None, count: int) -> list[str]:
        """The job's GPU UUIDs, when Slurm's indices and the job's report agree (else [])."""
        if not count:
            return []
        if node_report is None or node_report.node != job.node or len(job.gpu_indices) != count:
            return []
        uuids = node_report.uuids_for(job.gpu_indices)
        if not uuids or sorted(uuids) != sorted(node_report.job_gpus):
            return []
        return uuids
