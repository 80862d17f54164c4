"""``workbench slurm-nodes`` and ``workbench slurm-forget-node NODE``: the GPUs the hub learned per Slurm node.

    workbench slurm-nodes                 # node, index, UUID and name of every GPU jobs reported
    workbench slurm-forget-node gpu07     # after replacing gpu07's GPUs: the next job names them again

Through the workbench service (``api/slurm/nodes``), like the rest of
``workbench``; exit codes are the same (1: refused, 2: bad command line or
service unreachable).
"""

from __future__ import annotations

from urllib.parse import quote


def add_slurm_parsers(top) -> None:
    top.add_parser("slurm-nodes", help="Slurm: the GPUs jobs reported on each node")
    forget = top.add_parser("slurm-forget-node", help="Slurm: forget a node's GPUs after replacing them")
    forget.add_argument("node", help="the Slurm node name, as sinfo prints it")


def run_slurm(args, call) -> tuple[object, str]:
    if args.area == "slurm-forget-node":
        call(args.url, args.token, "DELETE", f"api/slurm/nodes/{quote(args.node, safe='')}")
        return None, f"The hub forgot the GPUs of {args.node}; the next job there names them again."
    data = call(args.url, args.token, "GET", "api/slurm/nodes")
    lines = [f"{n['node']}:{g['index']} {g['uuid']} {g['name']}" for n in data["nodes"] for g in n["gpus"]]
    return data, "\n".join(lines) or "no GPU reported by a Slurm job yet"
