"""Placement on Slurm: the engine places, we learn where and write the lease.

Admission came first, so a refusal submitted nothing. Before the job is
submitted, ``admit_to_queue`` holds back a request that would eat into GPUs
an open reservation keeps for its members (``backends.slurm.fairness``). Once
submitted, ``SlurmPlacement.place`` follows the job in Slurm's queue,
telling the user Slurm's reason in words and how many jobs are ahead (and,
in fair-share mode, reordering the workbench's pending jobs and saying why),
cancels it when the queue timeout passes or Slurm says it can never run, and
once it runs reads the node and GPU indices from Slurm's job record. The
UUIDs come from what the job's start-up reported about its node
(``NodeReport``, checked against what the hub already knows of that node,
``backends.slurm.inventory.NodeGPUMap``); the two must agree before the lease is
written, so a confused or lying node never puts one GPU in two leases. The
lease's ``ref`` is ``slurm:<job id>``. A CPU-only server (0 GPUs) runs the
same way and gets no lease.

The template (``placement.engine_template.EngineTemplate``) does the waiting,
the checks and the lease; this module supplies Slurm's hooks: one look at
``squeue`` (with fair-share reprioritisation and down nodes in the wait's
words), ``scancel``, and how a ``NodeReport`` maps Slurm's GRES indices to
UUIDs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from workbench_devices import DeviceInventory, GPUDevice
from workbench_devices.mig import is_profile_name
from workbench_spawner.backends.slurm.fairness import free_on_slurm, reprioritize
from workbench_spawner.backends.slurm.job_states import is_hopeless, pending_message, queue_position
from workbench_spawner.backends.slurm.jobs import SlurmUnavailableError, cancel, list_jobs, list_nodes, set_priority
from workbench_spawner.backends.slurm.node_report import NodeReport
from workbench_spawner.backends.slurm.node_states import NodeStates
from workbench_spawner.backends.slurm.records import SlurmJob, SlurmNode
from workbench_spawner.form.options import device_matches
from workbench_spawner.ledger.store import AllocationStore
from workbench_spawner.placement.engine import (
    EngineJob,
    Look,
    ReportMismatchError,
)
from workbench_spawner.placement.engine_reservations import EngineReservations
from workbench_spawner.placement.engine_template import EngineTemplate, EngineWords
from workbench_spawner.rules.queue_order import DEFAULT_AGING_MINUTES, Waiting, explain, order

log = logging.getLogger("workbench.slurm")


class SlurmPlacement(EngineTemplate):
    """Leases for jobs Slurm placed; the wait is Slurm's own queue (``EngineTemplate``'s hooks)."""

    # A slice is a GRES of its profile's type (``gpu:1g.18gb:1``); the job's report maps its index to the MIG UUID.
    pins_slices = True
    words = EngineWords(
        engine="Slurm",
        the_job="the job",
        job_noun="Slurm job",
        job_gone="the job was cancelled",
        answerer="Slurm's controller",
        placed="Slurm started the job on {node}; waiting for the server to report its GPUs",
        # The log is the batch script's --output (backends.slurm.sbatch).
        no_report="The server in Slurm job {job} on {node} did not report back within {timeout:g} seconds; the job "
        "was cancelled. Its log is ~/workbench-slurm-{job}.log.",
        held="Slurm placed job {job} on GPUs {uuids} of {node}, which the workbench ledger shows as held by another "
        "server; the job was cancelled. Try again in a minute.",
        conflict="The server in Slurm job {job} reported GPUs the hub cannot accept: {problem}; the job was "
        "cancelled. Tell a hub admin.",
        nothing_made="nothing was submitted to Slurm",
        nothing_submitted="The Slurm job was not submitted, so there is nothing to place.",
    )
    ref_prefix = "slurm"
    unavailable_errors = (SlurmUnavailableError,)
    report_poll = 0.2

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
        reservations: EngineReservations | None = None,
        gpu_hours: Callable[[str], float] = lambda user: 0.0,
        set_job_priority: Callable[[str, int], None] = set_priority,
        learn: Callable[[NodeReport], None] = lambda report: None,
        devices: Callable[[], Sequence[GPUDevice]] | None = None,
        node_states: NodeStates | None = None,
        release_grace: float = 60.0,
    ):
        super().__init__(
            store,
            inventory,
            reservations or EngineReservations(store, inventory),
            poll_interval,
            report_timeout,
            clock,
            release_grace,
        )
        self.jobs = jobs
        self.cancel_job = cancel_job
        self.nodes = nodes
        self.queue_order = queue_order
        self.aging_minutes = aging_minutes
        self.gpu_hours = gpu_hours
        self.set_job_priority = set_job_priority
        self.learn = learn
        self._devices = devices
        # Which nodes take no job now (down, drained, not responding), from sinfo at most every 5 s.
        self.node_states = node_states or NodeStates(nodes)

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

    # -- the template's hooks ------------------------------------------------------------------

    async def cancel(self, job_id: str, why: str) -> None:
        log.info("Cancelling Slurm job %s: %s", job_id, why)
        try:
            await asyncio.to_thread(self.cancel_job, job_id)
        except SlurmUnavailableError as exc:
            log.warning("Could not cancel Slurm job %s: %s", job_id, exc)

    def free_gpus(self, inventory: DeviceInventory) -> list[str]:
        # What is free is what Slurm has not allocated on nodes that take jobs (sinfo), not the ledger's view.
        return free_on_slurm(inventory, self.nodes(), None)

    async def joining(self, job: EngineJob, user: str) -> Waiting:
        hours = await asyncio.to_thread(self.gpu_hours, user) if self.queue_order == "fair-share" else 0.0
        return Waiting(key=job.job_id, user=user, joined=self.clock(), gpu_hours=hours)

    async def look(self, job: EngineJob, what: str, kind: str | None, memo: dict[str, Any]) -> Look:
        jobs = await asyncio.to_thread(self.jobs)
        found = next((j for j in jobs if j.job_id == job.job_id), None)
        if found is None or not (found.pending or found.running):
            state = found.state if found else "gone from the queue"
            return Look(ended=self.ended_before_start(job.job_id, state))
        if found.running:
            return Look(node=found.node, record=found)
        if is_hopeless(found.reason):
            return Look(
                refused=f"Slurm cannot run this request ({found.reason}); the job was cancelled. Ask for fewer "
                "GPUs or a shorter session, or ask a hub admin about the partition.",
                refused_why=f"Slurm cannot run it ({found.reason})",
            )
        jobs = await self._fair_share(jobs)
        found = next((j for j in jobs if j.job_id == job.job_id), found)
        ahead = queue_position(jobs, job.job_id)
        # What fits the request, named as it asks: "4 GPUs", "2 1g.18gb slices".
        profile = (kind or "").split(" ")[-1]
        noun = f"{profile} slices" if is_profile_name(profile) else "GPUs"
        # GPUs on nodes that are down or drained count as neither free nor in use: "all 2 GPUs
        # that fit are in use; 2 more are on a node that takes no jobs now (wbnode1: down)".
        unavailable = await asyncio.to_thread(self.unusable_by_node, kind)
        usable = self.total_gpus(kind) - sum(n for n, _why in unavailable.values())
        text = pending_message(found, ahead, usable, what, noun, unavailable) + self._why(job.job_id)
        return Look(text=text, report=(ahead,), detail=text)

    def uuids(self, job: EngineJob, look: Look, report: Any, count: int) -> list[str]:
        """The job's GPU UUIDs, when Slurm's indices on its node and the job's ``NodeReport`` agree."""
        given = look.record.gpu_indices
        agree = report is not None and report.node == look.node and len(given) == count
        uuids = report.uuids_for(given) if agree else []
        if not uuids or sorted(uuids) != sorted(report.job_gpus):
            raise ReportMismatchError(
                f"Slurm gave job {job.job_id} GPU indices {list(given)} on {look.node}, but the "
                f"job reported {list(report.job_gpus) if report else 'nothing'}; the job was cancelled. "
                "Tell a hub admin: the node's GPU list and gres.conf disagree."
            )
        return uuids

    def learn_from(self, job: EngineJob, look: Look, report: Any) -> None:
        # Only the job's node and the indices Slurm gave it.
        given = tuple(g for g in report.gpus if int(g.get("index", -1)) in look.record.gpu_indices)
        self.learn(replace(report, gpus=given))

    # -- fair share ----------------------------------------------------------------------------

    async def _fair_share(self, jobs: list[SlurmJob]) -> list[SlurmJob]:
        """Give our pending jobs Slurm priorities in fair-share order; the job list as it is then."""
        changes = reprioritize(jobs, dict(self._pending), self.queue_order, self.clock(), self.aging_minutes)
        if not changes:
            return jobs
        new = dict(changes)
        for job_id, priority in changes:
            try:
                await asyncio.to_thread(self.set_job_priority, job_id, priority)
            except SlurmUnavailableError as exc:
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
