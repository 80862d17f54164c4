"""The Slurm backend's entry in ``workbench.backends``.

What the Slurm backend adds beyond its spawner: its ``WORKBENCH_SLURM_*``
configuration; the job's start report on the hub's API (in place of
batchspawner's handler, ``report_api``); the service's ``api/slurm/nodes``
routes with their OpenAPI fragment, and ``workbench slurm-nodes`` and
``workbench slurm-forget-node`` (``nodes``: what the hub learned about each
node's GPUs, and forgetting it after they were replaced); the fleet view's
inventory under the UUIDs jobs reported and each GPU's Slurm state.
Built by ``placement.engine_extension.engine_extension``, as every engine's is.
"""

from __future__ import annotations

from pathlib import Path

from workbench_spawner.backend import NodeDrain
from workbench_spawner.backends.slurm.config import configure
from workbench_spawner.placement.engine_extension import engine_extension
from workbench_spawner.placement.engine_fleet import EngineNodes

HERE = "workbench_spawner.backends.slurm"

nodes = EngineNodes(
    prefix="slurm",
    engine="Slurm",
    book=f"{HERE}.inventory:NodeGPUMap",
    rows=f"{HERE}.fleet:node_rows",
    max_node=255,
    unknown="the hub knows nothing about the GPUs of a node named {node}; `workbench slurm-nodes` lists the nodes "
    "it knows",
    forgot="The hub forgot the GPUs of {node}; the next job there names them again.",
    lines=lambda n: [f"{n['node']}:{g['index']} {g['uuid']} {g['name']}" for g in n["gpus"]],
    none="no GPU reported by a Slurm job yet",
    nodes_help="Slurm: the GPUs jobs reported on each node",
    forget_help="Slurm: forget a node's GPUs after replacing them",
    node_help="the Slurm node name, as sinfo prints it",
)

extension = engine_extension(
    name="slurm",
    spawner="gpu-slurm",
    summary="one batch job per server; Slurm places the GPUs and the job reports their UUIDs (engine placement)",
    configure=configure,
    setup_hub=f"{HERE}.report_api:install",
    nodes=nodes,
    annotate_fleet=f"{HERE}.fleet:annotate_slurm",
    openapi=Path(__file__).with_name("openapi.yaml"),
    node_drain=NodeDrain(
        engine="Slurm",
        verb="drain",
        close='scontrol update NodeName={node} State=DRAIN Reason="..."',
        reopen="scontrol update NodeName={node} State=RESUME",
        wait_for="its jobs",
    ),
)
