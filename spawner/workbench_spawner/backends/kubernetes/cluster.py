"""What the workbench reads from the Kubernetes API itself: nodes, pods and their GPU requests.

KubeSpawner follows the server's own pod (its reflectors); the policy needs
more: every node's GPUs (capacity, allocatable and GPU Feature Discovery's
labels, for the inventory and the fleet view), what *every* pod on a node
requests (pods that are not the workbench's hold GPUs too), and this hub's
pods by label after a restart. These reads happen at hub start, in
reconcile, in the workbench service and in the reservation check, all of
them blocking code in worker threads, so each runs its own short event loop
with its own API client (``blocking``). The API is found as kubectl finds
it: in a pod, the service account; elsewhere ``KUBECONFIG`` or
``~/.kube/config``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, TypeVar

T = TypeVar("T")

# Pod phases that hold no resources any more.
ENDED_PHASES = ("Succeeded", "Failed")
# NVIDIA's device plugin in the "mixed" MIG strategy advertises each profile as its own resource.
MIG_PREFIX = "nvidia.com/mig-"


def mig_resource(profile: str) -> str:
    """The resource a pod asks for slices of ``profile`` by (``nvidia.com/mig-1g.18gb``)."""
    return f"{MIG_PREFIX}{profile}"


class KubernetesUnavailableError(RuntimeError):
    """The API server could not be reached or refused the request; str(err) says why."""


class NodeState(Enum):
    """A pod's node as the API says now; UNKNOWN when it was not asked (or did not answer)."""

    READY = "ready"
    NOT_READY = "not ready"
    GONE = "gone"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class SliceCount:
    """One MIG profile on one node: what the device plugin advertises and what pods request of it."""

    capacity: int
    allocatable: int
    requested: int = 0

    @property
    def free(self) -> int:
        return max(0, self.allocatable - self.requested)


@dataclass(frozen=True)
class KubeNode:
    """One node as the policy sees it: its GPUs and what pods request of them now."""

    name: str
    ready: bool
    schedulable: bool
    gpu_capacity: int
    gpu_allocatable: int
    gpus_requested: int = 0  # by every pod on the node that has not ended
    labels: Mapping[str, str] = field(default_factory=dict)
    # MIG slices by profile ({"1g.18gb": SliceCount(7, 7, 2)}), from the mixed strategy's resources.
    slices: Mapping[str, SliceCount] = field(default_factory=dict)

    @property
    def gpus_free(self) -> int:
        return max(0, self.gpu_allocatable - self.gpus_requested) if self.usable else 0

    @property
    def usable(self) -> bool:
        return self.ready and self.schedulable


async def api_client():
    """An ``ApiClient`` for this process's cluster (in-cluster config, else the kubeconfig)."""
    from kubernetes_asyncio import client, config

    configuration = client.Configuration()
    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)
        else:
            # KUBECONFIG as it is now: the client reads it once, at its import.
            await config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration)
    except Exception as exc:  # noqa: BLE001 - boundary: the loaders raise ConfigException, OSError, TypeError, YAML's errors...; each is the one sentence
        raise KubernetesUnavailableError(
            f"no Kubernetes API configured ({exc}); set KUBECONFIG or run the hub in the cluster"
        ) from None
    return client.ApiClient(configuration)


def blocking(call: Callable[[Any], Awaitable[T]], timeout: float = 30.0) -> T:
    """Run ``call(core_v1_api)`` to completion from blocking code, on its own loop and client.

    A fresh thread, so it works whether or not the calling thread runs an
    event loop (the hub's config file, a worker thread, the CLI)."""

    async def run() -> T:
        from aiohttp import ClientError
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        async with await api_client() as api:
            try:
                return await asyncio.wait_for(call(client.CoreV1Api(api)), timeout)
            except ApiException as exc:
                raise KubernetesUnavailableError(f"the API server said {exc.status} {exc.reason}") from None
            # ClientError: also an API server that went away mid-answer (ServerDisconnectedError is no OSError).
            except (TimeoutError, OSError, ClientError) as exc:
                raise KubernetesUnavailableError(f"the API server did not answer ({exc or 'timeout'})") from None

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run()).result()


# Kubernetes' quantity suffixes (decimal and binary) up to tera: GPU counts, slices and memory limits.
_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_QUANTITY = re.compile(r"^([0-9]+\.?[0-9]*|\.[0-9]+)(|k|M|G|T|Ki|Mi|Gi|Ti)$")


def quantity(value: object) -> int | None:
    """A Kubernetes quantity as a whole number ("2", "16Gi" in bytes, "512M"); None if it is not one.

    kubernetes_asyncio has no parser (the synchronous client's ``parse_quantity`` is not a dependency)."""
    match = _QUANTITY.match(str(value or "").strip())
    return int(float(match.group(1)) * _UNITS[match.group(2)]) if match else None


def pod_gpu_request(pod: Mapping[str, Any], resource: str) -> int:
    """GPUs ``pod`` (an API dict) holds: the larger of its containers' sum and any init container's."""
    spec = pod.get("spec") or {}

    def asked(container: Mapping[str, Any]) -> int:
        resources = container.get("resources") or {}
        limits = resources.get("limits") or {}
        requests = resources.get("requests") or {}
        return quantity(limits.get(resource, requests.get(resource))) or 0

    main = sum(asked(c) for c in spec.get("containers") or [])
    init = max((asked(c) for c in spec.get("initContainers") or []), default=0)
    return max(main, init)


def pod_slice_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """MIG slices ``pod`` holds, by profile (every ``nvidia.com/mig-*`` resource its containers name)."""
    spec = pod.get("spec") or {}
    names = {
        name
        for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
        for part in ("limits", "requests")
        for name in ((container.get("resources") or {}).get(part) or {})
        if name.startswith(MIG_PREFIX)
    }
    counts = {name.removeprefix(MIG_PREFIX): pod_gpu_request(pod, name) for name in sorted(names)}
    return {profile: n for profile, n in counts.items() if n}


def node_slices(status: Mapping[str, Any], requested: Mapping[str, int]) -> dict[str, SliceCount]:
    """The node's MIG profiles from its status (capacity, so a drained slice still shows)."""
    capacity = status.get("capacity") or {}
    allocatable = status.get("allocatable") or {}
    slices = {}
    for name in sorted(capacity):
        count = quantity(capacity[name]) if name.startswith(MIG_PREFIX) else None
        if count:
            profile = name.removeprefix(MIG_PREFIX)
            slices[profile] = SliceCount(count, quantity(allocatable.get(name)) or 0, requested.get(profile, 0))
    return slices


def node_from_api(
    node: Mapping[str, Any], resource: str, requested: int = 0, slices_requested: Mapping[str, int] | None = None
) -> KubeNode:
    """A ``KubeNode`` from the API's node object (a dict)."""
    metadata = node.get("metadata") or {}
    status = node.get("status") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    return KubeNode(
        name=str(metadata.get("name", "")),
        ready=conditions.get("Ready") == "True",
        schedulable=not (node.get("spec") or {}).get("unschedulable", False),
        gpu_capacity=quantity((status.get("capacity") or {}).get(resource)) or 0,
        gpu_allocatable=quantity((status.get("allocatable") or {}).get(resource)) or 0,
        gpus_requested=requested,
        labels=dict(metadata.get("labels") or {}),
        slices=node_slices(status, slices_requested or {}),
    )


def nodes_with_requests(nodes: list[dict], pods: list[dict], resource: str) -> list[KubeNode]:
    """Every node with what the scheduled, not ended pods on it request of ``resource``."""
    requested: Counter[str] = Counter()
    slices: defaultdict[str, Counter[str]] = defaultdict(Counter)
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node and (pod.get("status") or {}).get("phase") not in ENDED_PHASES:
            requested[node] += pod_gpu_request(pod, resource)
            slices[node].update(pod_slice_requests(pod))
    names = [(n.get("metadata") or {}).get("name", "") for n in nodes]
    return [node_from_api(n, resource, requested[m], slices.get(m)) for n, m in zip(nodes, names, strict=True)]


async def _plain(api, method: str, *args: Any, **kwargs: Any) -> dict:
    """A read call's answer as a plain dict (the API's own field names, not the client's models)."""
    reply = await getattr(api, method)(*args, _preload_content=False, **kwargs)
    return json.loads(await reply.read())


async def _items(api, method: str, **kwargs: Any) -> list[dict]:
    """A list call's items as plain dicts."""
    return (await _plain(api, method, **kwargs)).get("items") or []


def list_nodes(resource: str) -> list[KubeNode]:
    """The cluster's nodes with their ``resource`` GPUs and what pods request of them (blocking)."""

    async def read(api) -> list[KubeNode]:
        nodes = await _items(api, "list_node")
        pods = await _items(api, "list_pod_for_all_namespaces", field_selector="status.phase!=Succeeded")
        return nodes_with_requests(nodes, pods, resource)

    return blocking(read)


def list_pods(namespace: str, label_selector: str) -> list[dict]:
    """Pods in ``namespace`` with these labels, as dicts (blocking)."""
    return blocking(lambda api: _items(api, "list_namespaced_pod", namespace=namespace, label_selector=label_selector))


def node_condition(name: str) -> tuple[NodeState, str]:
    """Node ``name``'s state and its Ready condition in words ("Ready=Unknown: Kubelet stopped posting node
    status.", "" when Ready or unknown), for a student's "the node failed" (blocking)."""

    async def read(api) -> tuple[NodeState, str]:
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            node = await _plain(api, "read_node", name)
        except ApiException as exc:
            if exc.status == 404:
                return NodeState.GONE, "the node is gone from the cluster"
            raise
        if node_from_api(node, "").ready:
            return NodeState.READY, ""
        return NodeState.NOT_READY, ready_condition_text(node)

    if not name:
        return NodeState.UNKNOWN, ""
    try:
        return blocking(read, timeout=10)
    except KubernetesUnavailableError:
        return NodeState.UNKNOWN, ""


def ready_condition_text(node: Mapping[str, Any]) -> str:
    """A not-Ready node's Ready condition as "Ready=Unknown: Kubelet stopped posting node status."."""
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            said = (condition.get("message") or condition.get("reason") or "").strip()
            return f"Ready={condition.get('status', 'Unknown')}" + (f": {said}" if said else "")
    return "no Ready condition"


def delete_pod(namespace: str, name: str, grace_seconds: int = 0, uid: str | None = None) -> None:
    """Delete a pod; one already gone is fine (blocking). ``uid``: only that pod, not a new one of the same
    name (one that is no longer there is fine too)."""

    async def delete(api) -> None:
        from kubernetes_asyncio.client import V1DeleteOptions, V1Preconditions
        from kubernetes_asyncio.client.exceptions import ApiException

        body = V1DeleteOptions(preconditions=V1Preconditions(uid=uid)) if uid else None
        try:
            await api.delete_namespaced_pod(
                name=name, namespace=namespace, grace_period_seconds=grace_seconds, body=body
            )
        except ApiException as exc:
            # 404: gone; 409 with a uid: the name belongs to a newer pod now ("Precondition failed: UID ...").
            if exc.status != 404 and not (uid and exc.status == 409):
                raise

    blocking(delete)
