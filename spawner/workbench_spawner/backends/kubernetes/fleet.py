"""The fleet view's Kubernetes side, the admin's node rows, and the config check at hub start.

The ledger knows the GPUs the workbench's pods hold; the API knows every
node's device-plugin count and what *every* pod requests. The difference on
a node is GPUs held by pods outside the workbench (a training job, another
hub), which the admin page shows per GPU row (``kubernetes``) and
``GET api/kubernetes/nodes`` per node with the UUIDs pods reported there
(``node_rows``; the routes and CLI are ``extension.nodes``). Node reads are
cached for a couple of seconds so a busy page does not hammer the API server.
"""

from __future__ import annotations

from collections import Counter

from traitlets.config import Config

from workbench_spawner.backends.kubernetes.cluster import KubeNode, KubernetesUnavailableError, list_nodes
from workbench_spawner.placement.engine_fleet import Recent

RESOURCE = "nvidia.com/gpu"

# The cluster's nodes by name (None: the API did not answer, asked again at the next call).
kube_nodes = Recent(
    lambda: {n.name: n for n in list_nodes(RESOURCE)},
    max_age=2.0,
    unavailable=KubernetesUnavailableError,
    warning="The cluster's nodes could not be read for the fleet view: %s",
    retry_after=0,
)


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

    ours = Counter(pool(gpu) for gpu in gpus if gpu["holders"])
    marked: Counter[tuple[str, str]] = Counter()
    for gpu in sorted(gpus, key=lambda g: (*pool(g), g.get("index", 0))):
        node = (nodes or {}).get(gpu["node"])
        key = pool(gpu)
        asked = requested(node, key[1]) if node else 0
        outside = max(0, asked - ours[key]) if node else 0
        held = None
        if node is not None:
            held = not gpu["holders"] and marked[key] < outside
            marked[key] += held
        gpu["kubernetes"] = {
            "node_ready": bool(node and node.ready),
            "node_schedulable": bool(node and node.schedulable),
            "node_gpus_requested": asked,
            "node_gpus_outside_workbench": outside,
            "held_outside_workbench": held,
        }


def node_rows(known: dict[str, list[str]]) -> list[dict] | None:
    """``GET api/kubernetes/nodes``: every node with GPUs, and the UUIDs its pods reported (None: the API
    did not answer)."""
    nodes = kube_nodes()
    if nodes is None:
        return None
    # MIG UUIDs are learned per node and profile ("<node>/mig-<profile>"): listed with their node.
    by_node: dict[str, list[str]] = {}
    for key, uuids in known.items():
        by_node.setdefault(key.partition("/")[0], []).extend(uuids)
    return [
        {
            "node": name,
            "ready": node.ready,
            "schedulable": node.schedulable,
            "gpu_capacity": node.gpu_capacity,
            "gpu_allocatable": node.gpu_allocatable,
            "gpus_requested": node.gpus_requested,
            "reported_uuids": by_node.get(name, []),
        }
        for name, node in sorted(nodes.items())
        if node.gpu_capacity or node.slices or name in by_node
    ]


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
