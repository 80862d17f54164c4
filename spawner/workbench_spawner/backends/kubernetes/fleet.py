"""The fleet view's Kubernetes side, the admin's node routes and CLI, and the config check at hub start.

The ledger knows the GPUs the workbench's pods hold; the API knows every
node's device-plugin count and what *every* pod requests. The difference on
a node is GPUs held by pods outside the workbench (a training job, another
hub), which the admin page shows per GPU row (``kubernetes``) and
``GET api/kubernetes/nodes`` per node with the UUIDs pods reported there.
``DELETE api/kubernetes/nodes/{node}`` (``workbench kubernetes-forget-node``)
forgets those UUIDs after a node's GPUs were replaced. Node reads are cached
for a couple of seconds so a busy page does not hammer the API server.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from traitlets.config import Config

from workbench_spawner.backends.kubernetes.cluster import KubeNode, KubernetesUnavailableError, list_nodes
from workbench_spawner.placement.engine_fleet import add_node_parsers, forget_node_handler, run_node_cli

log = logging.getLogger("workbench.service")

MAX_NODE = 253  # a node name is a DNS subdomain
RESOURCE = "nvidia.com/gpu"

_cache: dict[str, KubeNode] | None = None
_cached_at = 0.0
_lock = threading.Lock()


def kube_nodes(max_age: float = 2.0, resource: str = RESOURCE) -> dict[str, KubeNode] | None:
    """The cluster's nodes by name (None: the API did not answer)."""
    global _cache, _cached_at
    with _lock:
        if _cache is not None and time.monotonic() - _cached_at < max_age:
            return _cache
        try:
            _cache = {n.name: n for n in list_nodes(resource)}
        except KubernetesUnavailableError as exc:
            log.warning("The cluster's nodes could not be read for the fleet view: %s", exc)
            _cache = None
        _cached_at = time.monotonic()
        return _cache


def annotate_kubernetes(gpus: list[dict]) -> None:
    """Add ``kubernetes`` (node ready and schedulable, GPUs held there outside the workbench) to each GPU row.

    The API says how many GPUs a node's pods request, not which ones: ``held_outside_workbench`` marks
    that many of the node's GPUs without a lease, in index order, so per node the count (and the
    metrics' free count) is right while which GPU it names is a guess. A MIG slice's row counts what
    pods request of its profile (``nvidia.com/mig-<profile>``) on that node, apart from whole GPUs.
    None when the API did not answer."""
    nodes = kube_nodes()

    def pool(gpu: dict) -> tuple[str, str]:
        return gpu["node"], (gpu.get("profile") or "") if gpu.get("mig") else ""

    def requested(node: KubeNode, profile: str) -> int:
        if not profile:
            return node.gpus_requested
        count = node.slices.get(profile)
        return count.requested if count else 0

    ours: dict[tuple[str, str], int] = {}
    for gpu in gpus:
        if gpu["holders"]:
            ours[pool(gpu)] = ours.get(pool(gpu), 0) + 1
    marked: dict[tuple[str, str], int] = {}
    for gpu in sorted(gpus, key=lambda g: (*pool(g), g.get("index", 0))):
        node = (nodes or {}).get(gpu["node"])
        key = pool(gpu)
        asked = requested(node, key[1]) if node else 0
        outside = max(0, asked - ours.get(key, 0)) if node else 0
        held = None
        if node is not None:
            held = not gpu["holders"] and marked.get(key, 0) < outside
            marked[key] = marked.get(key, 0) + int(held)
        gpu["kubernetes"] = {
            "node_ready": bool(node and node.ready),
            "node_schedulable": bool(node and node.schedulable),
            "node_gpus_requested": asked,
            "node_gpus_outside_workbench": outside,
            "held_outside_workbench": held,
        }


def node_rows(nodes: dict[str, KubeNode] | None, known: dict[str, list[str]]) -> list[dict]:
    """``GET api/kubernetes/nodes``: every node with GPUs, and the UUIDs its pods reported."""
    rows = []
    # MIG UUIDs are learned per node and profile ("<node>/mig-<profile>"): listed with their node.
    by_node: dict[str, list[str]] = {}
    for key, uuids in known.items():
        by_node.setdefault(key.partition("/")[0], []).extend(uuids)
    known = by_node
    for name, node in sorted((nodes or {}).items()):
        if not node.gpu_capacity and not node.slices and name not in known:
            continue
        rows.append(
            {
                "node": name,
                "ready": node.ready,
                "schedulable": node.schedulable,
                "gpu_capacity": node.gpu_capacity,
                "gpu_allocatable": node.gpu_allocatable,
                "gpus_requested": node.gpus_requested,
                "reported_uuids": known.get(name, []),
            }
        )
    return rows


def kubernetes_routes(prefix: str) -> list[tuple]:
    from workbench_hub.service.handlers import APIHandler
    from workbench_spawner.backends.kubernetes.inventory import NodeUUIDs

    class NodesHandler(APIHandler):
        async def get(self):
            await self.require_read()
            nodes, known = await asyncio.to_thread(lambda: (kube_nodes(), NodeUUIDs(self.fleet.store).known()))
            if nodes is None:
                self.fail(503, "the Kubernetes API did not answer; the hub's log says why")
            self.send({"nodes": node_rows(nodes, known)})

    node = forget_node_handler(
        NodeUUIDs,
        "Kubernetes",
        MAX_NODE,
        "the hub knows no GPU UUIDs of a node named {node}; `workbench kubernetes-nodes` lists the nodes",
    )
    return [(prefix + "api/kubernetes/nodes", NodesHandler), (prefix + r"api/kubernetes/nodes/([^/]+)", node)]


def add_parsers(top) -> None:
    add_node_parsers(
        top,
        "kubernetes",
        "Kubernetes: each node's GPUs and the UUIDs its pods reported",
        "Kubernetes: forget a node's GPU UUIDs after replacing them",
        "the node name, as kubectl get nodes prints it",
    )


def run_cli(args, call) -> tuple[object, str]:
    return run_node_cli(
        args,
        call,
        "kubernetes",
        "The hub forgot the GPU UUIDs of {node}; the next pod there names them again.",
        lambda data: [
            f"{n['node']}: {n['gpus_requested']}/{n['gpu_allocatable']} GPU(s) requested"
            f"{'' if n['ready'] and n['schedulable'] else ' (not schedulable)'}; reported: "
            f"{', '.join(n['reported_uuids']) or 'none yet'}"
            for n in data["nodes"]
        ],
        "no node advertises GPUs",
    )


def check_config(config: Config) -> list[str]:
    """Settings of the final config that would weaken every user pod's lock-down, one sentence each."""
    # Both sections reach the spawner: KubeSpawner's (where Zero to JupyterHub writes) and ours on top.
    ours, theirs = config.get("KubernetesGPUSpawner", {}), config.get("KubeSpawner", {})
    spawner = {**theirs, **ours}

    def where(key: str) -> str:
        return f"c.{'KubernetesGPUSpawner' if key in ours else 'KubeSpawner'}.{key}"

    problems = []
    allowed = list(spawner.get("allowed_host_paths", []) or [])
    if spawner.get("privileged"):
        problems.append(f"{where('privileged')} = True would make every user pod privileged")
    if spawner.get("allow_privilege_escalation") is True:
        problems.append(f"{where('allow_privilege_escalation')} = True lets users gain privileges")
    if spawner.get("automount_service_account_token") is True:
        problems.append(f"{where('automount_service_account_token')} = True gives every user pod an API token")
    if spawner.get("uid") == 0:
        problems.append(f"{where('uid')} = 0 runs user pods as root")
    volumes = spawner.get("volumes", [])
    for volume in volumes.values() if isinstance(volumes, dict) else volumes or []:
        source = (volume.get("hostPath") or volume.get("host_path") or {}) if isinstance(volume, dict) else {}
        path = source.get("path")
        if path is not None and path not in allowed:
            problems.append(
                f"{where('volumes')} mounts the node's {path} (hostPath) into every user pod; list it "
                "in c.KubernetesGPUSpawner.allowed_host_paths if that is meant"
            )
    extra = spawner.get("extra_pod_config", {}) or {}
    for key in ("hostNetwork", "hostPID", "hostIPC", "host_network", "host_pid", "host_ipc"):
        if isinstance(extra, dict) and extra.get(key):
            problems.append(f"{where('extra_pod_config')} sets {key}, sharing the node's namespaces")
    return problems
