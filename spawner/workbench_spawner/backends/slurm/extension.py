"""The Slurm backend's entry in ``workbench.backends``.

What the Slurm backend adds beyond its spawner: its ``WORKBENCH_SLURM_*``
configuration; the job's start report on the hub's API (in place of
batchspawner's handler, ``report_api``); the service's ``api/slurm/nodes``
routes with their OpenAPI fragment; the fleet view's inventory under the
UUIDs jobs reported and each GPU's Slurm state; ``workbench slurm-nodes``
and ``workbench slurm-forget-node``.
"""

from __future__ import annotations

from pathlib import Path

from traitlets.config import Config

from workbench_spawner.backend import BackendExtension, CLICommands, NodeDrain
from workbench_spawner.backends.slurm.config import configure


def setup_hub(c: Config) -> None:
    from workbench_spawner.backends.slurm import report_api

    report_api.install()


def service_routes(prefix: str) -> list[tuple]:
    from workbench_spawner.backends.slurm.service_routes import slurm_routes

    return slurm_routes(prefix)


def resolve_inventory(store, inventory):
    from workbench_spawner.backends.slurm.inventory import NodeGPUMap

    return NodeGPUMap(store).resolve(inventory)


def annotate_fleet(gpus: list[dict]) -> None:
    from workbench_spawner.backends.slurm.fleet import annotate_slurm

    annotate_slurm(gpus)


def _add_parsers(top) -> None:
    from workbench_spawner.backends.slurm.cli import add_slurm_parsers

    add_slurm_parsers(top)


def _run(args, call):
    from workbench_spawner.backends.slurm.cli import run_slurm

    return run_slurm(args, call)


extension = BackendExtension(
    name="slurm",
    spawner="gpu-slurm",
    summary="one batch job per server; Slurm places the GPUs and the job reports their UUIDs (engine placement)",
    configure=configure,
    setup_hub=setup_hub,
    service_routes=service_routes,
    openapi=Path(__file__).with_name("openapi.yaml"),
    resolve_inventory=resolve_inventory,
    annotate_fleet=annotate_fleet,
    cli=CLICommands(names=("slurm-nodes", "slurm-forget-node"), add_parsers=_add_parsers, run=_run),
    node_drain=NodeDrain(
        engine="Slurm",
        verb="drain",
        close='scontrol update NodeName={node} State=DRAIN Reason="..."',
        reopen="scontrol update NodeName={node} State=RESUME",
        wait_for="its jobs",
    ),
)
