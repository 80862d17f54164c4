"""After a hub restart: the ledger and Slurm's job list made to agree.

Servers keep running while the hub is down (``cleanup_servers = False``).
When the hub starts again, the policy first releases every lease whose job
no longer runs (``SlurmGPUSpawner.gpu_lease_alive``; its ledger entry is
closed with the backend's reason, or "server gone"). Then this rule deals with
the hub's own jobs that have no lease, found by the tag in their comment
(``workbench:<hub id>:<user>/<server>``; jobs of another hub on the same
cluster are left alone):

* still **pending**: the spawn that waited for it is gone with the old hub
  process, so it is cancelled (a job nobody waits for must not take GPUs);
* **running** with GPUs the hub can name (simulated nodes, or a node whose
  GPUs a job reported before, ``NodeGPUMap``) that nobody else holds: adopted,
  a lease is written with the job's node and start time;
* **running** otherwise (its GPUs are leased to another server, or unknown
  to the hub): cancelled, because the ledger could not count it.

A job whose Slurm user is not the user its tag names is not the hub's (any
cluster user can write a comment) and is left alone. An adopted job that
JupyterHub does not track any more is ended when that server starts again
(``SlurmGPUSpawner._end_leftovers``), or by its time limit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from workbench_devices import DeviceInventory
from workbench_spawner.backends.slurm.jobs import SlurmJob
from workbench_spawner.ledger.store import AllocationStore, Lease

log = logging.getLogger("workbench.slurm")


@dataclass(frozen=True)
class Action:
    """What reconcile did with one job: "adopted", "cancelled" (with why) or "left"."""

    job_id: str
    what: str
    why: str = ""


def adopter(
    store: AllocationStore, inventory: DeviceInventory
) -> Callable[[str, str, list[str], str, datetime | None, str], bool]:
    """``store.adopt`` recording each device's share of a GPU: an adopted MIG slice is charged as a slice
    (a ``1g`` slice-hour is 1/7 of a GPU-hour), as it was before the hub restarted."""
    shares = {d.uuid: d.share for d in inventory.devices}

    def adopt(user: str, server: str, uuids: list[str], ref: str, since: datetime | None, node: str) -> bool:
        return store.adopt(user, server, uuids, ref, since, node, shares=shares)

    return adopt


def reconcile_jobs(
    jobs: Sequence[SlurmJob],
    leases: Iterable[Lease],
    hub: str,
    uuid_at: Callable[[str, int], str | None],
    adopt: Callable[[str, str, list[str], str, datetime | None, str], bool],
    cancel: Callable[[str], None],
    submitted_before: float | None = None,
) -> list[Action]:
    """Apply the rule above to ``jobs``; every decision is logged and returned.

    ``submitted_before``: jobs submitted later are this hub process's own spawns in progress, never
    orphans. A tag whose user is not the job's Slurm user was written by someone else (anyone may
    ``sbatch --comment=workbench:...``): left alone, never charged to the user it names."""
    leased = {(lease.user, lease.server) for lease in leases}
    actions = []
    for job in jobs:
        tag = job.tag
        if tag is None or tag in leased:
            continue
        if not job.belongs_to(hub):
            actions.append(Action(job.job_id, "left", "another hub's job"))
            continue
        user, server = tag
        if job.user and job.user != user:
            log.warning(
                "Slurm job %s of %s carries the tag of %s/%s: not the workbench's, left alone",
                job.job_id,
                job.user,
                user,
                server,
            )
            actions.append(Action(job.job_id, "left", "tagged by another user"))
            continue
        if submitted_before is not None and job.submit_time >= submitted_before:
            actions.append(Action(job.job_id, "left", "submitted by this hub process"))
            continue
        if job.pending:
            log.warning(
                "Cancelling pending Slurm job %s of %s/%s: no spawn waits for it any more", job.job_id, user, server
            )
            cancel(job.job_id)
            actions.append(Action(job.job_id, "cancelled", "pending with no spawn waiting"))
            continue
        if not job.running or not job.gpu_indices:
            continue  # a CPU-only job holds no GPU: left to JupyterHub (this rule runs on every pass)
        uuids = [uuid_at(job.node, i) for i in job.gpu_indices]
        since = datetime.fromtimestamp(job.start_time, UTC) if job.start_time else None
        known = [u for u in uuids if u]
        if len(known) == len(uuids) and (
            not known or adopt(user, server, known, f"slurm:{job.job_id}", since, job.node)
        ):
            log.info(
                "Adopted Slurm job %s of %s/%s on %s with GPU(s) %s",
                job.job_id,
                user,
                server,
                job.node,
                known or "none",
            )
            actions.append(Action(job.job_id, "adopted"))
        else:
            why = (
                "its GPUs are unknown to the hub"
                if len(known) != len(uuids)
                else "its GPUs are leased to another server"
            )
            log.warning("Cancelling Slurm job %s of %s/%s: %s", job.job_id, user, server, why)
            cancel(job.job_id)
            actions.append(Action(job.job_id, "cancelled", why))
    return actions
