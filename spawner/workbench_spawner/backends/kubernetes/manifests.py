"""What the workbench puts in and around every user pod, as plain Kubernetes objects.

* **Lock-down**, the docker backend's in Kubernetes words: the pod runs as a
  non-root user, drops every capability, cannot gain privileges, runs under
  the runtime's default seccomp profile and gets no service-account token.
  ``lockdown_problems`` checks the *final* pod (after every KubeSpawner
  setting, hook and profile), so a site setting cannot undo it unnoticed: a
  privileged container, added capabilities, host network/PID/IPC, or a
  hostPath volume not in ``allowed_host_paths`` make the spawn fail with the
  sentence, and the hub refuses to start with such config
  (``extension.check``).
* **GPUs**: ``nvidia.com/gpu: N`` as a limit (extended resources are
  requested by limit; MIG slices ``nvidia.com/mig-<profile>: 1`` (one slice a server), the device
  plugin's mixed strategy, ``pod_objects.gpu_limits``), and a model as a node selector on GPU Feature
  Discovery's product and memory labels.
* **NetworkPolicy** like Zero to JupyterHub's singleuser policy: ingress
  only from the hub and proxy, egress to DNS, the hub and the internet but
  not private ranges, so not to other users' pods.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# Label keys on every pod the workbench creates (values are label-safe slugs; the
# annotations of the same names carry the exact user and server names).
LABEL_HUB = "workbench.hub"
LABEL_USER = "workbench.user"
LABEL_SERVER = "workbench.server"
ANNOTATION_GPUS = "workbench.gpus"  # the leased UUIDs, written once the lease is (reconcile reads them)
POLICY_NAME = "workbench-singleuser"

# Addresses a user pod may not reach (RFC 1918, carrier-grade NAT, link-local incl. cloud metadata).
PRIVATE_RANGES = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16")

POD_SECURITY = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}


def model_selector(
    model: str | None, node_labels: Iterable[Mapping[str, str]], product_label: str, memory_label: str
) -> dict[str, str]:
    """The node selector that puts a pod on GPUs of ``model`` ({} for any model).

    Taken from the labels of nodes whose GPUs are that model, so it selects
    exactly what the spawn form offered; a model no node has selects a
    label value no node carries, and the scheduler says so."""
    from workbench_spawner.backends.kubernetes.inventory import model_of

    if not model:
        return {}
    for labels in node_labels:
        if model_of(labels, product_label, memory_label) == model.upper():
            selector = {product_label: labels[product_label]}
            if labels.get(memory_label):
                selector[memory_label] = labels[memory_label]
            return selector
    return {product_label: "NVIDIA-" + model.upper()}


def lockdown_problems(pod: Mapping[str, Any], allowed_host_paths: Sequence[str] = ()) -> list[str]:
    """Sentences naming what in ``pod`` (a dict as the API takes it) breaks the lock-down ([] when none)."""
    spec = pod.get("spec") or {}
    problems = []
    for key, name in (("hostNetwork", "the host's network"), ("hostPID", "the host's PIDs"), ("hostIPC", "host IPC")):
        if spec.get(key):
            problems.append(f"the pod would share {name} ({key}: true)")
    if spec.get("automountServiceAccountToken", True) is not False:
        problems.append("the pod would get a service-account token (automountServiceAccountToken is not false)")
    pod_security = spec.get("securityContext") or {}
    for volume in spec.get("volumes") or []:
        host_path = (volume.get("hostPath") or {}).get("path")
        if host_path is not None and host_path not in allowed_host_paths:
            problems.append(
                f"volume {volume.get('name')!r} mounts the node's {host_path} (hostPath); list it in "
                "c.KubernetesGPUSpawner.allowed_host_paths if every student may have it"
            )
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        name = container.get("name", "?")
        security = container.get("securityContext") or {}
        if security.get("privileged"):
            problems.append(f"container {name!r} would be privileged")
        if security.get("allowPrivilegeEscalation", True) is not False:
            problems.append(f"container {name!r} could gain privileges (allowPrivilegeEscalation is not false)")
        run_as = security.get("runAsUser", pod_security.get("runAsUser"))
        if run_as == 0 or not security.get("runAsNonRoot", pod_security.get("runAsNonRoot")):
            problems.append(f"container {name!r} could run as root (runAsNonRoot is not true, or runAsUser is 0)")
        caps = security.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            problems.append(f"container {name!r} keeps Linux capabilities (capabilities.drop lacks ALL)")
        if caps.get("add"):
            problems.append(f"container {name!r} would add capabilities {', '.join(caps['add'])}")
        seccomp = (security.get("seccompProfile") or pod_security.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"container {name!r} would run without a seccomp profile (RuntimeDefault)")
    return problems


def network_policy(namespace: str, hub: str, hub_cidrs: Sequence[str] = ()) -> dict[str, Any]:
    """The namespace's NetworkPolicy for this hub's user pods (see the module's docstring)."""
    if hub_cidrs:
        ingress_from: list[dict] = [{"ipBlock": {"cidr": cidr}} for cidr in hub_cidrs]
    else:
        ingress_from = [{"podSelector": {"matchLabels": {"hub.jupyter.org/network-access-singleuser": "true"}}}]
    egress: list[dict] = [
        # DNS, wherever the cluster's resolver is.
        {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]},
        # The internet, not private ranges (other pods, the node, cloud metadata).
        {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": list(PRIVATE_RANGES)}}]},
    ]
    if hub_cidrs:
        egress.insert(0, {"to": [{"ipBlock": {"cidr": cidr}} for cidr in hub_cidrs]})
    else:
        # The hub pod, by the labels KubeSpawner's and Zero to JupyterHub's hub pods carry.
        egress.insert(0, {"to": [{"podSelector": {"matchLabels": {"app": "jupyterhub", "component": "hub"}}}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": f"{POLICY_NAME}-{hub}",
            "namespace": namespace,
            "labels": {LABEL_HUB: hub, "app.kubernetes.io/managed-by": "gpu-workbench"},
        },
        "spec": {
            "podSelector": {"matchLabels": {LABEL_HUB: hub}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": ingress_from}],
            "egress": egress,
        },
    }
