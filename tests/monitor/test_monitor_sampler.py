"""The sampler without a server: device filters, sources, NVML error handling, the thread."""

from __future__ import annotations

import time
import types

import pytest

from tests.monitor.monitor_support import PINNED_KEYS
from workbench_devices import (
    DeviceInventory,
    GPUDevice,
    NVMLSource,
    SimulatedSource,
    discover_devices,
    make_source,
    select_devices,
)
from workbench_devices.selection import NO_GPU_MESSAGE
from workbench_devices.sources import ATTRIBUTION_NOTE
from workbench_gpu_monitor.sampler import MIN_INTERVAL_SECONDS, Sampler, compact_history


def sim(spec="4"):
    return discover_devices(spec)


# -- which GPUs ------------------------------------------------------------
def test_workbench_gpus_selects_only_own_gpu():
    sel = select_devices(sim(), {"WORKBENCH_GPUS": "GPU-sim-02-h100-80gb"})
    assert [d.uuid for d in sel.devices] == ["GPU-sim-02-h100-80gb"]
    assert sel.cuda_index == {"GPU-sim-02-h100-80gb": 0}
    assert sel.state == "ok"


def test_workbench_gpus_wins_over_cuda_visible_devices_and_maps_ordinal():
    env = {"WORKBENCH_GPUS": "GPU-sim-03-h100-80gb,GPU-sim-01-h100-80gb", "CUDA_VISIBLE_DEVICES": "3,1"}
    sel = select_devices(sim(), env)
    assert {d.uuid for d in sel.devices} == {"GPU-sim-03-h100-80gb", "GPU-sim-01-h100-80gb"}
    # PyTorch sees CUDA_VISIBLE_DEVICES order: GPU 3 is cuda:0.
    assert sel.cuda_index == {"GPU-sim-03-h100-80gb": 0, "GPU-sim-01-h100-80gb": 1}


def test_workbench_gpus_without_cuda_env_ranks_by_index():
    sel = select_devices(sim(), {"WORKBENCH_GPUS": "GPU-sim-03-h100-80gb,GPU-sim-01-h100-80gb"})
    assert sel.cuda_index == {"GPU-sim-01-h100-80gb": 0, "GPU-sim-03-h100-80gb": 1}


def test_empty_workbench_gpus_means_cpu_only():
    sel = select_devices(sim(), {"WORKBENCH_GPUS": "", "CUDA_VISIBLE_DEVICES": "0"})
    assert sel.devices == []
    assert sel.state == "no-gpu"
    assert sel.message == NO_GPU_MESSAGE


@pytest.mark.parametrize(
    ("cvd", "expected"),
    [
        ("2", ["GPU-sim-02-h100-80gb"]),
        ("GPU-sim-01-h100-80gb,0", ["GPU-sim-01-h100-80gb", "GPU-sim-00-h100-80gb"]),
        ("GPU-sim-03", ["GPU-sim-03-h100-80gb"]),  # unique prefix, as CUDA allows
        ("1,9,2", ["GPU-sim-01-h100-80gb"]),  # CUDA stops at the first invalid entry
    ],
)
def test_cuda_visible_devices_by_index_uuid_or_prefix(cvd, expected):
    sel = select_devices(sim(), {"CUDA_VISIBLE_DEVICES": cvd})
    assert [d.uuid for d in sel.devices] == expected
    assert sorted(sel.cuda_index.values()) == list(range(len(expected)))


@pytest.mark.parametrize("cvd", ["", "-1"])
def test_cuda_visible_devices_empty_is_cpu_only(cvd):
    assert select_devices(sim(), {"CUDA_VISIBLE_DEVICES": cvd}).state == "no-gpu"


def test_no_filter_shows_every_gpu():
    assert len(select_devices(sim("2xH100-80GB,2xA100-40GB"), {}).devices) == 4


def test_assigned_gpu_missing_is_reported_not_raised():
    sel = select_devices(sim("2"), {"WORKBENCH_GPUS": "GPU-does-not-exist"})
    assert sel.devices == []
    assert sel.state == "unavailable"
    assert "not visible" in sel.message


def test_no_driver_is_a_readable_state():
    inv = DeviceInventory(
        "none", [], "no NVIDIA driver found (NVML Shared Library Not Found); servers will be CPU only"
    )
    sel = select_devices(inv, {})
    assert sel.state == "unavailable"
    assert "no NVIDIA driver" in sel.message
    assert "servers will" not in sel.message
    snap = NVMLSource(sel).read()
    assert snap["gpus"] == []
    assert snap["state"] == "unavailable"


# -- simulated source -------------------------------------------------------
def test_simulated_reading_has_pinned_shape_and_label():
    clock = iter([1000.0, 1001.0])
    source = make_source({"WORKBENCH_SIMULATED_GPUS": "4", "WORKBENCH_GPUS": "GPU-sim-02-h100-80gb"})
    assert isinstance(source, SimulatedSource)
    source.clock = lambda: next(clock)
    a, b = source.read(), source.read()
    assert a["source"] == "simulated"
    assert a["state"] == "ok"
    assert "simulated" in a["message"]
    assert [g["uuid"] for g in a["gpus"]] == ["GPU-sim-02-h100-80gb"]
    gpu = a["gpus"][0]
    assert set(gpu) >= PINNED_KEYS
    assert gpu["cuda_index"] == 0
    assert 0 <= gpu["utilization_percent"] <= 100
    assert 0 < gpu["memory_used_bytes"] < gpu["memory_total_bytes"] == 80 * 1024**3
    assert "simulated" in gpu["name"]
    # time-varying but deterministic
    assert a["gpus"][0]["utilization_percent"] != b["gpus"][0]["utilization_percent"]
    again = SimulatedSource(source.selection, clock=lambda: 1000.0).read()
    assert again["gpus"] == a["gpus"]


def test_make_source_cpu_only_never_loads_nvml():
    source = make_source({"WORKBENCH_GPUS": ""})
    snap = source.read()
    assert snap["state"] == "no-gpu"
    assert snap["message"] == NO_GPU_MESSAGE
    assert snap["gpus"] == []


def test_bad_simulated_spec_is_a_state_not_a_crash():
    snap = make_source({"WORKBENCH_SIMULATED_GPUS": "lots of gpus"}).read()
    assert snap["state"] == "unavailable"
    assert "WORKBENCH_SIMULATED_GPUS" in snap["message"]


# -- NVML with a fake library ------------------------------------------------
class FakeNVML(types.SimpleNamespace):
    """Just enough of pynvml: two GPUs, the second a MIG slice without utilization."""

    class NVMLError(Exception):
        pass

    class NVMLError_GpuIsLost(NVMLError):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    NVML_TEMPERATURE_GPU = 0
    nvmlMemory_v2 = 0x2000028

    def __init__(self):
        super().__init__(inits=0, shutdowns=0, lost=set(), v2=True)

    def nvmlInit(self):
        self.inits += 1
        self.lost.clear()

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return uuid.decode()

    def _check(self, h):
        if h in self.lost:
            raise self.NVMLError_GpuIsLost("GPU is lost")

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        self._check(h)
        if version is not None and not self.v2:
            raise self.NVMLError_NotSupported("v2 not supported")
        mem = types.SimpleNamespace(total=40 << 30, used=10 << 30, free=30 << 30)
        if version is not None:
            mem.reserved = 512 << 20
        return mem

    def nvmlDeviceGetUtilizationRates(self, h):
        self._check(h)
        if h.startswith("MIG"):
            raise self.NVMLError_NotSupported("Not Supported")
        return types.SimpleNamespace(gpu=42, memory=10)

    def nvmlDeviceGetTemperature(self, h, sensor):
        self._check(h)
        if h.startswith("MIG"):
            raise self.NVMLError_NotSupported("Not Supported")
        return 55

    def nvmlDeviceGetPowerUsage(self, h):
        self._check(h)
        if h.startswith("MIG"):
            raise self.NVMLError_NotSupported("Not Supported")
        return 250_000

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 400_000

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        import os

        return [types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=1 << 30)] + (
            [types.SimpleNamespace(pid=999_999_999, usedGpuMemory=2 << 30)] if h.startswith("MIG") else []
        )

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        return []


def nvml_selection(env=None):
    devices = [
        GPUDevice("GPU-aaaa", 0, "NVIDIA A100", 40 << 30, "A100-40GB"),
        GPUDevice("MIG-bbbb", 1, "NVIDIA A100 MIG 0", 10 << 30, "A100-10GB-MIG", mig=True),
    ]
    return select_devices(DeviceInventory("nvml", devices, "2 GPU(s)"), env or {})


def test_nvml_reads_counters_and_v2_memory():
    fake = FakeNVML()
    snap = NVMLSource(nvml_selection(), pynvml=fake).read()
    assert snap["source"] == "nvml"
    assert snap["state"] == "ok"
    gpu = snap["gpus"][0]
    assert gpu["utilization_percent"] == 42.0
    assert gpu["power_w"] == 250.0
    assert gpu["temperature_c"] == 55.0
    assert gpu["memory_reserved_bytes"] == 512 << 20
    assert gpu["processes"][0]["own"] is True
    assert gpu["memory_note"] == ""


def test_nvml_falls_back_to_v1_memory():
    fake = FakeNVML()
    fake.v2 = False
    gpu = NVMLSource(nvml_selection(), pynvml=fake).read()["gpus"][0]
    assert gpu["memory_used_bytes"] == 10 << 30
    assert gpu["memory_reserved_bytes"] is None


def test_mig_without_utilization_is_null_with_reason_and_foreign_pids_noted():
    mig = NVMLSource(nvml_selection(), pynvml=FakeNVML()).read()["gpus"][1]
    assert mig["state"] == "ok"
    assert mig["utilization_percent"] is None
    assert mig["unsupported"]["utilization_percent"] == "n/a (MIG)"
    assert mig["memory_used_bytes"] == 10 << 30  # memory per MIG slice still shown
    # a PID we cannot see (host PID inside a container): do not guess
    assert mig["memory_note"] == ATTRIBUTION_NOTE
    assert mig["memory_attribution"] == "device"


def test_lost_gpu_is_reported_and_nvml_reinitialised():
    fake = FakeNVML()
    source = NVMLSource(nvml_selection(), pynvml=fake)
    source.read()
    fake.lost.add("GPU-aaaa")
    snap = source.read()
    assert snap["gpus"][0]["state"] == "lost"
    assert "lost" in snap["gpus"][0]["message"]
    assert snap["gpus"][1]["state"] == "ok"
    snap = source.read()  # re-init clears the fault
    assert fake.inits == 2
    assert fake.shutdowns == 1
    assert snap["gpus"][0]["state"] == "ok"


def test_missing_library_is_readable():
    class Broken:
        class NVMLError(Exception):
            pass

        def nvmlInit(self):
            raise self.NVMLError("NVML Shared Library Not Found")

    snap = NVMLSource(nvml_selection(), pynvml=Broken()).read()
    assert snap["state"] == "unavailable"
    assert "no NVIDIA driver" in snap["message"]


# -- the thread ---------------------------------------------------------------
class CountingSource:
    source = "simulated"

    def __init__(self):
        self.reads = 0

    def read(self):
        self.reads += 1
        return {"source": "simulated", "state": "ok", "message": "", "timestamp": time.time(), "gpus": []}


def test_sampler_enforces_minimum_interval_and_keeps_history():
    source = CountingSource()
    sampler = Sampler(source, interval=0.001, history_seconds=1.0)
    assert sampler.interval == MIN_INTERVAL_SECONDS
    assert sampler.history.maxlen == 4
    got = []
    sampler.add_listener(got.append)
    sampler.start()
    time.sleep(1.2)
    sampler.stop()
    # 1 immediate + ~4 ticks in 1.2 s at 0.25 s: never a busy loop
    assert 3 <= source.reads <= 7
    assert len(got) == source.reads
    assert len(sampler.history) <= 4


def test_sampler_survives_a_failing_source():
    class Failing:
        source = "nvml"

        def read(self):
            raise RuntimeError("boom")

    sample = Sampler(Failing()).sample_once()
    assert sample["state"] == "error"
    assert "boom" in sample["message"]


def test_compact_history():
    source = SimulatedSource(select_devices(sim("2"), {}), clock=iter([1.0, 2.0]).__next__)
    hist = compact_history([source.read(), source.read()])
    assert set(hist) == {"GPU-sim-00-h100-80gb", "GPU-sim-01-h100-80gb"}
    assert hist["GPU-sim-00-h100-80gb"]["timestamp"] == [1.0, 2.0]
    assert len(hist["GPU-sim-00-h100-80gb"]["utilization_percent"]) == 2
