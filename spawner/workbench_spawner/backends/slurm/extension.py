"""The Slurm backend's entry in ``workbench.backends``.

What the Slurm backend adds beyond its spawner: its ``WORKBENCH_SLURM_*``
configuration; the job's start report on the hub's API (in place of
batchspawner's handler, ``report_api``); the service's ``api/slurm/nodes``
routes with their OpenAPI fragment; the fleet view's inventory under the
UUIDs jobs reported and each GPU's Slurm state; ``workbench slurm-nodes``
and ``workbench slurm-forget-node``.
Built by ``placement.engine_extension.engine_extension``, as every engine's is.
"""

from __future__ import annotations

from pathlib import Path

from workbench_spawner.backend import NodeDrain
from workbench_spawner.backends.slurm.config import configure
from workbench_spawner.placement.engine_extension import engine_extension

HERE = "workbench_spawner.backends.slurm"

extension = engine_extension(
    name="slurm",
    spawner="gpu-slurm",
    summary="one batch job per server; Slurm places the GPUs and the job reports their UUIDs (engine placement)",
    configure=configure,
    setup_hub=f"{HERE}.report_api:install",
    book=f"{HERE}.inventory:NodeGPUMap",
    annotate_fleet=f"{HERE}.fleet:annotate_slurm",
    service_routes=f"{HERE}.service_routes:slurm_routes",
    cli_names=("slurm-nodes", "slurm-forget-node"),
    add_parsers=f"{HERE}.cli:add_slurm_parsers",
    run_cli=f"{HERE}.cli:run_slurm",
    openapi=Path(__file__).with_name("openapi.yaml"),
    node_drain=NodeDrain(
        engine="Slurm",
        verb="drain",
        close='scontrol update NodeName={node} State=DRAIN Reason="..."',
        reopen="scontrol update NodeName={node} State=RESUME",
        wait_for="its jobs",
    ),
)
