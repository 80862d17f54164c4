"""MIG slices in the inventory: profiles, simulated layouts, shares (the stand-in NVML case is in test_devices)."""

from __future__ import annotations

import pytest

from workbench_devices import DeviceSpecError, discover_devices, parse_simulated_spec
from workbench_devices.mig import MigLayoutError, parse_layout, profile_in_name, profile_share


def test_one_h200_in_seven_1g_slices_as_the_issue_pins_it():
    devices = parse_simulated_spec("1xH200-141GB:mig=7x1g.18gb")
    assert len(devices) == 7
    assert [d.uuid for d in devices] == [f"MIG-sim-00-h200-141gb-{i}-1g.18gb" for i in range(7)]
    assert all(d.mig and d.simulated and d.profile == "1g.18gb" for d in devices)
    assert {(d.index, d.model, d.parent_uuid) for d in devices} == {(0, "H200-141GB", "GPU-sim-00-h200-141gb")}
    assert devices[0].name == "NVIDIA H200 (simulated) MIG 1g.18gb"
    assert devices[0].memory_total_bytes == 18 * 10**9
    assert devices[0].kind == "H200-141GB 1g.18gb"
    assert parse_simulated_spec("1xH200-141GB:mig=7x1g.18gb") == devices, "same spec, same UUIDs"


def test_mixed_layouts_and_whole_gpus_keep_their_gpu_indexes():
    devices = parse_simulated_spec("2xH200-141GB:mig=2x1g.18gb+1x2g.35gb+1x3g.71gb,2xH100-80GB")
    assert [(d.index, d.profile or d.model) for d in devices] == [
        (0, "1g.18gb"),
        (0, "1g.18gb"),
        (0, "2g.35gb"),
        (0, "3g.71gb"),
        (1, "1g.18gb"),
        (1, "1g.18gb"),
        (1, "2g.35gb"),
        (1, "3g.71gb"),
        (2, "H100-80GB"),
        (3, "H100-80GB"),
    ]
    assert len({d.uuid for d in devices}) == 10
    assert devices[4].uuid == "MIG-sim-01-h200-141gb-0-1g.18gb"
    assert devices[8].uuid == "GPU-sim-02-h100-80gb"


def test_a_nodes_slices_carry_its_name_as_its_gpus_do():
    (first, *_rest) = parse_simulated_spec("1xH100-80GB:mig=1x3g.40gb+1x4g.40gb", node="wbnode2")
    assert first.uuid == "MIG-sim-wbnode2-00-h100-80gb-0-3g.40gb"
    assert first.parent_uuid == "GPU-sim-wbnode2-00-h100-80gb"


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("1xH200-141GB:mig=8x1g.18gb", "fits 1 to 7 slices of 1g.18gb, not 8"),
        ("1xH200-141GB:mig=7x1g.10gb", "H200-141GB has no MIG profile '7x1g.10gb'; its profiles are 1g.18gb"),
        ("1xH200-141GB:mig=2x3g.71gb+1x1g.18gb", "needs 7 of 7 compute slices and 9 of 8 memory slices"),
        ("1xH200-141GB:mig=1x4g.71gb+1x4g.71gb", "fits at most 1 slice of 4g.71gb"),
        ("1xL40S-48GB:mig=1x1g.10gb", "L40S-48GB cannot be cut into MIG slices"),
        ("1xH100-80GB:mig=", "cannot read"),
        ("1xH100-80GB:mig=0x1g.10gb", "fits 1 to 7 slices of 1g.10gb, not 0"),
    ],
)
def test_a_layout_that_cannot_exist_is_refused_in_words(spec, says):
    with pytest.raises(DeviceSpecError, match="WORKBENCH_SIMULATED_GPUS") as refused:
        parse_simulated_spec(spec)
    assert says in str(refused.value)


def test_every_profile_of_every_table_fits_as_many_times_as_the_table_says():
    from workbench_devices.mig import PROFILES

    for model, profiles in PROFILES.items():
        for profile in profiles.values():
            assert len(parse_layout(model, f"{profile.per_gpu}x{profile.name}")) == profile.per_gpu
            with pytest.raises(MigLayoutError):
                parse_layout(model, f"{profile.per_gpu + 1}x{profile.name}")


@pytest.mark.parametrize(
    ("profile", "share"),
    [("1g.18gb", 1 / 7), ("1g.35gb", 1 / 7), ("2g.35gb", 2 / 7), ("3g.71gb", 3 / 7), ("7g.141gb", 1.0), ("", 1.0)],
)
def test_a_slice_counts_its_compute_slices_over_seven(profile, share):
    assert profile_share(profile) == pytest.approx(share)


@pytest.mark.parametrize(
    ("name", "profile"),
    [
        ("NVIDIA H200 MIG 1g.18gb", "1g.18gb"),
        ("NVIDIA A100-SXM4-40GB MIG 3g.20gb", "3g.20gb"),
        ("NVIDIA H100 80GB HBM3 MIG 7G.80GB", "7g.80gb"),
        ("NVIDIA H100 80GB HBM3", ""),
    ],
)
def test_the_profile_is_read_from_a_slices_nvml_name(name, profile):
    assert profile_in_name(name) == profile


def test_reservations_count_whole_gpus_and_the_inventory_lists_its_profiles():
    inventory = discover_devices("1xH200-141GB:mig=3x2g.35gb,1xH200-141GB:mig=7x1g.18gb,2xH100-80GB")
    assert inventory.count_by_model() == {"H100-80GB": 2}
    assert inventory.profiles() == ["2g.35gb", "1g.18gb"]
    assert "2 simulated GPU(s) and 10 MIG slice(s) from" in inventory.message


def test_a_simulated_slice_reads_as_a_real_one_memory_but_no_utilization(tmp_path):
    """NVML has no utilization, temperature or power per MIG slice: the simulated slice says so, names its
    profile and GPU, and a script (a site's DCGM reading, in a test) can still give it a utilization."""
    import json

    from workbench_devices import SimulatedSource, select_devices

    inventory = discover_devices("1xH200-141GB:mig=7x1g.18gb")
    mine = inventory.devices[2].uuid
    selection = select_devices(inventory, {"WORKBENCH_GPUS": mine})
    (reading,) = SimulatedSource(selection, clock=lambda: 1000.0).read()["gpus"]
    assert (reading["uuid"], reading["profile"], reading["parent_uuid"]) == (mine, "1g.18gb", "GPU-sim-00-h200-141gb")
    assert reading["utilization_percent"] is None
    assert reading["unsupported"]["utilization_percent"] == "n/a (MIG)"
    assert reading["memory_used_bytes"] > 0
    assert reading["memory_total_bytes"] == 18 * 10**9
    script = tmp_path / "util.json"
    script.write_text(json.dumps({mine: 3.0}))
    (scripted,) = SimulatedSource(selection, clock=lambda: 1000.0, script=str(script)).read()["gpus"]
    assert scripted["utilization_percent"] == 3.0
    assert "utilization_percent" not in scripted["unsupported"]
