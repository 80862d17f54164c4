"""Reservations and fair share on Slurm, with the same rules as on one host.

On one host the allocator enforces both inside its transaction. On Slurm
the engine places, so each rule is applied where the workbench still
decides:

* **Reservations** are checked before a job is submitted. A user who is not
  in a group with an open reservation may submit only while Slurm's free
  GPUs (its node records: GRES minus GRES used) cover what the reservations
  still keep for their members after this request (``gpus_user_may_take``,
  the host allocator's rule: grace period, members' demand). Until then
  the spawn waits in the hub, says why, and counts against the queue
  timeout; nothing is pending in Slurm meanwhile, so Slurm cannot hand a
  member's GPU to it. Members submit at once. Jobs from outside the
  workbench are not ours to hold back: a site that needs hard guarantees
  adds a Slurm reservation (docs/slurm.md).
* **Fair share** (``WORKBENCH_QUEUE_ORDER=fair-share``) reorders the
  workbench's own pending jobs: the priorities Slurm gave them are handed
  out again in fair-share order (``queue_order.order``: fewest GPU-hours
  this week first, ties and aged requests by arrival). The set of
  priorities stays the same, so jobs from outside the workbench keep their
  place relative to ours; only who among ours goes first changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from workbench_devices import DeviceInventory
from workbench_spawner.backends.slurm.records import SlurmJob, SlurmNode
from workbench_spawner.form.options import device_matches
from workbench_spawner.rules.queue_order import Waiting, order


def free_on_slurm(inventory: DeviceInventory, nodes: Sequence[SlurmNode], model: str | None) -> list[str]:
    """The inventory's whole GPUs (of ``model``) that Slurm has not allocated, on nodes that can run jobs.

    MIG slices are left out: reservations keep whole GPUs, and a free slice is not a free GPU."""
    by_name = {n.name: n for n in nodes}
    free = []
    for device in inventory.devices:
        node = by_name.get(device.node)
        if node is not None and node.usable and device.index not in node.gpus_used and device_matches(device, model):
            free.append(device.uuid)
    return free


def reprioritize(
    jobs: Sequence[SlurmJob], waiting: Mapping[str, Waiting], mode: str, now: float, aging_minutes: float
) -> list[tuple[str, int]]:
    """(job id, new priority) for our pending jobs whose priority must change to serve them in ``mode``'s order.

    Per partition, the priorities our pending jobs hold now are sorted and
    given back in serving order, highest first. Nothing changes in fifo mode
    or while fewer than two of ours wait in a partition."""
    if mode != "fair-share":
        return []
    # A held job (priority 0, JobHeld*) keeps its hold: passing its 0 on would hold another user's job.
    ours = [
        j for j in jobs if j.pending and j.job_id in waiting and j.priority > 0 and not j.reason.startswith("JobHeld")
    ]
    changes = []
    for partition in sorted({j.partition for j in ours}):
        here = {j.job_id: j for j in ours if j.partition == partition}
        if len(here) < 2:
            continue
        ordered = order([waiting[job_id] for job_id in here], mode, now, aging_minutes)
        priorities = sorted((j.priority for j in here.values()), reverse=True)
        for item, priority in zip(ordered, priorities):  # noqa: B905
            if here[item.key].priority != priority:
                changes.append((item.key, priority))
    return changes
