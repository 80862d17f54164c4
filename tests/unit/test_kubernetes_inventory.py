"""The Kubernetes backend's inventory as tables: model names from GPU Feature Discovery's labels, the
devices the nodes' device plugins advertise, the UUIDs pods reported (NodeUUIDs) and the API's node and
pod dicts read into GPU counts. (On a real cluster: tests/kubernetes.)"""

from __future__ import annotations

from dataclasses import replace

import pytest

from workbench_devices import parse_simulated_spec
from workbench_spawner.backends.kubernetes.cluster import (
    KubeNode,
    node_from_api,
    nodes_with_requests,
    pod_gpu_request,
)
from workbench_spawner.backends.kubernetes.inventory import (
    GFD_MEMORY,
    GFD_PRODUCT,
    NodeUUIDs,
    UUIDConflictError,
    cluster_inventory,
    model_of,
    placeholder_uuid,
)

H200 = {GFD_PRODUCT: "NVIDIA-H200", GFD_MEMORY: "144384"}
NODES = [
    KubeNode("n1", True, True, 2, 2, labels=H200),
    KubeNode("cpu1", True, True, 0, 0),  # no device plugin: not in the inventory
    KubeNode("n2", True, True, 1, 1, labels=H200),
]


# -- model names ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("labels", "model"),
    [
        (H200, "H200-141GB"),  # 144384 MiB is 141 GiB
        ({GFD_PRODUCT: "Tesla-T4", GFD_MEMORY: "15360"}, "T4-15GB"),
        ({GFD_PRODUCT: "NVIDIA-L40S"}, "L40S"),  # no memory label: the product alone
        ({GFD_PRODUCT: "NVIDIA-L40S", GFD_MEMORY: "lots"}, "L40S"),  # an unreadable memory label too
        ({GFD_PRODUCT: "  "}, ""),
        ({GFD_MEMORY: "81920"}, ""),  # memory without a product names nothing
        ({}, ""),
        # GFD's real labels for data-centre boards carry NVML's whole name; the model must be the one the
        # NVML inventory, quotas and the spawn form use (workbench_devices: "NVIDIA H100 80GB HBM3" -> H100-80GB).
        ({GFD_PRODUCT: "NVIDIA-H100-80GB-HBM3", GFD_MEMORY: "81559"}, "H100-80GB"),
        ({GFD_PRODUCT: "NVIDIA-A100-SXM4-40GB", GFD_MEMORY: "40960"}, "A100-40GB"),
    ],
)
def test_the_model_is_named_from_gpu_feature_discoverys_labels(labels, model):
    assert model_of(labels) == model


def test_the_model_labels_are_the_sites_own_names():
    labels = {"example.org/gpu": "NVIDIA-H200", "example.org/mib": "144384", GFD_PRODUCT: "Tesla-T4"}
    assert model_of(labels, "example.org/gpu", "example.org/mib") == "H200-141GB"


# -- the cluster's devices ------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["2xH100-80GB", "1xH200-141GB,1xA100-40GB", "4"])
def test_simulated_nodes_have_the_uuids_the_stand_in_device_plugin_advertises(spec):
    inventory = cluster_inventory(NODES, spec)
    expected = [
        replace(device, index=device.index, node=node.name)
        for node in NODES
        for device in parse_simulated_spec(spec, node.name)[: node.gpu_capacity]
    ]
    assert inventory.devices == expected
    assert [d.uuid for d in inventory.devices][:1] == [parse_simulated_spec(spec, "n1")[0].uuid]
    assert len({d.uuid for d in inventory.devices}) == 3  # GPU 0 of n1 and of n2 are two GPUs
    assert inventory.source == "simulated"
    assert inventory.message == "3 simulated GPU(s), readings made up on Kubernetes nodes n1 (2), n2 (1)"


def test_real_nodes_start_with_placeholders_named_by_their_labels():
    inventory = cluster_inventory(NODES, "")
    assert [(d.uuid, d.index, d.node) for d in inventory.devices] == [
        ("K8S-n1-gpu0", 0, "n1"),
        ("K8S-n1-gpu1", 1, "n1"),
        ("K8S-n2-gpu0", 0, "n2"),
    ]
    first = inventory.devices[0]
    assert (first.model, first.name, first.memory_total_bytes) == ("H200-141GB", "NVIDIA H200 on n1", 144384 << 20)
    assert not first.simulated
    assert inventory.source == "kubernetes"
    assert inventory.message == "3 GPU(s) on Kubernetes nodes n1 (2), n2 (1)"
    assert placeholder_uuid("n1", 1) == "K8S-n1-gpu1"


def test_an_unlabelled_node_and_a_cluster_without_gpus():
    bare = cluster_inventory([KubeNode("n9", True, True, 1, 1)], "")
    assert [(d.uuid, d.name, d.model, d.memory_total_bytes) for d in bare.devices] == [
        ("K8S-n9-gpu0", "GPU on n9", "", 0)
    ]
    none = cluster_inventory([KubeNode("cpu1", True, True, 0, 0)], "0")
    assert none.devices == []
    assert none.source == "kubernetes"
    assert none.message.endswith("nodes none")


# -- the UUIDs pods reported -----------------------------------------------------------------------------


def test_reported_uuids_are_learned_once_and_named_everywhere(store):
    book = NodeUUIDs(store)
    real = cluster_inventory(NODES, "")
    assert book.known() == {}
    assert book.resolve(real) == real
    book.accept("n1", ["GPU-b"], 2)
    book.accept("n1", ["GPU-b"], 2)  # the same report again changes nothing
    book.accept("n1", ["GPU-a", "GPU-b"], 2)  # a two-GPU pod names the other one
    assert book.known() == {"n1": ["GPU-b", "GPU-a"]}
    resolved = book.resolve(real)
    assert [d.uuid for d in resolved.devices] == ["GPU-b", "GPU-a", "K8S-n2-gpu0"]
    assert [(d.node, d.model) for d in resolved.devices][:2] == [("n1", "H200-141GB")] * 2
    assert NodeUUIDs(store).known() == book.known()  # in the database: a new hub process reads the same


@pytest.mark.parametrize(
    ("node", "uuids", "capacity", "words"),
    [
        ("n2", ["GPU-a"], 1, "a pod on n2 reported GPU GPU-a, which the hub knows on node n1"),
        ("n2", ["GPU-z", "GPU-b"], 2, "kubernetes-forget-node n1"),  # one of two known elsewhere: nothing learned
        ("n1", ["GPU-c"], 2, "pods on n1 reported 3 different GPUs, but the node has 2"),
        ("n1", ["GPU-c"], 2, "an admin runs `workbench kubernetes-forget-node n1`"),
    ],
)
def test_a_report_that_contradicts_what_is_known_is_refused_and_changes_nothing(store, node, uuids, capacity, words):
    book = NodeUUIDs(store)
    book.accept("n1", ["GPU-a", "GPU-b"], 2)
    with pytest.raises(UUIDConflictError, match=words):
        book.accept(node, uuids, capacity)
    assert book.known() == {"n1": ["GPU-a", "GPU-b"]}


def test_an_admin_forgets_a_node_whose_gpus_were_replaced(store):
    book = NodeUUIDs(store)
    book.accept("n1", ["GPU-a", "GPU-b"], 2)
    book.accept("n2", ["GPU-c"], 1)
    assert book.forget("n1")
    assert not book.forget("n1")
    assert not book.forget("n3")
    assert book.known() == {"n2": ["GPU-c"]}
    assert [d.uuid for d in book.resolve(cluster_inventory(NODES, "")).devices] == [
        "K8S-n1-gpu0",
        "K8S-n1-gpu1",
        "GPU-c",
    ]
    book.accept("n1", ["GPU-new"], 2)  # and learns the new GPUs from the next pod
    assert book.known()["n1"] == ["GPU-new"]


def test_only_the_kubernetes_inventory_is_resolved():
    known = {"n1": ["GPU-a", "GPU-b", "GPU-extra"], "gone": ["GPU-x"]}
    simulated = cluster_inventory(NODES, "2")
    assert NodeUUIDs.resolve_with(simulated, known) == simulated  # the hub computes simulated UUIDs itself
    real = NodeUUIDs.resolve_with(cluster_inventory(NODES, ""), known)
    assert [d.uuid for d in real.devices] == ["GPU-a", "GPU-b", "K8S-n2-gpu0"]


# -- the API's dicts: what a node has and what pods ask of it ----------------------------------------------


def container(limit=None, request=None, resource="nvidia.com/gpu") -> dict:
    resources = {}
    if limit is not None:
        resources["limits"] = {resource: limit, "cpu": "2"}
    if request is not None:
        resources["requests"] = {resource: request}
    return {"name": "c", "resources": resources}


@pytest.mark.parametrize(
    ("spec", "gpus"),
    [
        ({"containers": [container("2")]}, 2),
        ({"containers": [container(request="1")]}, 1),  # a request alone counts (the API copies limits to it)
        ({"containers": [container("1"), container("2")]}, 3),  # containers run together: their sum
        ({"containers": [container("1")], "initContainers": [container("4"), container("2")]}, 4),  # one at a time
        ({"containers": [container()]}, 0),
        ({"containers": [container("1", resource="nvidia.com/mig-1g.18gb")]}, 0),  # another resource
        ({"containers": [container("500m")]}, 0),  # not a whole device
        ({"containers": [container("1k")]}, 1000),  # the API's canonical form of 1000 (cluster.quantity)
        ({"containers": [container("1.2.3")]}, 0),  # not a quantity
        ({}, 0),
    ],
)
def test_the_gpus_a_pod_holds(spec, gpus):
    assert pod_gpu_request({"spec": spec}, "nvidia.com/gpu") == gpus


def api_node(name: str, gpus: str = "2", ready: str = "True", unschedulable: bool = False) -> dict:
    return {
        "metadata": {"name": name, "labels": dict(H200)},
        "spec": {"unschedulable": unschedulable} if unschedulable else {},
        "status": {
            "capacity": {"nvidia.com/gpu": gpus, "cpu": "8"},
            "allocatable": {"nvidia.com/gpu": gpus},
            "conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": ready}],
        },
    }


def api_pod(node: str | None, gpus: str, phase: str = "Running") -> dict:
    return {"spec": {"nodeName": node, "containers": [container(gpus)]} if node else {}, "status": {"phase": phase}}


def test_nodes_count_what_every_scheduled_pod_that_has_not_ended_requests():
    nodes = [api_node("n1"), api_node("n2", ready="False"), api_node("n3", unschedulable=True), api_node("cpu", "0")]
    pods = [
        api_pod("n1", "1"),
        api_pod("n1", "1", "Pending"),  # scheduled, pulling its image: holds its GPU
        api_pod("n1", "1", "Succeeded"),
        api_pod("n1", "1", "Failed"),
        api_pod(None, "2", "Pending"),  # not scheduled: holds nothing yet
        api_pod("n2", "1"),
    ]
    read = {n.name: n for n in nodes_with_requests(nodes, pods, "nvidia.com/gpu")}
    assert [(n.name, n.gpu_capacity, n.gpus_requested, n.gpus_free, n.usable) for n in read.values()] == [
        ("n1", 2, 2, 0, True),
        ("n2", 2, 1, 0, False),  # not ready: nothing free there
        ("n3", 2, 0, 0, False),  # cordoned
        ("cpu", 0, 0, 0, True),
    ]
    assert read["n1"].labels == H200
    no_conditions = {"metadata": {"name": "x"}, "status": {"allocatable": {"nvidia.com/gpu": "4"}}}
    assert node_from_api(no_conditions, "nvidia.com/gpu").gpus_free == 0  # a node that never said Ready
    fresh = node_from_api(api_node("n4", "4"), "nvidia.com/gpu", requested=1)
    assert (fresh.ready, fresh.schedulable, fresh.gpu_allocatable, fresh.gpus_free) == (True, True, 4, 3)
