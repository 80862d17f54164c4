"""The Kubernetes backend's entry in ``workbench.backends``.

What it adds beyond its spawner: its ``WORKBENCH_*`` configuration; the pod's
start report on the hub's API (``report_api``); the lock-down check of the
final config at hub start; the fleet view's inventory under the UUIDs pods
reported and each GPU's node as Kubernetes sees it (``fleet``);
``workbench kubernetes-nodes`` and ``workbench kubernetes-forget-node``.
"""

from __future__ import annotations

from pathlib import Path

from traitlets.config import Config

from workbench_spawner.backend import BackendExtension, CLICommands, NodeDrain
from workbench_spawner.backends.kubernetes.config import configure


def check(config: Config) -> list[str]:
    from workbench_spawner.backends.kubernetes.fleet import check_config

    return check_config(config)


def setup_hub(c: Config) -> None:
    from workbench_spawner.backends.kubernetes import report_api

    report_api.install()


def service_routes(prefix: str) -> list[tuple]:
    from workbench_spawner.backends.kubernetes.fleet import kubernetes_routes

    return kubernetes_routes(prefix)


def resolve_inventory(store, inventory):
    from workbench_spawner.backends.kubernetes.inventory import NodeUUIDs

    return NodeUUIDs(store).resolve(inventory)


def annotate_fleet(gpus: list[dict]) -> None:
    from workbench_spawner.backends.kubernetes.fleet import annotate_kubernetes

    annotate_kubernetes(gpus)


def _add_parsers(top) -> None:
    from workbench_spawner.backends.kubernetes.fleet import add_parsers

    add_parsers(top)


def _run(args, call):
    from workbench_spawner.backends.kubernetes.fleet import run_cli

    return run_cli(args, call)


extension = BackendExtension(
    name="kubernetes",
    spawner="gpu-kubernetes",
    summary="one locked-down pod per server; the Kubernetes scheduler places the GPUs and the pod reports their "
    "UUIDs (engine placement)",
    configure=configure,
    check=check,
    setup_hub=setup_hub,
    service_routes=service_routes,
    openapi=Path(__file__).with_name("openapi.yaml"),
    resolve_inventory=resolve_inventory,
    annotate_fleet=annotate_fleet,
    cli=CLICommands(names=("kubernetes-nodes", "kubernetes-forget-node"), add_parsers=_add_parsers, run=_run),
    node_drain=NodeDrain(
        engine="Kubernetes",
        verb="cordon",
        close="kubectl cordon {node}",
        reopen="kubectl uncordon {node}",
        wait_for="the pods on it",
    ),
)
