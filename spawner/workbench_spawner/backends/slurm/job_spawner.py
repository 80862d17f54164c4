"""batchspawner's SlurmSpawner as the workbench follows and stops a job, and the policy's Slurm inventory.

Kept apart from ``slurm_backend`` (admission, placement and the ledger on
Slurm) because these are corrections to how batchspawner 1.3.0 itself
treats a job, true whatever the GPU policy does.
"""

from __future__ import annotations

import asyncio

from batchspawner import JobStatus, SlurmSpawner

from workbench_devices import DeviceInventory
from workbench_spawner.backends.slurm.inventory import NodeGPUMap
from workbench_spawner.backends.slurm.jobs import SlurmUnavailable, cancel, cancel_tagged, job_tag
from workbench_spawner.policy.gpu_policy import GPUPolicy


class SlurmJobSpawner(SlurmSpawner):
    """batchspawner's SlurmSpawner with two fixes to how a job is followed and stopped.

    * ``poll``: a job that runs again as *pending* was requeued (by an admin,
      or by Slurm after a node failure where ``--no-requeue`` is overridden);
      its server is gone and would come back elsewhere with a new port, so it
      is cancelled and counts as ended. batchspawner counts pending as alive.
    * ``stop`` of a spawn abandoned while ``sbatch`` still ran: the hub never
      learned the job's id, so the job is found by its tag and cancelled
      (batchspawner would run ``scancel`` with no id).
    """

    def slurm_tag(self) -> str:
        return job_tag(self.user.name, self.name, self.hub_id())

    def hub_id(self) -> str:
        return ""

    async def poll(self):
        status = await self.query_job_status()
        if status == JobStatus.PENDING and self.job_id and not getattr(self, "_gpu_starting", False):
            self.log.warning(
                "Slurm job %s of %s is pending again (requeued): its server ended; cancelling it",
                self.job_id,
                self._log_name,
            )
            await self._cancel_quietly()
            self.clear_state()
            return 1
        if status in (JobStatus.PENDING, JobStatus.RUNNING, JobStatus.UNKNOWN):
            return None
        self.clear_state()
        return 1

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
                    self.log.info("Cancelled Slurm job(s) %s of %s found by tag", ", ".join(found), self._log_name)
        except SlurmUnavailable as exc:
            self.log.warning("Could not cancel the Slurm job of %s: %s", self._log_name, exc)


class SlurmPolicy(GPUPolicy):
    """The GPU policy on Slurm: its inventory names every GPU a job has reported by its real UUID."""

    @property
    def inventory(self) -> DeviceInventory:
        return NodeGPUMap(self.store).resolve(self.settings.inventory)
