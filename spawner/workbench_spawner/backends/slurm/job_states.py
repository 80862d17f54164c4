"""What a pending job's state means to the person waiting for it: Slurm's reason in words, and its place.

Slurm's words (``Resources``, ``ReqNodeNotAvail``) are for admins; the
spawn page says them in a student's words. Pure rules over ``SlurmJob``
records (``records.py``): the placement's wait sentence and whether waiting
can help at all. An ended job's state in words is ``ending.py``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from workbench_spawner.backends.slurm.records import SlurmJob

# Slurm's pending reasons, in words a student understands. {what} is the request.
REASON_WORDS = {
    "Resources": "all {total} that fit are in use",
    "Priority": "jobs with higher priority are ahead",
    "Dependency": "it waits for another job",
    "QOSMaxGRESPerUser": "your Slurm QOS allows no more GPUs at once",
    "QOSGrpGRES": "your group's Slurm QOS has no GPUs left",
    "AssocGrpGRES": "your Slurm account has no GPUs left",
    "ReqNodeNotAvail": "the nodes it needs are unavailable (down, drained or reserved)",
    "PartitionDown": "the partition is down",
    "PartitionNodeLimit": "the partition cannot fit it",
    "BeginTime": "its start time has not come",
    "JobHeldAdmin": "an administrator holds it",
    "JobHeldUser": "it is held",
    "Reservation": "it waits for a reservation",
    "None": "Slurm has not looked at it yet",
}

# Pending reasons that no amount of waiting fixes: the spawn is cancelled at once. Not
# ReqNodeNotAvail: a drained or rebooting node comes back, so that job waits out the queue timeout.
HOPELESS_REASONS = (
    "PartitionConfig",
    "BadConstraints",
    "InvalidQOS",
    "InvalidAccount",
    "QOSMaxWallDurationPerJobLimit",
    "PartitionTimeLimit",
)


def queue_position(jobs: Sequence[SlurmJob], job_id: str) -> int:
    """How many pending GPU jobs in the same partition Slurm would start before ``job_id``."""
    mine = next((j for j in jobs if j.job_id == job_id), None)
    if mine is None:
        return 0

    def rank(job: SlurmJob) -> tuple[int, int, int]:  # Slurm starts the highest priority first, then the oldest
        return (job.priority, -job.submit_time, -int(job.job_id or 0))

    rivals = (j for j in jobs if j.pending and j.gpus_requested and j.partition == mine.partition)
    return sum(1 for j in rivals if rank(j) > rank(mine))  # never itself: no job ranks above itself


def pending_message(
    job: SlurmJob,
    ahead: int,
    total_gpus: int,
    what: str,
    noun: str = "GPUs",
    unavailable: Mapping[str, tuple[int, str]] | None = None,
) -> str:
    """The progress line for a pending job: Slurm's reason in words, and the position.

    ``total_gpus`` counts what the request asks for on nodes that take jobs now, ``noun`` names it:
    "GPUs", or "1g.18gb slices" for a slice request (a whole GPU does not fit a slice request, nor a
    slice a whole one). ``unavailable``: node -> (how many of those are on it, why it takes no job),
    for nodes that are down, drained or not responding; said after the position, so "all 2 GPUs that
    fit are in use" is not read as a cluster of 2."""
    # "ReqNodeNotAvail, UnavailableNodes:n2" is a ReqNodeNotAvail: the words go by the first one.
    key = re.split(r"[ ,:(]", job.reason or "", maxsplit=1)[0]
    words = REASON_WORDS.get(key, "Slurm keeps it pending").format(total=f"{total_gpus} {noun}")
    position = f"{ahead} job{'s' if ahead != 1 else ''} ahead" if ahead else "next in line"
    text = f"Waiting for {what}: {words} (Slurm: {job.reason or 'pending'}), {position}"
    return text + unavailable_note(unavailable or {}, noun)


def unavailable_note(unavailable: Mapping[str, tuple[int, str]], noun: str = "GPUs") -> str:
    """ "; 2 more GPUs are on wbnode1, which takes no jobs now: down, not responding", or "" (none)."""
    counted = {node: (n, why) for node, (n, why) in unavailable.items() if n > 0}
    if not counted:
        return ""
    total = sum(n for n, _why in counted.values())
    what = f"{total} more {noun[:-1] if total == 1 and noun.endswith('s') else noun} {'is' if total == 1 else 'are'}"
    if len(counted) == 1:
        ((node, (_n, why)),) = counted.items()
        return f"; {what} on {node}, which takes no jobs now: {why}"
    where = "; ".join(f"{node} {why}" for node, (_n, why) in sorted(counted.items()))
    return f"; {what} on nodes that take no jobs now: {where}"


def is_hopeless(reason: str) -> bool:
    return reason.startswith(HOPELESS_REASONS)
