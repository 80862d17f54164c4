"""``WORKBENCH_BACKEND=kubernetes``: the hub, in the cluster or beside it, spawning user pods with KubeSpawner.

Kept in the backend's folder so its settings are one table (docs/kubernetes.md
lists them). The cluster is found as kubectl finds it (in a pod: its service
account; elsewhere ``KUBECONFIG``). Pods must reach the hub's API: in the
cluster that is the hub's service (Zero to JupyterHub sets it); with the hub
outside, ``WORKBENCH_HUB_CONNECT_IP`` names an address of the hub host the
pods can route to (the test cluster: docker0's 172.17.0.1), and the hub's API
listens there (``WORKBENCH_HUB_IP``, default the same address).
"""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

from traitlets.config import Config

from workbench_hub.env_values import ConfigError, Env, comma_list, flag, number, text
from workbench_spawner.backend import HubContext
from workbench_spawner.image_config import configure_images


def _node_selector(env: Env) -> dict[str, str]:
    selector = {}
    for item in comma_list(env, "WORKBENCH_K8S_NODE_SELECTOR"):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                f"WORKBENCH_K8S_NODE_SELECTOR takes label=value pairs separated by commas; cannot read {item!r}"
            )
        selector[key.strip()] = value.strip()
    return selector


def _tolerations(env: Env) -> list[dict]:
    raw = text(env, "WORKBENCH_K8S_TOLERATIONS")
    if not raw:
        return []
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"WORKBENCH_K8S_TOLERATIONS must be a JSON list of tolerations ({exc})") from None
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise ConfigError('WORKBENCH_K8S_TOLERATIONS must be a JSON list such as [{"key": "nvidia.com/gpu", ...}]')
    return value


def _cidrs(env: Env, name: str, default: list[str]) -> list[str]:
    """CIDRs as Kubernetes takes them (a bare address becomes its /32 or /128)."""
    cidrs = []
    for cidr in comma_list(env, name) or default:
        try:
            cidrs.append(str(ipaddress.ip_network(cidr, strict=False)))
        except ValueError:
            raise ConfigError(f"{name} takes CIDRs such as 172.17.0.1/32; {cidr!r} is not one") from None
    return cidrs


def configure(c: Config, env: Env, hub: HubContext) -> None:
    """``WORKBENCH_BACKEND=kubernetes``: the image, namespace, storage, GPU labels, and where pods reach the hub."""
    c.JupyterHub.spawner_class = "gpu-kubernetes"
    spawner = c.KubernetesGPUSpawner
    configure_images(
        spawner,
        env,
        "kubernetes",
        "the single-user image the nodes can pull (e.g. registry.example.org/gpu-workbench/singleuser:1.0)",
    )
    namespace = text(env, "WORKBENCH_K8S_NAMESPACE")
    if namespace:
        spawner.namespace = namespace
    in_cluster = bool(env.get("KUBERNETES_SERVICE_HOST"))
    connect_ip = text(env, "WORKBENCH_HUB_CONNECT_IP")
    if not in_cluster:
        if not connect_ip:
            raise ConfigError(
                "the kubernetes backend with the hub outside the cluster needs WORKBENCH_HUB_CONNECT_IP, an address "
                "of this host that pods can reach (with a Docker-based node on this host: 172.17.0.1)"
            )
        c.JupyterHub.hub_connect_ip = connect_ip
        c.JupyterHub.hub_ip = text(env, "WORKBENCH_HUB_IP") or connect_ip
        spawner.hub_ingress_cidrs = _cidrs(env, "WORKBENCH_K8S_HUB_CIDRS", [f"{connect_ip}/32"])
    else:
        spawner.hub_ingress_cidrs = _cidrs(env, "WORKBENCH_K8S_HUB_CIDRS", [])
    spawner.workbench_network_policy = flag(env, "WORKBENCH_K8S_NETWORK_POLICY", "1")
    storage_class = text(env, "WORKBENCH_K8S_STORAGE_CLASS")
    if storage_class:
        spawner.storage_class = storage_class
    spawner.home_volume_size = text(env, "WORKBENCH_K8S_HOME_SIZE", "10Gi")
    spawner.datasets_claim = text(env, "WORKBENCH_DATASETS_CLAIM")
    selector = _node_selector(env)
    if selector:
        spawner.node_selector = selector
    tolerations = _tolerations(env)
    if tolerations:
        spawner.tolerations = tolerations
    if text(env, "WORKBENCH_MEM_LIMIT"):
        spawner.mem_limit = text(env, "WORKBENCH_MEM_LIMIT")
    if text(env, "WORKBENCH_CPU_LIMIT"):
        spawner.cpu_limit = number(env, "WORKBENCH_CPU_LIMIT", "1")
    # A deleted, evicted or failed pod gives its GPUs back within one poll (KubeSpawner's watch answers it).
    c.Spawner.poll_interval = number(env, "WORKBENCH_K8S_POLL_SECONDS", "10", int)
    share_cluster_with_service(c, env)


def share_cluster_with_service(c: Config, env: Env) -> None:
    """The workbench service reads the nodes too (the fleet view): it gets what finds the API, nothing more.

    JupyterHub starts services with a minimal environment; the kubeconfig's
    path (or in a pod, the API's address) is added to the service's."""
    found = {name: env[name] for name in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT") if env.get(name)}
    kubeconfig = env.get("KUBECONFIG") or str(Path(env.get("HOME") or Path.home()) / ".kube" / "config")
    if not found:
        found["KUBECONFIG"] = kubeconfig
    for service in c.JupyterHub.services if "services" in c.JupyterHub else []:
        if service.get("name") == "workbench":
            service["environment"] = {**service.get("environment", {}), **found}
