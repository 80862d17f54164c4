"""The Kubernetes backend's entry in ``workbench.backends``.

What it adds beyond its spawner: its ``WORKBENCH_*`` configuration; the pod's
start report on the hub's API (``report_api``, through ``c.JupyterHub.extra_handlers``); the lock-down check of the
final config at hub start; the fleet view's inventory under the UUIDs pods
reported and each GPU's node as Kubernetes sees it (``fleet``); the service's
``api/kubernetes/nodes`` routes, ``workbench kubernetes-nodes`` and
``workbench kubernetes-forget-node`` (``nodes``: each node's GPUs and the UUIDs
its pods reported, and forgetting those after a node's GPUs were replaced).
Built by ``placement.engine_extension.engine_extension``, as every engine's is.
"""

from __future__ import annotations

from pathlib import Path

from workbench_spawner.backend import NodeDrain
from workbench_spawner.backends.kubernetes.config import configure
from workbench_spawner.placement.engine_extension import engine_extension
from workbench_spawner.placement.engine_fleet import EngineNodes

HERE = "workbench_spawner.backends.kubernetes"

nodes = EngineNodes(
    prefix="kubernetes",
    engine="Kubernetes",
    book=f"{HERE}.inventory:NodeUUIDs",
    rows=f"{HERE}.fleet:node_rows",
    max_node=253,  # a node name is a DNS subdomain
    unknown="the hub knows no GPU UUIDs of a node named {node}; `workbench kubernetes-nodes` lists the nodes",
    forgot="The hub forgot the GPU UUIDs of {node}; the next pod there names them again.",
    lines=lambda n: [
        f"{n['node']}: {n['gpus_requested']}/{n['gpu_allocatable']} GPU(s) requested"
        f"{'' if n['ready'] and n['schedulable'] else ' (not schedulable)'}; reported: "
        f"{', '.join(n['reported_uuids']) or 'none yet'}"
    ],
    none="no node advertises GPUs",
    nodes_help="Kubernetes: each node's GPUs and the UUIDs its pods reported",
    forget_help="Kubernetes: forget a node's GPU UUIDs after replacing them",
    node_help="the node name, as kubectl get nodes prints it",
)

extension = engine_extension(
    name="kubernetes",
    spawner="gpu-kubernetes",
    summary="one locked-down pod per server; the Kubernetes scheduler places the GPUs and the pod reports their "
    "UUIDs (engine placement)",
    configure=configure,
    check=f"{HERE}.fleet:check_config",
    setup_hub=f"{HERE}.report_api:install",
    nodes=nodes,
    annotate_fleet=f"{HERE}.fleet:annotate_kubernetes",
    openapi=Path(__file__).with_name("openapi.yaml"),
    node_drain=NodeDrain(
        engine="Kubernetes",
        verb="cordon",
        close="kubectl cordon {node}",
        reopen="kubectl uncordon {node}",
        wait_for="the pods on it",
    ),
)
