"""Why a Slurm job that ran a server ended, as the student's sentence (``ledger.endings``).

``job_ending`` maps Slurm's final job state to the ledger's reason
(NODE_FAIL is "node failed", a CANCELLED job this hub did not cancel "job
cancelled outside the hub") with what the student needs to read: the
node's name and why Slurm marked it down ("Not responding"), the job's id
and its time limit. Both the spawner's poll (the squeue line it saw
last, ``%T %l %B``) and the reconciler (the job list) use it.

=================================  ===============================================================
Slurm's final state                the sentence
=================================  ===============================================================
NODE_FAIL, BOOT_FAIL               The node wbnode1 this server ran on failed (Slurm: down, ...).
OUT_OF_MEMORY                      This server was stopped because it ran out of memory ...
PREEMPTED                          Slurm evicted this server: a job of higher priority took ...
CANCELLED (not by this hub)        The Slurm job 42 running this server was cancelled outside ...
TIMEOUT, DEADLINE                  The Slurm job 42 running this server reached its time limit ...
FAILED                             The Slurm job 42 running this server failed.
COMPLETED                          This server exited on its own (exit code 0).
REQUEUED (by an admin or Slurm)    The Slurm job 42 running this server was requeued ...
=================================  ===============================================================
"""

from __future__ import annotations

from collections.abc import Callable

from workbench_spawner.ledger import endings, reasons
from workbench_spawner.ledger.endings import Ending

_NO_NODE = {"", "n/a", "(null)", "None"}


def job_ending(
    job_id: str, status: str, hub_cancelled: bool = False, node_why: Callable[[str], str] = lambda node: ""
) -> Ending | None:
    """The end of job ``job_id`` from its final ``status`` line ("NODE_FAIL 1:00:00 wbnode1", or just the
    state); None when the line says nothing (squeue no longer knew the job). ``node_why``: why Slurm holds
    a node down now ("down, not responding (Not responding)"; "" when it is up again)."""
    words = (status or "").split()
    if not words:
        return None
    state = words[0].upper()
    node = words[-1] if len(words) > 1 and words[-1] not in _NO_NODE and ":" not in words[-1] else ""
    limit = next((w for w in words[1:] if ":" in w or w == "UNLIMITED"), "")
    if state in ("NODE_FAIL", "BOOT_FAIL"):  # BOOT_FAIL: the node failed to boot for the job
        return endings.node_failed(node, node_why(node) if node else "", "Slurm" if node else "")
    if state == "OUT_OF_MEMORY":
        return endings.out_of_memory()
    if state == "PREEMPTED":
        return endings.evicted("a job of higher priority took its resources", engine="Slurm")
    if state == "CANCELLED":
        # A job this hub cancelled (``cancelled_by_hub``) was stopped through the hub, never "cancelled outside".
        return endings.stopped_by_hub() if hub_cancelled else endings.job_cancelled(job_id)
    if state in ("TIMEOUT", "DEADLINE"):
        return endings.job_timed_out(job_id, "" if limit == "UNLIMITED" else limit)
    if state == "FAILED":
        return endings.job_failed(job_id)
    if state == "COMPLETED":
        return endings.server_exited(0)
    if state == "REQUEUED":
        return Ending(
            reasons.SERVER_EXITED,
            f"The Slurm job {job_id} running this server was requeued, so its server ended.",
            detail=f"job {job_id} requeued",
        )
    return None
