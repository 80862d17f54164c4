"""The test cluster itself: a Ready node whose simulated GPUs the scheduler and kubelet treat as real.

What the Kubernetes backend's tests take for granted, checked on its own so a broken cluster reads as
such and not as a spawner bug: the node advertises exactly the simulated GPUs, the stand-in device
plugin hands each pod distinct UUIDs through NVIDIA_VISIBLE_DEVICES, a pod that wants more GPUs than
are free waits with the scheduler's own "Insufficient nvidia.com/gpu", and a deleted pod's GPU is free
again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubernetes_asyncio.client import CoreV1Api

from tests.kubernetes.conftest import GPU_SPEC, busybox_pod, eventually
from workbench_devices import parse_simulated_spec

GPU = "nvidia.com/gpu"
# The pod prints its devices once, then idles: its log's first line is what the plugin allocated.
PRINT_DEVICES = "echo devices=$NVIDIA_VISIBLE_DEVICES; sleep 3600"
CHECKPOINT = Path("/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint")


async def phase(core: CoreV1Api, ns: str, name: str) -> str:
    return (await core.read_namespaced_pod(name, ns)).status.phase


async def devices_of(core: CoreV1Api, ns: str, name: str, timeout: float = 30) -> list[str]:
    """The device IDs pod ``name`` was started with, once it runs and has printed them."""

    async def printed() -> list[str] | None:
        pod = await core.read_namespaced_pod(name, ns)
        if pod.status.phase in ("Failed", "Succeeded"):
            raise AssertionError(f"pod {name} ended ({pod.status.phase}): {pod.status}")
        if pod.status.phase != "Running":
            return None
        for line in (await core.read_namespaced_pod_log(name, ns)).splitlines():
            if line.startswith("devices="):
                return line.removeprefix("devices=").split(",")
        return None

    return await eventually(printed, timeout, f"pod {name} running and printing its devices")


async def scheduling_failure(core: CoreV1Api, ns: str, name: str) -> str:
    """The scheduler's FailedScheduling message for pod ``name`` (waits for it)."""

    async def message() -> str | None:
        events = await core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}")
        failures = [e.message for e in events.items if e.reason == "FailedScheduling"]
        return failures[-1] if failures else None

    return await eventually(message, 30, f"a FailedScheduling event for pod {name}")


async def start_gpu_pods(core: CoreV1Api, ns: str, count: int) -> dict[str, list[str]]:
    """``count`` pods of one GPU each, all created before any is waited for; pod name -> devices."""
    names = [f"gpu{i}" for i in range(count)]
    for name in names:
        await core.create_namespaced_pod(ns, busybox_pod(name, PRINT_DEVICES, {GPU: 1}))
    return {name: await devices_of(core, ns, name) for name in names}


async def test_node_is_ready_and_advertises_exactly_the_simulated_gpus(k8s_cluster):
    async with k8s_cluster.client() as api:
        node = await CoreV1Api(api).read_node(k8s_cluster.node)
    conditions = {c.type: c.status for c in node.status.conditions}
    assert conditions.get("Ready") == "True", node.status.conditions
    count = len(k8s_cluster.gpu_uuids)
    assert count > 0
    assert node.status.capacity.get(GPU) == str(count)
    assert node.status.allocatable.get(GPU) == str(count)
    # The kubelet's own record of what the plugin registered: the device IDs are the very UUIDs the
    # hub's simulated inventory shows for this node.
    registered = json.loads(CHECKPOINT.read_text())["Data"]["RegisteredDevices"]
    assert sorted(registered[GPU]) == sorted(k8s_cluster.gpu_uuids)
    # The labels GPU Feature Discovery would set (its product names have '-' for ' ').
    first = parse_simulated_spec(GPU_SPEC, k8s_cluster.node)[0]
    labels = node.metadata.labels
    assert labels["nvidia.com/gpu.count"] == str(count)
    assert labels["nvidia.com/gpu.memory"] == str(first.memory_total_bytes // 2**20)
    assert labels["nvidia.com/gpu.product"] == first.name.replace(" (simulated)", "").replace(" ", "-")


async def test_a_gpu_pod_gets_one_simulated_gpu(k8s_cluster, k8s_namespace):
    async with k8s_cluster.client() as api:
        devices = await start_gpu_pods(CoreV1Api(api), k8s_namespace, 1)
    [ids] = devices.values()
    assert len(ids) == 1, ids
    assert ids[0] in k8s_cluster.gpu_uuids


async def test_two_gpu_pods_get_distinct_gpus(k8s_cluster, k8s_namespace):
    if len(k8s_cluster.gpu_uuids) < 2:
        pytest.skip(f"WB_K8S_GPUS={GPU_SPEC} gives fewer than 2 GPUs")
    async with k8s_cluster.client() as api:
        devices = await start_gpu_pods(CoreV1Api(api), k8s_namespace, 2)
    a, b = devices.values()
    assert len(a) == len(b) == 1, devices
    assert a != b, devices
    assert set(a + b) <= set(k8s_cluster.gpu_uuids)


async def test_a_pod_wanting_more_gpus_than_free_waits_as_insufficient(k8s_cluster, k8s_namespace):
    total = len(k8s_cluster.gpu_uuids)
    async with k8s_cluster.client() as api:
        core = CoreV1Api(api)
        # One GPU taken, then a pod asking for all of them: it would fit the node, not what is free.
        await start_gpu_pods(core, k8s_namespace, 1)
        await core.create_namespaced_pod(k8s_namespace, busybox_pod("greedy", PRINT_DEVICES, {GPU: total}))
        message = await scheduling_failure(core, k8s_namespace, "greedy")
        assert f"Insufficient {GPU}" in message, message
        pod = await core.read_namespaced_pod("greedy", k8s_namespace)
        assert pod.status.phase == "Pending"
        assert not pod.spec.node_name, "a pod that does not fit was bound to the node"


async def test_deleting_a_gpu_pod_frees_its_gpu_for_a_waiting_pod(k8s_cluster, k8s_namespace):
    total = len(k8s_cluster.gpu_uuids)
    async with k8s_cluster.client() as api:
        core = CoreV1Api(api)
        held = await start_gpu_pods(core, k8s_namespace, total)
        assert sorted(i for ids in held.values() for i in ids) == sorted(k8s_cluster.gpu_uuids)
        await core.create_namespaced_pod(k8s_namespace, busybox_pod("waiting", PRINT_DEVICES, {GPU: 1}))
        assert f"Insufficient {GPU}" in await scheduling_failure(core, k8s_namespace, "waiting")
        assert await phase(core, k8s_namespace, "waiting") == "Pending"

        # An ordinary deletion (grace period and all): the kubelet stops the container, then the pod
        # object goes, and only then does the scheduler count its GPU as free.
        await core.delete_namespaced_pod("gpu0", k8s_namespace)
        assert await devices_of(core, k8s_namespace, "waiting", timeout=45) == held["gpu0"]


async def test_mig_slices_are_advertised_per_profile_and_handed_out_by_their_mig_uuid(k8s_cluster, k8s_namespace):
    """The mixed strategy: each profile is a resource of its own, its device IDs the spec's MIG UUIDs."""
    if not k8s_cluster.slice_uuids:
        pytest.skip(f"WB_K8S_GPUS={GPU_SPEC} lays out no MIG slices")
    registered = json.loads(CHECKPOINT.read_text())["Data"]["RegisteredDevices"]
    async with k8s_cluster.client() as api:
        core = CoreV1Api(api)
        node = await core.read_node(k8s_cluster.node)
        for profile, uuids in k8s_cluster.slice_uuids.items():
            resource = f"nvidia.com/mig-{profile}"
            assert node.status.allocatable.get(resource) == str(len(uuids)), node.status.allocatable
            assert sorted(registered[resource]) == sorted(uuids)
        assert not set(registered[GPU]) & {u for ids in k8s_cluster.slice_uuids.values() for u in ids}
        profile, uuids = next(iter(k8s_cluster.slice_uuids.items()))
        await core.create_namespaced_pod(
            k8s_namespace, busybox_pod("slice", PRINT_DEVICES, {f"nvidia.com/mig-{profile}": 1})
        )
        [given] = await devices_of(core, k8s_namespace, "slice")
    assert given in uuids, given
    assert given.startswith("MIG-"), given
