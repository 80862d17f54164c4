"""The Kubernetes backend's entry in ``workbench.backends``.

What it adds beyond its spawner: its ``WORKBENCH_*`` configuration; the pod's
start report on the hub's API (``report_api``, through ``c.JupyterHub.extra_handlers``); the lock-down check of the
final config at hub start; the fleet view's inventory under the UUIDs pods
reported and each GPU's node as Kubernetes sees it (``fleet``);
``workbench kubernetes-nodes`` and ``workbench kubernetes-forget-node``.
Built by ``placement.engine_extension.engine_extension``, as every engine's is.
"""

from __future__ import annotations

from pathlib import Path

from workbench_spawner.backend import NodeDrain
from workbench_spawner.backends.kubernetes.config import configure
from workbench_spawner.placement.engine_extension import engine_extension

HERE = "workbench_spawner.backends.kubernetes"

extension = engine_extension(
    name="kubernetes",
    spawner="gpu-kubernetes",
    summary="one locked-down pod per server; the Kubernetes scheduler places the GPUs and the pod reports their "
    "UUIDs (engine placement)",
    configure=configure,
    check=f"{HERE}.fleet:check_config",
    setup_hub=f"{HERE}.report_api:install",
    book=f"{HERE}.inventory:NodeUUIDs",
    annotate_fleet=f"{HERE}.fleet:annotate_kubernetes",
    service_routes=f"{HERE}.fleet:kubernetes_routes",
    cli_names=("kubernetes-nodes", "kubernetes-forget-node"),
    add_parsers=f"{HERE}.fleet:add_parsers",
    run_cli=f"{HERE}.fleet:run_cli",
    openapi=Path(__file__).with_name("openapi.yaml"),
    node_drain=NodeDrain(
        engine="Kubernetes",
        verb="cordon",
        close="kubectl cordon {node}",
        reopen="kubectl uncordon {node}",
        wait_for="the pods on it",
    ),
)
