"""Which GPUs exist: NVML discovery and the simulated fleet.

The hub needs this answer to hand out GPUs and every user server needs the
same answer to show them; neither may ask Jupyter for it, so discovery lives
in this package rather than in the hub or the monitor.

Simulated GPUs stand in for a driver on CI machines and laptops. A spec such
as ``4`` or ``2xH100-80GB,2xA100-40GB`` always yields the same devices with the
same UUIDs (``GPU-sim-00-h100-80gb`` ...), so allocations stored by one hub
process still name real devices after a restart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

SIMULATED_UUID_PREFIX = "GPU-sim-"
DEFAULT_SIMULATED_MODEL = "H100-80GB"
_GIB = 1024**3

# Model name as NVML reports it, keyed by the short model used in specs.
_SIMULATED_NAMES = {
    "H200": "NVIDIA H200 (simulated)",
    "H100": "NVIDIA H100 80GB HBM3 (simulated)",
    "A100": "NVIDIA A100-SXM4 (simulated)",
    "L40S": "NVIDIA L40S (simulated)",
    "T4": "Tesla T4 (simulated)",
}


class DeviceSpecError(ValueError):
    """A simulated-GPU spec that cannot be understood; the message says why."""


@dataclass(frozen=True)
class GPUDevice:
    """One physical GPU (or MIG slice) as the hub and monitor see it."""

    uuid: str
    index: int
    name: str
    memory_total_bytes: int
    model: str = ""
    mig: bool = False
    simulated: bool = False
    # The cluster node the GPU is on (Slurm); empty on one host, where the hub's node applies.
    node: str = ""


@dataclass
class DeviceInventory:
    """The result of discovery, with a sentence an operator can read."""

    source: str  # "nvml" | "simulated" | "static" | "slurm" | "none"
    devices: list[GPUDevice] = field(default_factory=list)
    message: str = ""

    def by_uuid(self) -> dict[str, GPUDevice]:
        return {d.uuid: d for d in self.devices}

    def count_by_model(self) -> dict[str, int]:
        """GPUs per model ("" for GPUs of no known model): what reservations are measured against."""
        counts: dict[str, int] = {}
        for device in self.devices:
            counts[device.model] = counts.get(device.model, 0) + 1
        return counts


_SPEC_ITEM = re.compile(r"^(?:(\d+)\s*[xX]\s*)?([A-Za-z]+\d[A-Za-z0-9]*)(?:-(\d+)\s*GB)?$")


def simulated_node_key(node: str | None) -> str:
    """The part of a simulated UUID that names its node (``WORKBENCH_SIMULATED_NODE``).

    On a cluster every node simulates the same spec; without the node in the
    UUID, GPU 0 of two nodes would be one GPU to the ledger. Empty on one host,
    which keeps the UUIDs stored by existing single-host installs.
    """
    key = re.sub(r"[^a-z0-9]+", "-", (node or "").strip().lower()).strip("-")
    return f"{key}-" if key else ""


def parse_simulated_spec(spec: str, node: str | None = None) -> list[GPUDevice]:
    """Turn ``WORKBENCH_SIMULATED_GPUS`` into devices.

    Accepts a bare count (``4``: that many H100-80GB) or a comma list of
    ``[N x]MODEL[-MEMGB]`` items (``2xH100-80GB,1xA100-40GB``). ``node``
    (a cluster node's name) goes into every UUID: ``GPU-sim-wbnode2-00-h100-80gb``.
    """
    prefix = SIMULATED_UUID_PREFIX + simulated_node_key(node)
    spec = (spec or "").strip()
    if not spec:
        return []
    if spec.isdigit():
        count = int(spec)
        if count > 64:
            raise DeviceSpecError(f"WORKBENCH_SIMULATED_GPUS={spec}: at most 64 simulated GPUs")
        spec = f"{count}x{DEFAULT_SIMULATED_MODEL}" if count else ""
        if not spec:
            return []
    devices: list[GPUDevice] = []
    for raw in spec.split(","):
        item = raw.strip()
        match = _SPEC_ITEM.match(item)
        if not match:
            raise DeviceSpecError(
                f"WORKBENCH_SIMULATED_GPUS: cannot read {item!r}; "
                "write a count such as 4 or items such as 2xH100-80GB,1xA100-40GB"
            )
        count = int(match.group(1) or 1)
        model = match.group(2).upper()
        memory_gb = int(match.group(3) or 80)
        if count < 1 or memory_gb < 1:
            raise DeviceSpecError(f"WORKBENCH_SIMULATED_GPUS: {item!r} needs a count and memory of at least 1")
        for _ in range(count):
            index = len(devices)
            short = f"{model}-{memory_gb}GB"
            devices.append(
                GPUDevice(
                    uuid=f"{prefix}{index:02d}-{short.lower()}",
                    index=index,
                    name=_SIMULATED_NAMES.get(model, f"NVIDIA {model} (simulated)"),
                    memory_total_bytes=memory_gb * _GIB,
                    model=short,
                    simulated=True,
                )
            )
        if len(devices) > 64:
            raise DeviceSpecError("WORKBENCH_SIMULATED_GPUS: at most 64 simulated GPUs")
    return devices


def nvml_devices() -> list[GPUDevice]:
    """Every GPU the driver shows, MIG slices listed as their own devices.

    Raises whatever NVML raises when no driver is present; callers decide how
    loud to be about that.
    """
    import pynvml  # from nvidia-ml-py

    pynvml.nvmlInit()
    try:
        devices: list[GPUDevice] = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = _text(pynvml.nvmlDeviceGetName(handle))
            mig_slices = _mig_slices(pynvml, handle, index, name)
            if mig_slices:
                devices.extend(mig_slices)
                continue
            devices.append(_device(pynvml, handle, index, name, name))
        return devices
    finally:
        pynvml.nvmlShutdown()


def _mig_slices(pynvml, handle, index: int, name: str) -> list[GPUDevice]:
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError:
        return []
    if current != pynvml.NVML_DEVICE_MIG_ENABLE:
        return []
    slices: list[GPUDevice] = []
    for mig_index in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, mig_index)
        except pynvml.NVMLError:
            continue
        slices.append(_device(pynvml, mig, index, f"{name} MIG {mig_index}", name, mig=True))
    return slices


def _device(pynvml, handle, index: int, name: str, board: str, mig: bool = False) -> GPUDevice:
    """One GPUDevice from an NVML handle (a whole GPU, or a MIG slice of board ``board``)."""
    total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
    model = _model_from_name(board, total) + ("-MIG" if mig else "")
    return GPUDevice(
        uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
        index=index,
        name=name,
        memory_total_bytes=total,
        model=model,
        mig=mig,
    )


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _model_from_name(name: str, memory_total: int) -> str:
    """A short model key for quotas (``H100-80GB``) from NVML's long name."""
    words = [w for w in re.split(r"[\s-]+", name) if w and w.upper() not in {"NVIDIA", "TESLA", "GEFORCE", "RTX"}]
    head = words[0].upper() if words else "GPU"
    return f"{head}-{round(memory_total / _GIB)}GB"


def discover_devices(simulated_spec: str | None = None, node: str | None = None) -> DeviceInventory:
    """Simulated devices when a spec is given, else NVML, else none.

    Never raises for a missing driver: a hub without GPUs still serves CPU
    sessions, and the message says which case applies.
    """
    if simulated_spec and simulated_spec.strip() not in ("", "0"):
        devices = parse_simulated_spec(simulated_spec, node)
        return DeviceInventory(
            "simulated",
            devices,
            f"{len(devices)} simulated GPU(s) from WORKBENCH_SIMULATED_GPUS={simulated_spec}: "
            "no real hardware, readings are made up",
        )
    try:
        devices = nvml_devices()
    except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, driver mismatch...
        return DeviceInventory("none", [], f"no NVIDIA driver found ({exc}); servers will be CPU only")
    if not devices:
        return DeviceInventory("none", [], "NVML found no GPUs; servers will be CPU only")
    return DeviceInventory("nvml", devices, f"{len(devices)} GPU(s) found by NVML")
