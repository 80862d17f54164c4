"""What the hub learned about each Slurm node's GPUs, and forgetting it.

On Slurm the hub names a real GPU by the UUID the first job on its node
reported (``backends.slurm.inventory.NodeGPUMap``), and refuses a
later report that contradicts it. When a node's GPUs are replaced, an admin
forgets what was known (``DELETE api/slurm/nodes/{node}``, or
``workbench slurm-forget-node NODE``); the next job on the node names them
again. ``GET api/slurm/nodes`` (read scope) lists what is known.
"""

from __future__ import annotations

import asyncio

from workbench_hub.service.handlers import APIHandler
from workbench_spawner.backends.slurm.inventory import NodeGPUMap
from workbench_spawner.placement.engine_fleet import forget_node_handler

MAX_NODE = 255


class SlurmNodesHandler(APIHandler):
    async def get(self):
        await self.require_read()
        known = await asyncio.to_thread(NodeGPUMap(self.fleet.store).known)
        self.send({"nodes": [{"node": node, "gpus": gpus} for node, gpus in sorted(known.items())]})


SlurmNodeHandler = forget_node_handler(
    NodeGPUMap,
    "Slurm",
    MAX_NODE,
    "the hub knows nothing about the GPUs of a node named {node}; `workbench slurm-nodes` lists the nodes it knows",
)


def slurm_routes(prefix: str) -> list[tuple]:
    return [(prefix + "api/slurm/nodes", SlurmNodesHandler), (prefix + r"api/slurm/nodes/([^/]+)", SlurmNodeHandler)]
