"""MIG slices on the Kubernetes backend as tables: the mixed strategy's resources read from nodes and pods,
the inventory's slices (simulated and real), the UUIDs pods report for them, the pod's GPU limit, and the
placement that leases a slice by its share. (Through the real hub on the test cluster:
tests/kubernetes/test_kubernetes_slices.py.)"""

from __future__ import annotations

import asyncio
import re

import pytest

from workbench_devices import parse_simulated_spec
from workbench_spawner.backends.kubernetes.cluster import (
    KubeNode,
    SliceCount,
    mig_resource,
    node_from_api,
    nodes_with_requests,
    pod_slice_requests,
)
from workbench_spawner.backends.kubernetes.fleet import annotate_kubernetes
from workbench_spawner.backends.kubernetes.inventory import (
    GFD_MEMORY,
    GFD_PRODUCT,
    NodeUUIDs,
    UUIDConflictError,
    cluster_inventory,
    slice_placeholder,
)
from workbench_spawner.backends.kubernetes.placement import KubernetesPlacement, PodJob, PodReport
from workbench_spawner.backends.kubernetes.pod_objects import gpu_limits
from workbench_spawner.placement.engine_reservations import EngineReservations
from workbench_spawner.placement.host import NoGPUAvailableError
from workbench_spawner.rules.admission import AdmissionContext, Admitted, Refusal, admit
from workbench_spawner.rules.quota import EffectiveQuota, Quota

H200 = {GFD_PRODUCT: "NVIDIA-H200", GFD_MEMORY: "144384"}
SPEC = "2xH200-141GB,1xH200-141GB:mig=2x1g.18gb+1x3g.71gb"
SLICED = KubeNode(
    "n1",
    True,
    True,
    2,
    2,
    labels=H200,
    slices={"1g.18gb": SliceCount(2, 2), "3g.71gb": SliceCount(1, 1)},
)


# -- the pod's GPU limit -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpus", "profile", "resource", "limits"),
    [
        (1, None, "nvidia.com/gpu", {"nvidia.com/gpu": "1"}),
        (2, None, "nvidia.com/gpu.shared", {"nvidia.com/gpu.shared": "2"}),  # a site's renamed resource
        (1, "1g.18gb", "nvidia.com/gpu", {"nvidia.com/mig-1g.18gb": "1"}),  # slices: never nvidia.com/gpu
        (2, "3g.71gb", "nvidia.com/gpu.shared", {"nvidia.com/mig-3g.71gb": "2"}),
        (0, None, "nvidia.com/gpu", {}),
        (0, "1g.18gb", "nvidia.com/gpu", {}),
    ],
)
def test_the_pod_asks_for_whole_gpus_or_the_mixed_strategys_mig_resource(gpus, profile, resource, limits):
    assert gpu_limits(gpus, profile, resource) == limits


# -- nodes and pods as the API says them -------------------------------------------------------------------


def api_node(name: str, capacity: dict[str, str], allocatable: dict[str, str] | None = None) -> dict:
    return {
        "metadata": {"name": name, "labels": H200},
        "status": {
            "capacity": capacity,
            "allocatable": allocatable or capacity,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def api_pod(node: str, limits: dict[str, str], phase: str = "Running", init: dict[str, str] | None = None) -> dict:
    spec = {"nodeName": node, "containers": [{"resources": {"limits": limits}}]}
    if init:
        spec["initContainers"] = [{"resources": {"requests": init}}]
    return {"spec": spec, "status": {"phase": phase}}


@pytest.mark.parametrize(
    ("pod", "slices"),
    [
        (api_pod("n1", {"nvidia.com/mig-1g.18gb": "1"}), {"1g.18gb": 1}),
        (api_pod("n1", {"nvidia.com/mig-1g.18gb": "2", "nvidia.com/mig-3g.71gb": "1"}), {"1g.18gb": 2, "3g.71gb": 1}),
        (api_pod("n1", {"nvidia.com/gpu": "1", "cpu": "1"}), {}),  # whole GPUs are not slices
        (api_pod("n1", {"nvidia.com/mig-1g.18gb": "0"}), {}),
        (api_pod("n1", {}, init={"nvidia.com/mig-1g.18gb": "1"}), {"1g.18gb": 1}),  # an init container's
    ],
)
def test_a_pods_slices_are_read_by_profile(pod, slices):
    assert pod_slice_requests(pod) == slices


def test_nodes_advertise_slices_per_profile_and_count_what_every_pod_requests():
    nodes = [
        api_node(
            "n1",
            {"nvidia.com/gpu": "2", "nvidia.com/mig-1g.18gb": "7", "nvidia.com/mig-3g.71gb": "0", "cpu": "8"},
            {"nvidia.com/gpu": "2", "nvidia.com/mig-1g.18gb": "6", "cpu": "8"},  # one slice unhealthy
        ),
        api_node("n2", {"nvidia.com/gpu": "1"}),
    ]
    pods = [
        api_pod("n1", {"nvidia.com/mig-1g.18gb": "1"}),
        api_pod("n1", {"nvidia.com/mig-1g.18gb": "2", "nvidia.com/gpu": "1"}),
        api_pod("n1", {"nvidia.com/mig-1g.18gb": "3"}, phase="Failed"),  # ended: holds nothing
        api_pod("n2", {"nvidia.com/gpu": "1"}),
    ]
    n1, n2 = nodes_with_requests(nodes, pods, "nvidia.com/gpu")
    # A profile advertised with capacity 0 (the plugin lost it) is not a slice of the node.
    assert n1.slices == {"1g.18gb": SliceCount(7, 6, 3)}
    assert n1.slices["1g.18gb"].free == 3
    assert (n1.gpu_capacity, n1.gpus_requested) == (2, 1)
    assert n2.slices == {}
    assert n2.gpus_requested == 1
    assert node_from_api(nodes[0], "nvidia.com/gpu").slices == {"1g.18gb": SliceCount(7, 6, 0)}
    assert mig_resource("1g.18gb") == "nvidia.com/mig-1g.18gb"


# -- the inventory ------------------------------------------------------------------------------------------


def test_a_simulated_nodes_slices_are_the_specs_with_their_mig_uuids():
    inventory = cluster_inventory([SLICED], SPEC)
    spec = parse_simulated_spec(SPEC, "n1")
    whole = [d for d in inventory.devices if not d.mig]
    slices = [d for d in inventory.devices if d.mig]
    assert [d.uuid for d in whole] == [d.uuid for d in spec if not d.mig]
    assert [(d.uuid, d.profile, d.model, d.node, d.parent_uuid) for d in slices] == [
        (d.uuid, d.profile, "H200-141GB", "n1", d.parent_uuid) for d in spec if d.mig
    ]
    assert all(d.uuid.startswith("MIG-sim-n1-") for d in slices)
    assert [round(d.share, 3) for d in slices] == [0.143, 0.143, 0.429]  # GPU-hours by share
    assert inventory.message == (
        "2 simulated GPU(s), readings made up and 3 MIG slice(s) on Kubernetes nodes n1 (2, 2x1g.18gb, 1x3g.71gb)"
    )


def test_a_real_nodes_slices_start_as_placeholders_by_profile():
    inventory = cluster_inventory([SLICED], "")
    slices = [d for d in inventory.devices if d.mig]
    assert [(d.uuid, d.index, d.profile, d.model, d.memory_total_bytes) for d in slices] == [
        ("K8S-n1-mig-1g.18gb-0", 0, "1g.18gb", "H200-141GB", 18 * 10**9),
        ("K8S-n1-mig-1g.18gb-1", 1, "1g.18gb", "H200-141GB", 18 * 10**9),
        ("K8S-n1-mig-3g.71gb-0", 0, "3g.71gb", "H200-141GB", 71 * 10**9),
    ]
    assert slices[0].name == "NVIDIA H200 MIG 1g.18gb on n1"
    assert slices[0].kind == "H200-141GB 1g.18gb"
    # A node with slices and no whole GPU is in the inventory too.
    only = cluster_inventory([KubeNode("n2", True, True, 0, 0, labels=H200, slices={"1g.18gb": SliceCount(1, 1)})], "")
    assert [d.uuid for d in only.devices] == ["K8S-n2-mig-1g.18gb-0"]
    assert only.message == "0 GPU(s) and 1 MIG slice(s) on Kubernetes nodes n2 (0, 1x1g.18gb)"


def test_reported_mig_uuids_are_learned_per_profile_checked_and_forgotten_with_the_node(store):
    book = NodeUUIDs(store)
    real = cluster_inventory([SLICED], "")
    book.accept("n1", ["MIG-aaa"], 2, "1g.18gb")
    book.accept("n1", ["GPU-whole"], 2)
    resolved = {d.uuid: d for d in book.resolve(real).devices}
    assert resolved["MIG-aaa"].profile == "1g.18gb"
    assert resolved["MIG-aaa"].mig
    assert "K8S-n1-mig-1g.18gb-1" in resolved
    assert slice_placeholder("n1", "3g.71gb", 0) in resolved
    assert resolved["GPU-whole"].mig is False  # a whole GPU's name never lands on a slice, nor the reverse
    with pytest.raises(UUIDConflictError, match=re.escape("3 different 1g.18gb MIG slices, but the node has 2")):
        book.accept("n1", ["MIG-bbb", "MIG-ccc"], 2, "1g.18gb")
    with pytest.raises(UUIDConflictError, match=re.escape("MIG-aaa, which the hub knows on node n1/mig-1g.18gb")):
        book.accept("n1", ["MIG-aaa"], 1, "3g.71gb")
    assert book.forget("n1") is True
    assert book.known() == {}
    assert book.forget("n1") is False


# -- admission and placement ------------------------------------------------------------------------------


def context(pins: bool) -> AdmissionContext:
    return AdmissionContext(
        quota=EffectiveQuota(Quota(max_gpus=2), "default"),
        inventory_size=2,
        inventory_models=["H200-141GB"],
        slices={"1g.18gb": {"H200-141GB": 2}, "3g.71gb": {"H200-141GB": 1}},
        pins_slices=pins,
    )


def test_admission_on_kubernetes_takes_an_advertised_profile_and_refuses_another_in_a_sentence():
    pins = KubernetesPlacement.pins_slices
    verdict = admit({"gpus": 1, "gpu_profile": "1g.18gb"}, context(pins))
    assert isinstance(verdict, Admitted)
    assert verdict.request.gpu_profile == "1g.18gb"
    refused = admit({"gpus": 1, "gpu_profile": "2g.35gb"}, context(pins))
    assert isinstance(refused, Refusal)
    assert refused.status == 400
    assert refused.message == (
        "Cannot start the server: this hub has no MIG slices of '2g.35gb'; it has: 1g.18gb (2 on H200-141GB), "
        "3g.71gb (1 on H200-141GB)."
    )


def slice_placement(store, inventory, learned: list) -> KubernetesPlacement:
    book = NodeUUIDs(store)

    def current():
        return book.resolve(inventory)

    def learn(node, uuids, profile):
        learned.append((node, tuple(uuids), profile))
        book.accept(node, uuids, 2, profile)

    return KubernetesPlacement(
        store,
        current,
        EngineReservations(store, current),
        lambda inventory: [],
        poll_interval=0.01,
        report_timeout=2.0,
        learn=learn,
    )


def job(report: PodReport, profile: str = "1g.18gb", look=lambda: None) -> PodJob:
    pod = {"metadata": {}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}}

    def watch() -> dict:
        look()
        return pod

    return PodJob("wb/wb-1-alice", started=lambda: report, pod=watch, profile=profile, kind=profile)


async def place(placement: KubernetesPlacement, pod_job: PodJob):
    return await placement.place("alice", "", 1, None, 5.0, job=pod_job)


def test_a_simulated_slice_is_leased_by_its_mig_uuid_and_charged_by_its_share(store):
    inventory = cluster_inventory([SLICED], SPEC)
    first = next(d for d in inventory.devices if d.profile == "1g.18gb")
    placement = slice_placement(store, inventory, [])
    asking: list[dict] = []  # what reservations count as asking for whole GPUs while the pod is followed
    pod_job = job(PodReport("n1", (first.uuid,)), look=lambda: asking.append(dict(placement.reservations.asking)))
    lease = asyncio.run(place(placement, pod_job))
    assert lease.gpu_uuids == (first.uuid,)
    assert lease.node == "n1"
    assert lease.shares == pytest.approx((1 / 7,))
    assert asking, "a slice request counted as asking for whole GPUs"
    assert all(seen == {} for seen in asking), "a slice request counted as asking for whole GPUs"


@pytest.mark.parametrize(
    ("reported", "words"),
    [
        ("GPU-sim-n1-00-h200-141gb", "is not a 1g.18gb MIG slice of n1"),  # a whole GPU for a slice request
        ("MIG-sim-n1-02-h200-141gb-2-3g.71gb", "is not a 1g.18gb MIG slice of n1"),  # another profile's
        ("MIG-sim-n9-02-h200-141gb-0-1g.18gb", "is not a 1g.18gb MIG slice of n1"),  # not the node's
    ],
)
def test_a_report_that_names_anything_but_a_slice_of_the_profile_is_refused(store, reported, words):
    inventory = cluster_inventory([SLICED], SPEC)
    with pytest.raises(NoGPUAvailableError, match=words):
        asyncio.run(place(slice_placement(store, inventory, []), job(PodReport("n1", (reported,)))))
    assert store.leases() == []


def test_a_real_nodes_slice_is_learned_under_its_profile_and_must_be_a_mig_uuid(store):
    inventory = cluster_inventory([SLICED], "")
    learned: list = []
    real_uuid = "MIG-5c1e3a2b-0000-4000-8000-000000000001"
    lease = asyncio.run(place(slice_placement(store, inventory, learned), job(PodReport("n1", (real_uuid,)))))
    assert learned == [("n1", (real_uuid,), "1g.18gb")]
    assert lease.gpu_uuids == (real_uuid,)
    assert lease.shares == pytest.approx((1 / 7,))
    store.release("alice", "")
    with pytest.raises(NoGPUAvailableError, match="is not a MIG UUID"):
        asyncio.run(place(slice_placement(store, inventory, []), job(PodReport("n1", ("GPU-0000",)))))


# -- the fleet view ----------------------------------------------------------------------------------------


def test_the_fleet_counts_pods_outside_the_workbench_per_profile(monkeypatch):
    node = KubeNode(
        "n1", True, True, 2, 2, gpus_requested=2, slices={"1g.18gb": SliceCount(2, 2, 1), "3g.71gb": SliceCount(1, 1)}
    )
    monkeypatch.setattr("workbench_spawner.backends.kubernetes.fleet.kube_nodes", lambda: {"n1": node})
    rows = [
        {"node": "n1", "index": 0, "mig": False, "profile": None, "holders": []},
        {"node": "n1", "index": 1, "mig": False, "profile": None, "holders": []},
        {"node": "n1", "index": 2, "mig": True, "profile": "1g.18gb", "holders": []},
        {"node": "n1", "index": 2, "mig": True, "profile": "1g.18gb", "holders": []},
        {"node": "n1", "index": 2, "mig": True, "profile": "3g.71gb", "holders": []},
    ]
    annotate_kubernetes(rows)
    seen = [(r["kubernetes"]["node_gpus_requested"], r["kubernetes"]["held_outside_workbench"]) for r in rows]
    # Two whole GPUs held outside; one of two 1g.18gb slices; the 3g.71gb slice is free.
    assert seen == [(2, True), (2, True), (1, True), (1, False), (0, False)]


# -- reconcile after a hub restart -------------------------------------------------------------------------


def test_a_running_slice_pod_without_a_lease_is_adopted_not_left_as_cpu_only(store):
    from workbench_spawner.backends.kubernetes.manifests import ANNOTATION_GPUS, LABEL_SERVER, LABEL_USER
    from workbench_spawner.backends.kubernetes.reconcile import reconcile_pods
    from workbench_spawner.placement.engine_reconcile import Action

    mig = "MIG-sim-n1-02-h200-141gb-0-1g.18gb"
    orphan = {
        "metadata": {
            "name": "wb-1a2b3c4d-carol",
            "namespace": "wb",
            "creationTimestamp": "2026-12-08T09:00:00Z",
            "annotations": {LABEL_USER: "carol", LABEL_SERVER: "", ANNOTATION_GPUS: mig},
        },
        "spec": {"nodeName": "n1", "containers": [{"resources": {"limits": {"nvidia.com/mig-1g.18gb": "1"}}}]},
        "status": {"phase": "Running", "startTime": "2026-12-08T09:00:30Z"},
    }

    def adopt(*args) -> bool:  # as KubernetesGPUSpawner.gpu_reconcile_orphans wires it: shares from the inventory
        return store.adopt(*args, shares={mig: 1 / 7})

    actions = reconcile_pods([orphan], store.leases(), adopt, lambda name: None, created_before=2e9)
    assert actions == [Action("wb-1a2b3c4d-carol", "adopted")]
    (lease,) = store.leases()
    assert lease.gpu_uuids == (mig,)
    assert lease.shares == pytest.approx((1 / 7,))


def test_the_nodes_route_lists_learned_mig_uuids_with_their_node(monkeypatch):
    from workbench_spawner.backends.kubernetes.fleet import node_rows

    monkeypatch.setattr("workbench_spawner.backends.kubernetes.fleet.kube_nodes", lambda: {"n1": SLICED})
    known = {"n1": ["GPU-a"], "n1/mig-1g.18gb": ["MIG-b"], "n1/mig-3g.71gb": ["MIG-c"]}
    (row,) = node_rows(known)
    assert row["node"] == "n1"
    assert row["reported_uuids"] == ["GPU-a", "MIG-b", "MIG-c"]
