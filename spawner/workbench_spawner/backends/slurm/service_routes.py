"""What the hub learned about each Slurm node's GPUs, and forgetting it.

On Slurm the hub names a real GPU by the UUID the first job on its node
reported (``workbench_spawner.backends.slurm.inventory.NodeGPUMap``), and refuses a
later report that contradicts it. When a node's GPUs are replaced, an admin
forgets what was known (``DELETE api/slurm/nodes/{node}``, or
``workbench slurm-forget-node NODE``); the next job on the node names them
again. ``GET api/slurm/nodes`` (read scope) lists what is known.
"""

from __future__ import annotations

import asyncio
import json
import logging

from workbench_hub.service.handlers import APIHandler
from workbench_spawner.backends.slurm.inventory import NodeGPUMap

log = logging.getLogger("workbench.service")

MAX_NODE = 255


class SlurmNodesHandler(APIHandler):
    async def get(self):
        await self.require_read()
        known = await asyncio.to_thread(NodeGPUMap(self.fleet.store).known)
        self.send({"nodes": [{"node": node, "gpus": gpus} for node, gpus in sorted(known.items())]})


class SlurmNodeHandler(APIHandler):
    async def delete(self, node: str):
        await self.require_admin("make the hub forget a node's GPUs")
        if len(node) > MAX_NODE:
            self.fail(400, f"a node name has at most {MAX_NODE} characters")
        if not await asyncio.to_thread(NodeGPUMap(self.fleet.store).forget, node):
            self.fail(
                404,
                f"the hub knows nothing about the GPUs of a node named {json.dumps(node)}; "
                "`workbench slurm-nodes` lists the nodes it knows",
            )
        log.info("%s made the hub forget the GPUs of Slurm node %s", self.caller_name(), node)
        self.set_status(204)
        self.finish()


def slurm_routes(prefix: str) -> list[tuple]:
    return [(prefix + "api/slurm/nodes", SlurmNodesHandler), (prefix + r"api/slurm/nodes/([^/]+)", SlurmNodeHandler)]
