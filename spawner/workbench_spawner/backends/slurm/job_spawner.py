"""batchspawner's SlurmSpawner as the workbench follows and stops a job, and the policy's Slurm inventory.

Kept apart from ``backends/slurm/spawner.py`` (admission, placement and the
ledger on Slurm) because these are corrections to how batchspawner 1.3.0 itself
treats a job, true whatever the GPU policy does.
"""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING

from batchspawner import JobStatus, SlurmSpawner
from traitlets import default

from workbench_spawner.backends.slurm.jobs import SlurmUnavailableError, cancel, cancel_tagged, note_hub_cancel
from workbench_spawner.backends.slurm.tags import job_tag


class SlurmJobSpawner(SlurmSpawner):
    """batchspawner's SlurmSpawner with two fixes to how a job is followed and stopped.

    * ``poll``: a job that runs again as *pending* was requeued (by an admin,
      or by Slurm after a node failure where ``--no-requeue`` is overridden);
      its server is gone and would come back elsewhere with a new port, so it
      is cancelled and counts as ended. batchspawner counts pending as alive.
    * ``stop`` of a spawn abandoned while ``sbatch`` still ran: the hub never
      learned the job's id, so the job is found by its tag and cancelled
      (batchspawner would run ``scancel`` with no id).
    * ``poll`` remembers the state a job ended in (``slurm_end``: NODE_FAIL,
      CANCELLED, OUT_OF_MEMORY...), which squeue lists for ``MinJobAge``
      seconds only with ``-t all``; the ledger's reason is read from it
      (``gpu_exit_reason``). Every cancel this hub makes is noted first
      (``note_hub_cancel``), so a stop is never taken for a cancel from outside.
    """

    # (job id, the state it ended in: NODE_FAIL, CANCELLED, ...; "" when squeue no longer knew the job),
    # set by the poll that found the job gone, before clear_state() forgets the id.
    slurm_end: tuple[str, str] = ("", "")
    if TYPE_CHECKING:
        # "user" or "user:server" in log lines: the GPU mixin's (``SlurmGPUSpawner``), not JupyterHub's private
        # _log_name.
        @property
        def server_label(self) -> str: ...

        # This hub's id, in every job's tag: the GPU mixin's too (the GPU database).
        def hub_id(self) -> str: ...

    @default("batch_query_cmd")
    def _default_batch_query_cmd(self) -> str:
        # batchspawner's query without ``-t all`` lists nothing for a job that ended, so its final state
        # (why the server is gone) would be lost; with it a finished job reads "NODE_FAIL wbnode1".
        # %l (the time limit) before %B: batchspawner reads the host as the line's last word.
        return "squeue -h -t all -j {job_id} -o '%T %l %B'"

    def slurm_tag(self) -> str:
        return job_tag(self.user.name, self.name, self.hub_id())

    async def poll(self):
        status = await self.query_job_status()
        if status == JobStatus.PENDING and self.job_id and not getattr(self, "_gpu_starting", False):
            self.log.warning(
                "Slurm job %s of %s is pending again (requeued): its server ended; cancelling it",
                self.job_id,
                self.server_label,
            )
            self.slurm_end = (self.job_id, "REQUEUED")
            await self._cancel_quietly()
            self.clear_state()
            return 1
        if status in (JobStatus.PENDING, JobStatus.RUNNING, JobStatus.UNKNOWN):
            return None
        if self.job_id and not self.job_status.strip():
            # squeue answered nothing at all: its call failed (batchspawner logs "Error querying job" and
            # leaves the status blank) or slurmctld gave no line. That says nothing about the job, which a
            # job Slurm no longer knows does ("Invalid job id specified"): judged gone, a running server's
            # lease was closed as "server exited: exit code 1" on a loaded CI. The next poll asks again.
            self.log.warning(
                "Could not read the state of Slurm job %s of %s (squeue answered nothing); asking again at the "
                "next poll",
                self.job_id,
                self.server_label,
            )
            return None
        # The whole line ("NODE_FAIL 1:00:00 wbnode1"): the ending names the node and the time limit.
        self.slurm_end = (self.job_id, self.job_status.strip() if final_state(self.job_status) else "")
        self.clear_state()
        return 1

    async def cancel_batch_job(self) -> None:
        """batchspawner's scancel (as the user), noted first as the hub's own cancel."""
        if self.job_id:
            note_hub_cancel(self.job_id)
        await super().cancel_batch_job()

    async def stop(self, now=False):
        if self.job_id:
            await super().stop(now=now)
        else:
            await self._cancel_quietly()

    async def _cancel_quietly(self) -> None:
        """Cancel this server's job, by id, or by its tag when the id is not known. Never raises."""
        try:
            if self.job_id:
                await asyncio.to_thread(cancel, self.job_id)
            else:
                tag = await asyncio.to_thread(self.slurm_tag)
                found = await asyncio.to_thread(cancel_tagged, tag, self.user.name)
                if found:
                    self.log.info("Cancelled Slurm job(s) %s of %s found by tag", ", ".join(found), self.server_label)
        except SlurmUnavailableError as exc:
            self.log.warning("Could not cancel the Slurm job of %s: %s", self.server_label, exc)


_STATE_WORD = re.compile(r"^[A-Z_]+$")


def final_state(job_status: str) -> str:
    """The state word of squeue's ``%T %B`` line for a job that left the running states ("NODE_FAIL"), or
    "" when the line is no state (squeue's error for a job it no longer knows, or nothing)."""
    first = (job_status or "").strip().split(" ", 1)[0]
    return first if _STATE_WORD.match(first) else ""
