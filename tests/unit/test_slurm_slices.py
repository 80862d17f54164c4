"""MIG slices on Slurm, as tables: a GRES type per profile, Slurm's index to the slice's MIG UUID.

The node layout is the test cluster's wbnode2 (tests/slurm/cluster.sh): two whole H100s (GRES indices
0-1), then an H200's slices as GRES of their profiles' types, two 1g.18gb (2-3) and one 3g.71gb (4).
The real cluster runs the same layout through the hub in tests/slurm/test_slurm_slices.py.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from workbench_devices import DeviceInventory, parse_simulated_spec
from workbench_spawner.backends.slurm.inventory import NodeGPUMap, cluster_inventory
from workbench_spawner.backends.slurm.node_report import NodeReport
from workbench_spawner.backends.slurm.placement import SlurmPlacement
from workbench_spawner.backends.slurm.records import SlurmJob, SlurmNode, parse_sinfo_json, parse_squeue_json
from workbench_spawner.backends.slurm.sbatch import gres_for, sbatch_options, whole_gpu_type
from workbench_spawner.backends.slurm.singleuser import node_report, slice_environment
from workbench_spawner.ledger.store import AllocationStore
from workbench_spawner.placement.engine import EngineJob

SPEC = "2xH100-80GB,1xH200-141GB:mig=2x1g.18gb+1x3g.71gb"
GRES = "gpu:h100-80gb:2,gpu:1g.18gb:2,gpu:3g.71gb:1"
NODE = SlurmNode(
    "wbnode2", "10.77.0.2", "IDLE", "h100-80gb", 5, gres=(("h100-80gb", 2), ("1g.18gb", 2), ("3g.71gb", 1))
)


def mig(place: int, profile: str = "1g.18gb") -> str:
    return f"MIG-sim-wbnode2-02-h200-141gb-{place}-{profile}"


# -- what Slurm says ----------------------------------------------------------------------------------


def test_sinfo_gives_each_gres_line_and_so_the_type_of_every_index():
    # As Slurm 22.05 printed it for the test cluster's wbnode2 with one slice job running.
    (node,) = parse_sinfo_json(
        json.dumps({"nodes": [{"name": "wbnode2", "gres": GRES, "gres_used": "gpu:1g.18gb:1(IDX:3)"}]})
    )
    assert node.gres == NODE.gres
    assert node.gpu_count == 5
    assert node.gpus_used == (3,)
    assert node.gres_types() == ["h100-80gb", "h100-80gb", "1g.18gb", "1g.18gb", "3g.71gb"]
    # A node read without its GRES lines has its one type on every index, as before.
    assert SlurmNode("n1", "a", "IDLE", "h100", 2).gres_types() == ["h100", "h100"]


def test_squeue_gives_a_slice_jobs_index_and_count():
    (job,) = parse_squeue_json(
        json.dumps(
            {
                "jobs": [
                    {
                        "job_id": 677,
                        "job_state": "RUNNING",
                        "batch_host": "wbnode2",
                        "gres_detail": ["gpu:1g.18gb:1(IDX:3)"],
                        "tres_per_node": "gres:gpu:1g.18gb:1",
                    }
                ]
            }
        )
    )
    assert (job.node, job.gpu_indices, job.gpus_requested) == ("wbnode2", (3,), 1)


# -- the inventory -------------------------------------------------------------------------------------


def test_a_simulated_node_names_each_index_by_the_device_in_that_place():
    inventory = cluster_inventory([NODE], SPEC)
    got = [(d.index, d.uuid, d.profile, round(d.share, 3)) for d in inventory.devices]
    assert got == [
        (0, "GPU-sim-wbnode2-00-h100-80gb", "", 1.0),
        (1, "GPU-sim-wbnode2-01-h100-80gb", "", 1.0),
        (2, mig(0), "1g.18gb", 0.143),
        (3, mig(1), "1g.18gb", 0.143),
        (4, mig(2, "3g.71gb"), "3g.71gb", 0.429),
    ]
    assert all(d.node == "wbnode2" for d in inventory.devices)
    assert inventory.devices[2].parent_uuid == "GPU-sim-wbnode2-02-h200-141gb"


def test_a_node_with_fewer_gres_takes_the_first_devices_of_the_spec():
    node = SlurmNode("wbnode1", "10.77.0.1", "IDLE", "h100-80gb", 2, gres=(("h100-80gb", 2),))
    assert [d.uuid for d in cluster_inventory([node], SPEC).devices] == [
        "GPU-sim-wbnode1-00-h100-80gb",
        "GPU-sim-wbnode1-01-h100-80gb",
    ]


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("2xH100-80GB,1xH200-141GB:mig=1x3g.71gb+2x1g.18gb", "lists a 3g.71gb slice as GPU 2 of wbnode2"),
        ("3xH100-80GB", "lists a whole H100-80GB as GPU 2 of wbnode2, where Slurm has GRES type 1g.18gb"),
        ("1xH200-141GB:mig=2x1g.18gb", "lists a 1g.18gb slice as GPU 0 of wbnode2, where Slurm has GRES type"),
    ],
)
def test_a_spec_out_of_slurms_order_gives_no_inventory_and_says_why(spec, words):
    inventory = cluster_inventory([NODE], spec)
    assert inventory.source == "none"
    assert not inventory.devices
    assert words in inventory.message
    assert "gres.conf's order" in inventory.message


def test_a_real_nodes_slices_wait_for_a_report_then_take_the_mig_uuid_and_its_gpu(tmp_path):
    inventory = cluster_inventory([NODE], "")
    before = [(d.uuid, d.mig, d.profile, d.model) for d in inventory.devices]
    assert before[1] == ("SLURM-wbnode2-gpu1", False, "", "H100-80GB")
    assert before[3] == ("SLURM-wbnode2-gpu3", True, "1g.18gb", "")
    store = AllocationStore(f"sqlite:///{tmp_path / 'wb.sqlite'}")
    try:
        gpu = {"name": "NVIDIA H200 MIG 1g.18gb", "memory_total_bytes": 18 * 10**9, "mig": True}
        gpu.update(profile="1g.18gb", parent_uuid="GPU-real-h200", model="H200-141GB")
        NodeGPUMap(store).accept(NodeReport("wbnode2", ({**gpu, "index": 3, "uuid": "MIG-real-1"},), ("MIG-real-1",)))
        after = NodeGPUMap(store).resolve(inventory).devices[3]
    finally:
        store.dispose()
    assert (after.uuid, after.index, after.profile, after.parent_uuid, after.model) == (
        "MIG-real-1",
        3,
        "1g.18gb",
        "GPU-real-h200",
        "H200-141GB",
    )
    assert after.kind == "H200-141GB 1g.18gb"
    assert after.share == pytest.approx(1 / 7)


def test_a_report_of_a_whole_gpu_at_a_slices_index_does_not_make_it_a_slice_of_another_gpu():
    inventory = DeviceInventory("slurm", [cluster_inventory([NODE], "").devices[2]])
    entry = {"index": 2, "uuid": "GPU-x", "name": "H100", "memory_total_bytes": 1}
    (device,) = NodeGPUMap.resolve_with(inventory, {"wbnode2": [entry]}).devices
    assert (device.uuid, device.profile, device.parent_uuid) == ("GPU-x", "1g.18gb", "")


# -- what the hub asks of sbatch --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpus", "model", "profile", "whole", "gres"),
    [
        (1, None, "1g.18gb", "h100-80gb", "gpu:1g.18gb:1"),
        (2, "H200-141GB", "1g.18gb", "h100-80gb", "gpu:1g.18gb:2"),  # the profile is the GRES type
        (1, None, None, "h100-80gb", "gpu:h100-80gb:1"),  # never a bare gpu:1 where slices exist
        (1, "A100-40GB", None, "h100-80gb", "gpu:a100-40gb:1"),
        (2, None, None, None, "gpu:2"),
        (0, None, "1g.18gb", None, None),
    ],
)
def test_the_gres_asked_for(gpus, model, profile, whole, gres):
    assert gres_for(gpus, model, profile, whole) == gres


def test_sbatch_asks_for_the_slices_gres():
    opts = sbatch_options(user="ann", server="", gpus=1, profile="1g.18gb", whole_type="h100-80gb")
    assert "--gres=gpu:1g.18gb:1" in opts


@pytest.mark.parametrize(
    ("spec", "whole"),
    [
        (SPEC, "h100-80gb"),
        ("2xH100-80GB", None),  # no slices: a bare gpu:N, as before
        ("1xA100-40GB,2xH100-80GB,1xH200-141GB:mig=7x1g.18gb", "h100-80gb"),  # the most whole GPUs
        ("1xH200-141GB:mig=7x1g.18gb", None),  # slices only: no whole GPU to name
    ],
)
def test_the_type_of_a_whole_gpu_request(spec, whole):
    assert whole_gpu_type(DeviceInventory("simulated", parse_simulated_spec(spec, "n"))) == whole


# -- what the job reports --------------------------------------------------------------------------------


@pytest.mark.parametrize(("index", "uuid"), [("2", mig(0)), ("3", mig(1)), ("4", mig(2, "3g.71gb"))])
def test_a_slice_job_reports_the_mig_uuid_of_its_slurm_index(index, uuid):
    env = {"SLURMD_NODENAME": "wbnode2", "SLURM_JOB_GPUS": index, "WORKBENCH_SIMULATED_GPUS": SPEC}
    report = node_report(env)
    assert report["job_gpus"] == [uuid]
    assert [(g["index"], g["uuid"], g["mig"]) for g in report["gpus"]] == [(int(index), uuid, True)]
    assert slice_environment(report) == {"CUDA_VISIBLE_DEVICES": uuid}


def test_a_whole_gpu_job_keeps_slurms_cuda_visible_devices():
    env = {"SLURMD_NODENAME": "wbnode2", "SLURM_JOB_GPUS": "1", "WORKBENCH_SIMULATED_GPUS": SPEC}
    report = node_report(env)
    assert report["job_gpus"] == ["GPU-sim-wbnode2-01-h100-80gb"]
    assert slice_environment(report) == {}


# -- placement ------------------------------------------------------------------------------------------


def test_a_slice_job_waits_among_its_profiles_slices_and_its_lease_is_charged_its_share(tmp_path):
    # wbnode1's two whole GPUs too: the cluster has 4 whole GPUs, and only 2 of them fit no slice request.
    node1 = SlurmNode("wbnode1", "10.77.0.1", "IDLE", "h100-80gb", 2, gres=(("h100-80gb", 2),))
    inventory = cluster_inventory([node1, NODE], SPEC)
    states = [[SlurmJob("9", "PENDING", "Resources", gpus_requested=1, partition="gpu")]]
    states.append([SlurmJob("9", "RUNNING", "None", "wbnode2", gpu_indices=(3,), gpus_requested=1)])
    now = [0.0]

    def jobs() -> list[SlurmJob]:
        now[0] += 1
        return states.pop(0) if len(states) > 1 else states[0]

    store = AllocationStore(f"sqlite:///{tmp_path / 'wb.sqlite'}")
    try:
        placement = SlurmPlacement(
            store, lambda: inventory, poll_interval=0.001, clock=lambda: now[0], jobs=jobs, nodes=lambda: [node1, NODE]
        )
        assert placement.pins_slices
        gpus = tuple({"index": d.index, "uuid": d.uuid, "mig": d.mig} for d in inventory.devices if d.node == "wbnode2")
        events: list[str] = []
        job = EngineJob(
            "9", started=lambda: NodeReport("wbnode2", gpus, (mig(1),)), describe=events.append, kind="1g.18gb"
        )
        lease = asyncio.run(placement.place("ann", "", 1, None, 30.0, job=job))
    finally:
        store.dispose()
    assert lease.gpu_uuids == (mig(1),)
    assert lease.node == "wbnode2"
    assert lease.shares == pytest.approx((1 / 7,))
    assert (
        "Waiting for 1 1g.18gb slice: all 2 1g.18gb slices that fit are in use (Slurm: Resources), next in line"
        in events
    )
    # A whole-GPU request counts whole GPUs only, as before.
    assert placement.total_gpus() == 4
    assert placement.total_gpus("3g.71gb") == 1


def test_the_hub_checks_a_simulated_nodes_report_against_its_own_list_in_slurms_order():
    from types import SimpleNamespace

    from workbench_spawner.backends.slurm.spawner import SlurmGPUSpawner

    forged = NodeReport("wbnode2", ({"index": 3, "uuid": "MIG-forged", "mig": True},), (mig(1),))
    trusted = SlurmGPUSpawner._trusted(SimpleNamespace(simulated_gpus=SPEC), forged)
    assert trusted.uuids_for([2, 3, 4]) == [mig(0), mig(1), mig(2, "3g.71gb")]
    assert trusted.uuids_for([0]) == ["GPU-sim-wbnode2-00-h100-80gb"]


def test_reservations_count_free_whole_gpus_only_never_a_free_slice():
    from dataclasses import replace

    from workbench_spawner.backends.slurm.fairness import free_on_slurm

    node = replace(NODE, gpus_used=(0, 2))  # an H100 and a 1g.18gb slice are Slurm's
    assert free_on_slurm(cluster_inventory([NODE], SPEC), [node], None) == ["GPU-sim-wbnode2-01-h100-80gb"]


def test_a_slice_job_adopted_after_a_hub_restart_is_charged_its_share(tmp_path):
    from workbench_spawner.placement.engine_reconcile import adopter

    store = AllocationStore(f"sqlite:///{tmp_path / 'wb.sqlite'}")
    try:
        adopt = adopter(store, cluster_inventory([NODE], SPEC))
        assert adopt("ann", "", [mig(1)], "slurm:9", None, "wbnode2")
        assert adopt("bob", "", ["GPU-sim-wbnode2-00-h100-80gb"], "slurm:10", None, "wbnode2")
        shares = {lease.user: lease.shares for lease in store.leases()}
    finally:
        store.dispose()
    assert shares == {"ann": pytest.approx((1 / 7,)), "bob": (1.0,)}
