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

The rule is the engines' shared one (``placement.engine_reconcile``); this
module reads a Slurm job for it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime

from workbench_spawner.backends.slurm.jobs import SlurmUnavailableError
from workbench_spawner.backends.slurm.records import SlurmJob
from workbench_spawner.ledger.store import Lease
from workbench_spawner.placement.engine_reconcile import Action, Adopt, Orphan, ReconcileWords, reconcile_walk

log = logging.getLogger("workbench.slurm")


def reconcile_jobs(
    jobs: Sequence[SlurmJob],
    leases: Iterable[Lease],
    hub: str,
    uuid_at: Callable[[str, int], str | None],
    adopt: Adopt,
    cancel: Callable[[str], None],
    submitted_before: float | None = None,
) -> list[Action]:
    """Apply the rule above to ``jobs``; every decision is logged and returned.

    ``submitted_before``: jobs submitted later are this hub process's own spawns in progress, never
    orphans. A tag whose user is not the job's Slurm user was written by someone else (anyone may
    ``sbatch --comment=workbench:...``): left alone, never charged to the user it names."""
    leased = {(lease.user, lease.server) for lease in leases}
    orphans = (_orphan(job, leased, hub, uuid_at, submitted_before) for job in jobs)
    return reconcile_walk(orphans, adopt, cancel, WORDS, log, SlurmUnavailableError)


WORDS = ReconcileWords(
    noun="Slurm job",
    ended="cancelled",
    end_verb="Cancelling",
    end_failed="Could not cancel Slurm job",
    pending_why="pending with no spawn waiting",
    unknown_why="its GPUs are unknown to the hub",
)


def _orphan(
    job: SlurmJob,
    leased: set[tuple[str, str]],
    hub: str,
    uuid_at: Callable[[str, int], str | None],
    submitted_before: float | None,
) -> Orphan | None:
    """The job as reconcile reads it; None: not the workbench's, leased, or holding no GPU."""
    tag = job.tag
    if tag is None or tag in leased:
        return None
    user, server = tag
    if not job.belongs_to(hub):
        return Orphan(job.job_id, user, server, left="another hub's job")
    if job.user and job.user != user:
        log.warning(
            "Slurm job %s of %s carries the tag of %s/%s: not the workbench's, left alone",
            job.job_id,
            job.user,
            user,
            server,
        )
        return Orphan(job.job_id, user, server, left="tagged by another user")
    if submitted_before is not None and job.submit_time >= submitted_before:
        return Orphan(job.job_id, user, server, left="submitted by this hub process")
    if job.pending:
        return Orphan(job.job_id, user, server, pending=True)
    if not job.running or not job.gpu_indices:
        return None  # a CPU-only job holds no GPU: left to JupyterHub (this rule runs on every pass)
    since = datetime.fromtimestamp(job.start_time, UTC) if job.start_time else None
    uuids = [uuid_at(job.node, i) for i in job.gpu_indices]
    return Orphan(job.job_id, user, server, f"slurm:{job.job_id}", job.node, since, uuids=uuids)
