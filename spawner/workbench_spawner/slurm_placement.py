"""Placement on Slurm: the engine places, we learn where and write the lease.

The job is already submitted (admission came first, so a refusal submitted
nothing). ``SlurmPlacement.place`` follows it in Slurm's queue, telling the
user Slurm's reason in words and how many jobs are ahead, cancels it when the
queue timeout passes or Slurm says it can never run, and once it runs reads
the node and GPU indices from Slurm's job record. The UUIDs come from what the
job's start-up reported about its node (``NodeReport``); the two must agree
before the lease is written, so a confused node never puts one GPU in two
leases. The lease's ``ref`` is ``slurm:<job id>``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from .placement import NoGPUAvailable, Placement, Report
from .slurm_jobs import NodeReport, SlurmJob, SlurmUnavailable, cancel, is_hopeless, list_jobs, pending_message, \
    queue_position
from .store import AllocationStore, Lease

log = logging.getLogger("workbench.slurm")


class JobEnded(NoGPUAvailable):
    """The job left Slurm's queue before it ran (cancelled outside the hub, failed at once)."""


class SlurmPlacement(Placement):
    """Leases for jobs Slurm placed; the wait is Slurm's own queue."""

    def __init__(self, store: AllocationStore, total_gpus: Callable[[], int], poll_interval: float = 1.0,
                 report_timeout: float = 120.0, clock: Callable[[], float] = time.monotonic,
                 jobs: Callable[[], list[SlurmJob]] = list_jobs, cancel_job: Callable[[str], None] = cancel):
        super().__init__(store)
        self.total_gpus = total_gpus
        self.poll_interval = poll_interval
        self.report_timeout = report_timeout
        self.clock = clock
        self.jobs = jobs
        self.cancel_job = cancel_job
        self._pending: set[str] = set()

    def waiting(self) -> int:
        return len(self._pending)

    async def _cancel(self, job_id: str, why: str) -> None:
        log.info("Cancelling Slurm job %s: %s", job_id, why)
        try:
            await asyncio.to_thread(self.cancel_job, job_id)
        except SlurmUnavailable as exc:
            log.warning("Could not cancel Slurm job %s: %s", job_id, exc)

    async def place(self, user: str, server: str, count: int, model: str | None, timeout: float,
                    report: Report = lambda ahead: None, *, job_id: str = "",
                    started: Callable[[], NodeReport | None] = lambda: None,
                    describe: Callable[[str], None] = lambda text: None) -> Lease:
        """The lease of running job ``job_id``, or NoGPUAvailable (the job is then cancelled)."""
        if not job_id:
            raise NoGPUAvailable("The Slurm job was not submitted, so there is nothing to place.")
        what = f"{count} {model + ' ' if model else ''}GPU{'s' if count != 1 else ''}"
        deadline = self.clock() + timeout
        self._pending.add(job_id)
        try:
            job = await self._until_running(job_id, what, deadline, timeout, report, describe)
        finally:
            self._pending.discard(job_id)
        describe(f"Slurm started the job on {job.node}; waiting for the server to report its GPUs")
        node_report = await self._until_reported(job, started)
        uuids = self._uuids(job, node_report, count)
        if count and not uuids:
            await self._cancel(job_id, "GPU report does not match Slurm's job record")
            raise NoGPUAvailable(
                f"Slurm gave job {job_id} GPU indices {list(job.gpu_indices)} on {job.node}, but the job "
                f"reported {list(node_report.job_gpus) if node_report else 'nothing'}; the job was cancelled. "
                "Tell a hub admin: the node's GPU list and gres.conf disagree.")
        ok = await asyncio.to_thread(self.store.adopt, user, server, uuids, f"slurm:{job_id}", None, job.node)
        if not ok:
            await self._cancel(job_id, "its GPUs are leased to another server")
            raise NoGPUAvailable(
                f"Slurm placed job {job_id} on GPUs {', '.join(uuids)} of {job.node}, which the workbench "
                "ledger shows as held by another server; the job was cancelled. Try again in a minute.")
        lease = await asyncio.to_thread(self.store.lease_of, user, server)
        assert lease is not None
        return lease

    async def _until_running(self, job_id: str, what: str, deadline: float, timeout: float, report: Report,
                             describe: Callable[[str], None]) -> SlurmJob:
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
                        "GPUs or a shorter session, or ask a hub admin about the partition.")
                ahead = queue_position(jobs, job_id)
                text = pending_message(job, ahead, self.total_gpus(), what)
                if text != last:
                    report(ahead)
                    describe(text)
                    last = text
            if self.clock() >= deadline:
                await self._cancel(job_id, "queue timeout")
                raise NoGPUAvailable(
                    f"Slurm did not start the job for {what} within {timeout:g} seconds ({last or 'pending'}); "
                    "the job was cancelled. Try again later, ask for fewer GPUs, or start a CPU-only server "
                    "(0 GPUs).")
            await asyncio.sleep(self.poll_interval)

    async def _until_reported(self, job: SlurmJob, started: Callable[[], NodeReport | None]) -> NodeReport | None:
        end = self.clock() + self.report_timeout
        while self.clock() < end:
            node_report = started()
            if node_report is not None:
                return node_report
            await asyncio.sleep(min(0.2, self.poll_interval))
        await self._cancel(job.job_id, "no start report")
        raise NoGPUAvailable(
            f"The server in Slurm job {job.job_id} on {job.node} did not report back within "
            f"{self.report_timeout:g} seconds; the job was cancelled. Its log is ~/.workbench/slurm-{job.job_id}.log.")

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
