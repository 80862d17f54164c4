"""The fleet view's Slurm side: each node's state, and which GPUs Slurm itself counts as allocated.

On a Slurm hub the ledger knows the GPUs our jobs hold; Slurm's node records
(``sinfo --json``: state, reason, GRES and GRES used with indices) know every
job's. A GPU Slurm allocates with no lease in our ledger is held by a job
outside the workbench (a batch job, another hub), and the admin page says so.
A GPU on a node Slurm starts no job on (down, drained, failing, not
responding: ``SlurmNode.unusable_because``) has no free slot and says why,
with the node's state and reason, as the spawn form does. Read from the
service's own process (the hub host has Slurm's clients), cached for a couple
of seconds so a busy page does not hammer slurmctld. ``GET api/slurm/nodes``
lists the GPUs jobs reported per node (``node_rows``).
"""

from __future__ import annotations

from workbench_spawner.backends.slurm.node_states import NodeStates

# Slurm's node records by name (None: the controller has not answered yet).
slurm_nodes = NodeStates(max_age=2.0).nodes


def node_rows(known: dict[str, list[dict]]) -> list[dict]:
    """``GET api/slurm/nodes``: each node and the GPUs (index, UUID, name) jobs reported there."""
    return [{"node": node, "gpus": gpus} for node, gpus in sorted(known.items())]


def annotate_slurm(gpus: list[dict]) -> None:
    """Add ``slurm`` (node state and reason, allocated by Slurm, held outside the workbench) to each GPU row,
    and ``unavailable`` (no free slot) on nodes that take no job now."""
    nodes = slurm_nodes()
    for gpu in gpus:
        node = (nodes or {}).get(gpu["node"])
        allocated = bool(node and gpu["index"] in node.gpus_used)
        why = node.unusable_because() if node else None
        gpu["slurm"] = {
            "node_state": node.state.lower() if node else "unknown",
            "node_reason": node.reason if node else "",
            "allocated": allocated,
            "held_outside_workbench": allocated and not gpu["holders"],
        }
        if why is not None:
            gpu["unavailable"] = f"node {gpu['node']} is {why}"
            gpu["free_slots"] = 0
