"""``workbench slurm-nodes`` and ``workbench slurm-forget-node NODE``: the GPUs the hub learned per Slurm node.

    workbench slurm-nodes                 # node, index, UUID and name of every GPU jobs reported
    workbench slurm-forget-node gpu07     # after replacing gpu07's GPUs: the next job names them again

Through the workbench service (``api/slurm/nodes``), like the rest of
``workbench``; exit codes are the same (1: refused, 2: bad command line or
service unreachable).
"""

from __future__ import annotations

from workbench_spawner.placement.engine_fleet import add_node_parsers, run_node_cli


def add_slurm_parsers(top) -> None:
    add_node_parsers(
        top,
        "slurm",
        "Slurm: the GPUs jobs reported on each node",
        "Slurm: forget a node's GPUs after replacing them",
        "the Slurm node name, as sinfo prints it",
    )


def run_slurm(args, call) -> tuple[object, str]:
    return run_node_cli(
        args,
        call,
        "slurm",
        "The hub forgot the GPUs of {node}; the next job there names them again.",
        lambda data: [f"{n['node']}:{g['index']} {g['uuid']} {g['name']}" for n in data["nodes"] for g in n["gpus"]],
        "no GPU reported by a Slurm job yet",
    )
