"""A real node's Slurm GRES index -> its GPU or MIG slice, from gres.conf and the driver's MIG minors."""

from __future__ import annotations

import pytest

from workbench_devices import DeviceInventory, GPUDevice
from workbench_spawner.backends.slurm.gres_map import GresDevice, devices_by_index, expand, gres_devices, mig_minors
from workbench_spawner.backends.slurm.singleuser import slurm_devices

CAPS = "/dev/nvidia-caps/nvidia-cap"
GRES_CONF = f"""\
# two whole H100s, then an H200 cut in two 1g.18gb slices and a 3g.71gb
AutoDetect=off
NodeName=gpu[01-02] Name=gpu Type=h100-80gb File=/dev/nvidia[0-1]
NodeName=gpu01 Name=gpu Type=1g.18gb MultipleFiles=/dev/nvidia2,{CAPS}256,{CAPS}257   # GI 13
NodeName=gpu01 Name=gpu Type=1g.18gb MultipleFiles=/dev/nvidia2,{CAPS}391,{CAPS}392   # GI 14
NodeName=gpu01 Name=gpu Type=3g.71gb MultipleFiles=/dev/nvidia2,{CAPS}22,{CAPS}23     # GI 2
NodeName=gpu01 Name=shard Count=8
NodeName=other Name=gpu File=/dev/nvidia[0-7]
"""
# The driver's list (excerpt): a GPU instance's access file, then its compute instances'.
MIG_MINORS = """\
config 1
monitor 2
gpu2/gi2/access 22
gpu2/gi2/ci0/access 23
gpu2/gi13/access 256
gpu2/gi13/ci0/access 257
gpu2/gi14/access 391
gpu2/gi14/ci0/access 392
"""


def whole(uuid: str, index: int) -> GPUDevice:
    return GPUDevice(uuid, index, "NVIDIA H100 80GB HBM3", 80 * 10**9, "H100-80GB")


def piece(uuid: str, profile: str, instance: int) -> GPUDevice:
    return GPUDevice(
        uuid, 0, f"NVIDIA H200 MIG {profile}", 18 * 10**9, "H200-141GB", True, profile=profile,
        parent_uuid="GPU-h200", gpu_instance_id=instance,
    )  # fmt: skip


# NVML's own order (by GPU instance id), not gres.conf's: the map must not depend on it.
NVML = [
    whole("GPU-a", 0),
    whole("GPU-b", 1),
    piece("MIG-3g", "3g.71gb", 2),
    piece("MIG-1g-first", "1g.18gb", 13),
    piece("MIG-1g-second", "1g.18gb", 14),
]
MINOR = {"GPU-a": 0, "GPU-b": 1, "GPU-h200": 2}


@pytest.mark.parametrize(
    ("pattern", "names"),
    [
        ("/dev/nvidia[0-2]", ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2"]),
        ("gpu[01-02,07]", ["gpu01", "gpu02", "gpu07"]),
        ("/dev/nvidia3", ["/dev/nvidia3"]),
        ("n[1-2]x[0-1]", ["n1x0", "n1x1", "n2x0", "n2x1"]),
    ],
)
def test_slurm_ranges_expand(pattern, names):
    assert expand(pattern) == names


def test_gres_conf_gives_the_nodes_gpus_in_slurms_order():
    devices = gres_devices(GRES_CONF, "gpu01")
    assert [(d.type, d.files[-1]) for d in devices] == [
        ("h100-80gb", "/dev/nvidia0"),
        ("h100-80gb", "/dev/nvidia1"),
        ("1g.18gb", f"{CAPS}257"),
        ("1g.18gb", f"{CAPS}392"),
        ("3g.71gb", f"{CAPS}23"),
    ]
    assert [d.files for d in gres_devices(GRES_CONF, "gpu02")] == [("/dev/nvidia0",), ("/dev/nvidia1",)]
    assert gres_devices(GRES_CONF, "nowhere") is None


@pytest.mark.parametrize(
    "text",
    ["AutoDetect=nvml\nNodeName=gpu01 Name=gpu Type=1g.18gb Count=2\n", "", "# nothing\n"],
)
def test_a_gres_conf_that_lists_no_files_gives_no_order(text):
    assert gres_devices(text, "gpu01") is None


def test_the_drivers_mig_minors_name_each_gpu_instances_access_file():
    assert mig_minors(MIG_MINORS) == {22: (2, 2), 23: (2, 2), 256: (2, 13), 257: (2, 13), 391: (2, 14), 392: (2, 14)}


def test_each_index_is_the_device_its_files_open():
    found = devices_by_index(gres_devices(GRES_CONF, "gpu01"), mig_minors(MIG_MINORS), NVML, MINOR.get)
    assert {i: d.uuid for i, d in found.items()} == {
        0: "GPU-a",
        1: "GPU-b",
        2: "MIG-1g-first",
        3: "MIG-1g-second",
        4: "MIG-3g",
    }


def test_an_index_that_cannot_be_told_is_left_out_not_guessed():
    gres = [
        GresDevice("1g.18gb", ("/dev/nvidia2", f"{CAPS}999")),  # a capability file the driver does not list
        GresDevice("h100-80gb", ("/dev/nvidia7",)),  # a GPU NVML does not see
        GresDevice("1g.18gb", ("/dev/nvidia2", f"{CAPS}256")),
        GresDevice("3g.71gb", (f"{CAPS}23",)),  # Slurm 22.05's File= of one compute instance's access file
    ]
    found = devices_by_index(gres, mig_minors(MIG_MINORS), NVML, MINOR.get)
    assert {i: d.uuid for i, d in found.items()} == {2: "MIG-1g-first", 3: "MIG-3g"}


def files(mapping: dict[str, str]):
    return lambda path: mapping.get(path, "")


def test_a_real_node_reports_its_slices_under_slurms_index():
    inventory = DeviceInventory("nvml", NVML, "5 found by NVML")
    read = files({"/etc/slurm/gres.conf": GRES_CONF, "/proc/driver/nvidia-caps/mig-minors": MIG_MINORS})
    asked = []

    def minors_of(uuids):
        asked.append(uuids)
        return {u: MINOR[u] for u in uuids}

    devices = slurm_devices(inventory, "gpu01", {}, read, minors_of)
    assert [(d.index, d.uuid) for d in devices] == [
        (0, "GPU-a"),
        (1, "GPU-b"),
        (2, "MIG-1g-first"),
        (3, "MIG-1g-second"),
        (4, "MIG-3g"),
    ]
    assert asked == [["GPU-a", "GPU-b", "GPU-h200"]], "a slice is found through its GPU's minor number"
    # gres.conf beside SLURM_CONF, wherever the site keeps it.
    moved = files({"/opt/slurm/etc/gres.conf": GRES_CONF, "/proc/driver/nvidia-caps/mig-minors": MIG_MINORS})
    env = {"SLURM_CONF": "/opt/slurm/etc/slurm.conf"}
    assert len(slurm_devices(inventory, "gpu01", env, moved, minors_of)) == 5


def test_without_listed_files_whole_gpus_go_by_minor_and_no_slice_is_reported():
    inventory = DeviceInventory("nvml", NVML, "5 found by NVML")
    read = files({"/etc/slurm/gres.conf": "AutoDetect=nvml\n"})
    devices = slurm_devices(inventory, "gpu01", {}, read, lambda uuids: {"GPU-a": 5, "GPU-b": 6})
    assert [(d.index, d.uuid) for d in devices] == [(5, "GPU-a"), (6, "GPU-b")]
