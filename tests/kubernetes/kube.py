"""The kubernetes tests' view of the test cluster: this hub's pods, their containers, the hub's settings.

Read through the backend's own API helpers (``cluster.blocking``) with the
test cluster's kubeconfig, and through Docker for a pod's container (the
1.20 kubelet runs pods as Docker containers, named and labelled by dockershim).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import uuid

from kubespawner.slugs import safe_slug

from workbench_spawner.backends.kubernetes import cluster

NODE_IP = "172.17.0.1"  # docker0: the node's address, where pods reach a hub on this host
STORAGE_CLASS = "workbench-test-local"  # tests/kubernetes/provisioner.py


def hub_env(k8s, namespace: str, image: str) -> dict[str, str]:
    """A gpu-kubernetes hub on this host for the test cluster ``k8s`` (the ``k8s_cluster`` fixture)."""
    return {
        "WORKBENCH_BACKEND": "kubernetes",
        "KUBECONFIG": str(k8s.kubeconfig),
        "WORKBENCH_HUB_CONNECT_IP": NODE_IP,
        "WORKBENCH_IMAGE": image,
        "WORKBENCH_K8S_NAMESPACE": namespace,
        "WORKBENCH_K8S_STORAGE_CLASS": STORAGE_CLASS,
        "WORKBENCH_K8S_HOME_SIZE": "1Gi",
        "WORKBENCH_SIMULATED_GPUS": k8s.gpu_spec,
        "WORKBENCH_K8S_POLL_SECONDS": "2",
    }


def create_namespace(prefix: str = "wbt") -> str:
    """A fresh namespace ``<prefix>-<random>``, ready for pods.

    Ready means its ``default`` service account and that account's token exist: until then the API
    server refuses pods in it (the ServiceAccount admission plugin)."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"

    async def create(api) -> None:
        await api.create_namespace({"metadata": {"name": name, "labels": {"workbench-test": "1"}}})
        deadline = time.monotonic() + 30
        while True:
            accounts = await api.list_namespaced_service_account(name, field_selector="metadata.name=default")
            if accounts.items and accounts.items[0].secrets:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"namespace {name}: no default service account with a token within 30 s")
            await asyncio.sleep(0.2)

    cluster.blocking(create, timeout=60)
    return name


def delete_namespace(name: str) -> None:
    """Its pods at once (grace 0: the next test finds every GPU free), then the namespace in the background."""

    async def delete(api) -> None:
        await api.delete_collection_namespaced_pod(name, grace_period_seconds=0)
        await api.delete_namespace(name)
        deadline = time.monotonic() + 30
        while (await api.list_namespaced_pod(name)).items:
            if time.monotonic() > deadline:
                raise AssertionError(f"namespace {name}: pods still there 30 s after their deletion")
            await asyncio.sleep(0.2)

    cluster.blocking(delete, timeout=60)


def pods(namespace: str, selector: str = "") -> list[dict]:
    return cluster.list_pods(namespace, selector)


def pods_of(namespace: str, user: str) -> list[dict]:
    """The workbench's pods of ``user`` in ``namespace`` (by the label the backend gives them)."""
    return pods(namespace, f"workbench.user={safe_slug(user, max_length=48)}")


def delete_pods_of(namespace: str, *users: str) -> None:
    for user in users:
        for pod in pods_of(namespace, user):
            cluster.delete_pod(namespace, pod["metadata"]["name"], 0)
    deadline = time.monotonic() + 60
    while any(pods_of(namespace, u) for u in users) and time.monotonic() < deadline:
        time.sleep(0.5)


def pod_container(pod: dict, container: str = "notebook") -> str:
    """The Docker container dockershim runs for the pod's ``container``."""
    out = subprocess.run(
        [
            "docker",
            "ps",
            "-q",
            "--filter",
            f"label=io.kubernetes.pod.uid={pod['metadata']['uid']}",
            "--filter",
            f"label=io.kubernetes.container.name={container}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if not out:
        raise AssertionError(f"no running container {container} of pod {pod['metadata']['name']}")
    return out[0]


def pod_container_env(pod: dict) -> dict[str, str]:
    """The environment the runtime gave the pod's notebook container (device plugin's variables included)."""
    inspect = subprocess.run(
        ["docker", "inspect", "--format", "{{json .Config.Env}}", pod_container(pod)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(item.split("=", 1) for item in json.loads(inspect) if "=" in item)


def events_of(namespace: str, pod_name: str) -> list[dict]:
    async def read(api):
        reply = await api.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={pod_name}", _preload_content=False
        )
        return json.loads(await reply.read()).get("items") or []

    return cluster.blocking(read)


def use_kubeconfig(path) -> None:
    """This test process talks to the test cluster (the backend's helpers read KUBECONFIG)."""
    os.environ["KUBECONFIG"] = str(path)
