"""Simulated GPU specs: stable devices from one line of configuration."""

import pytest

from workbench_devices import DeviceSpecError, SimulatedSource, discover_devices, parse_simulated_spec, select_devices
from workbench_devices.sources import SIMULATED_DRIVER_RESERVED_BYTES


def test_a_count_gives_that_many_stable_h100s():
    devices = parse_simulated_spec("4")
    assert [d.uuid for d in devices] == [f"GPU-sim-{i:02d}-h100-80gb" for i in range(4)]
    assert all(d.simulated and d.memory_total_bytes == 80 * 2**30 for d in devices)
    assert parse_simulated_spec("4") == devices, "same spec, same UUIDs"


def test_a_mixed_spec():
    devices = parse_simulated_spec("2xH100-80GB, 1xA100-40GB")
    assert [(d.index, d.model) for d in devices] == [(0, "H100-80GB"), (1, "H100-80GB"), (2, "A100-40GB")]
    assert "simulated" in devices[2].name


@pytest.mark.parametrize("spec", ["x", "2xH100-80GB,,", "-1", "1000", "0xH100-80GB", "2xH100-0GB"])
def test_bad_specs_say_what_to_write(spec):
    with pytest.raises(DeviceSpecError, match="WORKBENCH_SIMULATED_GPUS"):
        parse_simulated_spec(spec)


def test_discovery_labels_its_source():
    assert discover_devices("2").source == "simulated"
    assert "simulated" in discover_devices("2").message
    # No driver on this machine kind: no GPUs, and a sentence saying so.
    real = discover_devices(None)
    assert real.source in ("nvml", "none")
    if real.source == "none":
        assert real.devices == []
        assert "CPU only" in real.message


# -- simulated readings: only a held GPU shows load ------------------------------------------


def _read(held, clock=1000.0):
    source = SimulatedSource(select_devices(discover_devices("3"), {}), clock=lambda: clock, held=held)
    return {g["uuid"]: g for g in source.read()["gpus"]}


@pytest.mark.parametrize("clock", [0.0, 1000.0, 12345.6])
def test_a_free_simulated_gpu_reads_idle(clock):
    gpus = _read(held={"GPU-sim-01-h100-80gb"}, clock=clock)
    for uuid in ("GPU-sim-00-h100-80gb", "GPU-sim-02-h100-80gb"):
        free = gpus[uuid]
        assert free["utilization_percent"] == 0.0
        assert free["memory_used_bytes"] == free["memory_reserved_bytes"] == SIMULATED_DRIVER_RESERVED_BYTES
        assert free["processes"] == []
        assert free["power_w"] <= 0.1 * free["power_limit_w"]
        assert free["temperature_c"] < 32
    held = gpus["GPU-sim-01-h100-80gb"]
    assert held["memory_used_bytes"] > SIMULATED_DRIVER_RESERVED_BYTES
    assert held["processes"]


def test_held_may_be_a_callable_read_at_every_sample():
    holders = [set()]
    source = SimulatedSource(select_devices(discover_devices("1"), {}), clock=lambda: 1000.0, held=lambda: holders[0])
    assert source.read()["gpus"][0]["utilization_percent"] == 0.0
    holders[0] = {"GPU-sim-00-h100-80gb"}
    assert source.read()["gpus"][0]["processes"], "a lease taken between two reads shows at the next"


def test_a_user_servers_own_gpus_are_held_by_default():
    gpus = _read(held=None)
    assert all(g["processes"] and g["memory_used_bytes"] > SIMULATED_DRIVER_RESERVED_BYTES for g in gpus.values())


def test_fleet_view_and_metrics_show_free_simulated_gpus_idle(tmp_path):
    from workbench_hub.service.fleet import Fleet
    from workbench_hub.service.metrics import render_metrics
    from workbench_spawner.ledger.store import AllocationStore
    from workbench_spawner.policy.settings import PolicySettings
    from workbench_spawner.rules.quota import Quota

    store = AllocationStore(f"sqlite:///{tmp_path / 'wb.sqlite'}")
    try:
        fleet = Fleet(
            store, PolicySettings(store.url, discover_devices("2"), servers_per_gpu=1, default_quota=Quota(1), node="n")
        )
        store.allocate("alice", "", 1, ["GPU-sim-01-h100-80gb"])
        rows = {g["uuid"]: g for g in fleet.gpus()}
        free, held = rows["GPU-sim-00-h100-80gb"], rows["GPU-sim-01-h100-80gb"]
        assert not free["holders"]
        assert free["utilization_percent"] == 0.0
        assert free["memory_used_bytes"] == SIMULATED_DRIVER_RESERVED_BYTES
        assert held["holders"][0]["user"] == "alice"
        assert held["memory_used_bytes"] > SIMULATED_DRIVER_RESERVED_BYTES
        text = render_metrics(fleet, [{"name": "alice", "groups": []}])
        util = [
            line
            for line in text.splitlines()
            if line.startswith("DCGM_FI_DEV_GPU_UTIL{") and 'UUID="GPU-sim-00-h100-80gb"' in line
        ]
        assert util, util
        assert float(util[0].rsplit(" ", 1)[1]) == 0.0, util
    finally:
        store.dispose()


def test_nvml_discovery_lists_whole_gpus_and_mig_slices(monkeypatch):
    """Against a stand-in pynvml (no driver here): one whole H100, one in MIG mode with slices in
    slots 0, 1 and 3 of 7 (slot 2 empty, as after a slice was destroyed); the profile comes from
    the slice's name, else from its compute slices and memory."""
    import sys
    from types import SimpleNamespace

    from tests.unit.fake_nvml import fake_pynvml
    from workbench_devices import nvml_devices

    fake = fake_pynvml(2)
    names = {0: b"NVIDIA H100 80GB HBM3 MIG 3g.40gb", 1: b"NVIDIA H100 80GB HBM3 MIG 1g.10gb", 3: b"MIG slice"}
    memory = {0: 40 * 10**9, 1: 10 * 10**9, 3: 20 * 10**9}

    def slot(handle, i):
        if i not in names:
            raise fake.NVMLError_NotFound("Not Found")
        return ("mig", handle[1], i)

    fake.nvmlDeviceGetMigMode = lambda h: (1, 1) if h == ("gpu", 1) else (0, 0)
    fake.nvmlDeviceGetMaxMigDeviceCount = lambda h: 7
    fake.nvmlDeviceGetMigDeviceHandleByIndex = slot
    fake.nvmlDeviceGetName = lambda h: names[h[2]] if h[0] == "mig" else b"NVIDIA H100 80GB HBM3"
    fake.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(total=memory[h[2]] if h[0] == "mig" else 80 << 30)
    fake.nvmlDeviceGetUUID = lambda h: ("MIG-" if h[0] == "mig" else "GPU-") + "-".join(map(str, h[1:]))
    fake.nvmlDeviceGetAttributes = lambda h: SimpleNamespace(gpuInstanceSliceCount=2)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    devices = nvml_devices()
    assert [(d.uuid, d.index, d.model, d.mig, d.profile, d.parent_uuid) for d in devices] == [
        ("GPU-0", 0, "H100-80GB", False, "", ""),
        ("MIG-1-0", 1, "H100-80GB", True, "3g.40gb", "GPU-1"),
        ("MIG-1-1", 1, "H100-80GB", True, "1g.10gb", "GPU-1"),
        ("MIG-1-3", 1, "H100-80GB", True, "2g.20gb", "GPU-1"),
    ]
    profiles = ("3g.40gb", "1g.10gb", "2g.20gb")
    assert [d.name for d in devices[1:]] == [f"NVIDIA H100 80GB HBM3 MIG {p}" for p in profiles]
    assert [round(d.share, 3) for d in devices] == [1.0, round(3 / 7, 3), round(1 / 7, 3), round(2 / 7, 3)]
    assert [d.memory_total_bytes for d in devices] == [80 << 30, 40 * 10**9, 10 * 10**9, 20 * 10**9]


def test_a_gpu_in_mig_mode_without_slices_is_left_out_and_said(monkeypatch, caplog):
    """In MIG mode CUDA reaches a GPU only through its slices: one with none (MIG switched on, no layout
    made yet) is no device a server could use, so it is not offered as a whole GPU either."""
    import sys

    from tests.unit.fake_nvml import fake_pynvml
    from workbench_devices import nvml_devices

    fake = fake_pynvml(2)
    fake.nvmlDeviceGetMigMode = lambda h: (1, 1) if h == ("gpu", 1) else (0, 0)
    fake.nvmlDeviceGetMaxMigDeviceCount = lambda h: 7

    def no_slice(handle, i):
        raise fake.NVMLError_NotFound("Not Found")

    fake.nvmlDeviceGetMigDeviceHandleByIndex = no_slice
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr("workbench_devices.inventory._warned", set())
    with caplog.at_level("WARNING", logger="workbench.devices"):
        assert [d.uuid for d in nvml_devices()] == ["GPU-gpu-0"]
        assert [d.uuid for d in nvml_devices()] == ["GPU-gpu-0"]  # the hub re-reads every minute
    said = "GPU 1 (NVIDIA H100 80GB HBM3) is in MIG mode but has no MIG slices: left out"
    assert caplog.text.count(said) == 1, "said once, not on every read"

    # Slices that cannot be read (another NVML error than an empty place) are not "no slices".
    def refused(handle, i):
        raise fake.NVMLError("Insufficient Permissions")

    fake.nvmlDeviceGetMigDeviceHandleByIndex = refused
    caplog.clear()
    with caplog.at_level("WARNING", logger="workbench.devices"):
        assert [d.uuid for d in nvml_devices()] == ["GPU-gpu-0"]
    assert "its MIG slices could not be read (Insufficient Permissions): left out" in caplog.text
    # ... and the inventory says so, which keeps a re-read from taking it for a layout change.
    from workbench_devices import discover_devices

    inventory = discover_devices("")
    assert inventory.unread == (
        "GPU 1 (NVIDIA H100 80GB HBM3) is in MIG mode but its MIG slices could not be read (Insufficient Permissions)",
    )
    assert inventory.message.startswith("1 GPU(s) found by NVML (GPU 1 (NVIDIA H100 80GB HBM3) is in MIG mode")
