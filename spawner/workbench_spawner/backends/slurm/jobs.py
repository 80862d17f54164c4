"""Slurm's commands (blocking: call them from a worker thread), and the cancels this hub made.

``squeue``, ``sinfo``, ``scancel`` and ``scontrol`` run here, each answer
parsed by ``records.py``; a controller that does not answer is
``SlurmUnavailableError``, never a crash. Every cancel the hub makes is noted
first (``note_hub_cancel``), so a job that ends CANCELLED is told apart from
one an admin or the user cancelled. What we say to sbatch is in
``sbatch.py``.
"""

from __future__ import annotations

import subprocess
import threading
from collections import OrderedDict

from workbench_spawner.backends.slurm.records import SlurmJob, SlurmNode, parse_sinfo_json, parse_squeue_json


class SlurmUnavailableError(RuntimeError):
    """Slurm's controller did not answer; str(err) says why."""


def run_slurm(args: list[str], timeout: float = 20) -> str:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmUnavailableError(f"{args[0]} failed: {exc}") from None
    if done.returncode != 0:
        raise SlurmUnavailableError(f"{' '.join(args[:2])}: {(done.stderr or done.stdout).strip()[:300]}")
    return done.stdout


def list_jobs() -> list[SlurmJob]:
    """Every job Slurm knows now (all users)."""
    return parse_squeue_json(run_slurm(["squeue", "--all", "--json"]))


def list_nodes() -> list[SlurmNode]:
    return parse_sinfo_json(run_slurm(["sinfo", "--json"]))


def partitions() -> list[str]:
    out = run_slurm(["sinfo", "-h", "-o", "%R"])
    return sorted({line.strip() for line in out.splitlines() if line.strip()})


# Job ids this hub process cancelled (a stop, a queue timeout, a failed start), newest last, so a job
# that ends CANCELLED is told apart from one an admin or the user cancelled with scancel. Bounded: a
# job's final state is read within a poll or two of the cancel.
_HUB_CANCELLED: OrderedDict[str, None] = OrderedDict()
_HUB_CANCELLED_MAX = 10_000
_hub_cancelled_lock = threading.Lock()


def note_hub_cancel(job_id: str) -> None:
    """Remember that this hub cancels ``job_id`` (before the scancel, so no poll sees it unannounced)."""
    with _hub_cancelled_lock:
        _HUB_CANCELLED[str(job_id)] = None
        _HUB_CANCELLED.move_to_end(str(job_id))
        while len(_HUB_CANCELLED) > _HUB_CANCELLED_MAX:
            _HUB_CANCELLED.popitem(last=False)


def cancelled_by_hub(job_id: str) -> bool:
    """Whether this hub process cancelled ``job_id`` (``note_hub_cancel``)."""
    with _hub_cancelled_lock:
        return str(job_id) in _HUB_CANCELLED


def cancel(job_id: str) -> None:
    note_hub_cancel(job_id)
    run_slurm(["scancel", str(job_id)])


def cancel_tagged(tag: str, user: str) -> list[str]:
    """Cancel every pending or running job of ``user`` whose comment is ``tag``; their ids.

    For a spawn abandoned while ``sbatch`` still ran: the job may exist though
    the hub never learned its id. Only the user's own jobs: anyone can write
    a comment."""
    found = [j.job_id for j in list_jobs() if j.comment.strip() == tag and j.user == user and (j.pending or j.running)]
    for job_id in found:
        cancel(job_id)
    return found


def set_priority(job_id: str, priority: int) -> None:
    """Slurm's priority of a pending job (the hub runs as Slurm's operator: root on the head node)."""
    run_slurm(["scontrol", "update", f"JobId={job_id}", f"Priority={int(priority)}"])
