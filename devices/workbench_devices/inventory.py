"""Which GPUs exist: NVML discovery and the simulated fleet.

The hub needs this answer to hand out GPUs and every user server needs the
same answer to show them; neither may ask Jupyter for it, so discovery lives
in this package rather than in the hub or the monitor.

Simulated GPUs stand in for a driver on CI machines and laptops. A spec such
as ``4`` or ``2xH100-80GB,2xA100-40GB`` always yields the same devices with the
same UUIDs (``GPU-sim-00-h100-80gb`` ...), so allocations stored by one hub
process still name real devices after a restart. A GPU in MIG mode is not a
device of its own: each of its slices is (``MIG-…``, with its profile and its
parent GPU), in NVML's answer and in a simulated layout such as
``1xH200-141GB:mig=7x1g.18gb`` alike.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .mig import MigLayoutError, parse_layout, profile_in_name, profile_share

SIMULATED_UUID_PREFIX = "GPU-sim-"
SIMULATED_MIG_UUID_PREFIX = "MIG-sim-"
DEFAULT_SIMULATED_MODEL = "H100-80GB"
_GIB = 1024**3
log = logging.getLogger("workbench.devices")

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
    """One physical GPU (or MIG slice) as the hub and monitor see it.

    A slice has ``mig`` set, its ``profile`` (``1g.18gb``), its parent GPU's
    UUID, and the parent's ``index`` and ``model``: a slice of an H200 is an
    H200-141GB slice, so a model rule applies to its slices too. Its
    ``gpu_instance_id`` is the driver's GPU instance id on that GPU: DCGM (and
    so dcgm-exporter, label ``GPU_I_ID``) names a slice by its parent's UUID
    and this id, never by the slice's ``MIG-`` UUID, so a slice's
    utilization can only be found with both."""

    uuid: str
    index: int
    name: str
    memory_total_bytes: int
    model: str = ""
    mig: bool = False
    simulated: bool = False
    # The cluster node the GPU is on (Slurm); empty on one host, where the hub's node applies.
    node: str = ""
    profile: str = ""  # a slice's MIG profile; "" for a whole GPU
    parent_uuid: str = ""  # a slice's GPU
    gpu_instance_id: int | None = None  # a slice's GPU instance id on its GPU (NVML, DCGM's GPU_I_ID)

    @property
    def share(self) -> float:
        """The share of a GPU this device is (1.0 whole; a ``1g`` slice 1/7): what GPU-hours charge."""
        return profile_share(self.profile) if self.mig else 1.0

    @property
    def kind(self) -> str:
        """What a spawn asks for to get this device: its model, and its profile for a slice."""
        return f"{self.model} {self.profile}".strip() if self.mig else self.model


@dataclass
class DeviceInventory:
    """The result of discovery, with a sentence an operator can read."""

    source: str  # "nvml" | "simulated" | "static" | "slurm" | "none"
    devices: list[GPUDevice] = field(default_factory=list)
    message: str = ""
    # GPUs the source showed but could not read whole (NVML: a MIG GPU whose slices failed to read), as
    # sentences; they are not in ``devices``. A re-read with any is not taken for a layout change.
    unread: tuple[str, ...] = ()

    def by_uuid(self) -> dict[str, GPUDevice]:
        return {d.uuid: d for d in self.devices}

    def count_by_model(self) -> dict[str, int]:
        """Whole GPUs per model ("" for GPUs of no known model): what reservations are measured against.

        Slices are not counted: a reservation holds whole GPUs."""
        counts: dict[str, int] = {}
        for device in self.devices:
            if not device.mig:
                counts[device.model] = counts.get(device.model, 0) + 1
        return counts

    def profiles(self) -> list[str]:
        """The MIG profiles of this inventory's slices, in order of first appearance."""
        return list(dict.fromkeys(d.profile for d in self.devices if d.mig))


_SPEC_ITEM = re.compile(
    r"^(?:(\d+)\s*[xX]\s*)?([A-Za-z]+\d[A-Za-z0-9]*)(?:-(\d+)\s*GB)?(?:\s*:\s*mig\s*=\s*(\S+))?$", re.IGNORECASE
)


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
    ``[N x]MODEL[-MEMGB][:mig=LAYOUT]`` items (``2xH100-80GB,1xA100-40GB``;
    ``1xH200-141GB:mig=7x1g.18gb`` lays that GPU out as seven slices,
    ``2x1g.18gb+1x2g.35gb+1x3g.71gb`` mixes profiles). ``node`` (a cluster
    node's name) goes into every UUID: ``GPU-sim-wbnode2-00-h100-80gb``; a
    slice's is ``MIG-sim-00-h200-141gb-3-1g.18gb`` (its GPU, its place on it).
    """
    node_key = simulated_node_key(node)
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
    gpus = 0
    for raw in spec.split(","):
        item = raw.strip()
        match = _SPEC_ITEM.match(item)
        if not match:
            raise DeviceSpecError(
                f"WORKBENCH_SIMULATED_GPUS: cannot read {item!r}; write a count such as 4 or items such as "
                "2xH100-80GB,1xA100-40GB (a MIG layout: 1xH200-141GB:mig=7x1g.18gb)"
            )
        count = int(match.group(1) or 1)
        model = match.group(2).upper()
        memory_gb = int(match.group(3) or 80)
        if count < 1 or memory_gb < 1:
            raise DeviceSpecError(f"WORKBENCH_SIMULATED_GPUS: {item!r} needs a count and memory of at least 1")
        short = f"{model}-{memory_gb}GB"
        try:
            layout = parse_layout(short, match.group(4)) if match.group(4) else []
        except MigLayoutError as exc:
            raise DeviceSpecError(f"WORKBENCH_SIMULATED_GPUS: {exc}") from None
        for _ in range(count):
            index = gpus
            gpus += 1
            whole = GPUDevice(
                uuid=f"{SIMULATED_UUID_PREFIX}{node_key}{index:02d}-{short.lower()}",
                index=index,
                name=_SIMULATED_NAMES.get(model, f"NVIDIA {model} (simulated)"),
                memory_total_bytes=memory_gb * _GIB,
                model=short,
                simulated=True,
            )
            if not layout:
                devices.append(whole)
            for place, profile in enumerate(layout):
                devices.append(
                    GPUDevice(
                        uuid=f"{SIMULATED_MIG_UUID_PREFIX}{node_key}{index:02d}-{short.lower()}-{place}-{profile.name}",
                        index=index,
                        name=f"{whole.name} MIG {profile.name}",
                        memory_total_bytes=profile.memory_gb * 10**9,
                        model=short,
                        mig=True,
                        simulated=True,
                        profile=profile.name,
                        parent_uuid=whole.uuid,
                        # Stable per place, as the UUID is; a real driver numbers its own (see _slice).
                        gpu_instance_id=simulated_gpu_instance_id(place),
                    )
                )
        if gpus > 64:
            raise DeviceSpecError("WORKBENCH_SIMULATED_GPUS: at most 64 simulated GPUs")
    return devices


def simulated_gpu_instance_id(place: int) -> int:
    """The GPU instance id of a simulated slice: its place in its GPU's layout, from 1 (a demo's exporter
    text, or a test's, names a simulated slice with it as ``GPU_I_ID``, its GPU's UUID as ``UUID``)."""
    return place + 1


def nvml_devices() -> list[GPUDevice]:
    """Every GPU the driver shows, MIG slices listed as their own devices (``nvml_read``'s devices).

    Raises whatever NVML raises when no driver is present; callers decide how
    loud to be about that.
    """
    return nvml_read()[0]


def nvml_read() -> tuple[list[GPUDevice], list[str]]:
    """The devices NVML shows, and a sentence for each GPU it showed but whose MIG slices could not be
    read (left out of the devices): a re-read that has any is not a layout change (``inventory_refresh``).

    Raises whatever NVML raises when no driver is present.
    """
    import pynvml  # from nvidia-ml-py

    pynvml.nvmlInit()
    try:
        devices: list[GPUDevice] = []
        unread: list[str] = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = _text(pynvml.nvmlDeviceGetName(handle))
            try:
                mig_slices = _mig_slices(pynvml, handle, index, name)
            except pynvml.NVMLError as exc:
                unread.append(f"GPU {index} ({name}) is in MIG mode but its MIG slices could not be read ({exc})")
                _warn_once(f"{unread[-1]}: left out")
                continue
            if mig_slices is None:
                devices.append(_device(pynvml, handle, index, name))
            elif mig_slices:
                devices.extend(mig_slices)
            else:
                # In MIG mode CUDA sees a GPU only through its slices: with none, a server pinned to the
                # GPU's own UUID would see no device at all. Left out until a layout is made.
                _warn_once(
                    f"GPU {index} ({name}) is in MIG mode but has no MIG slices: left out of the inventory until "
                    "slices are made (nvidia-smi mig -cgi ... -C) or MIG mode is switched off"
                )
        return devices, unread
    finally:
        pynvml.nvmlShutdown()


def _mig_slices(pynvml: Any, handle: Any, index: int, name: str) -> list[GPUDevice] | None:
    """A GPU's MIG slices: None where it is not in MIG mode (or the driver cannot say), so it is a whole
    GPU; a list, perhaps empty, where it is."""
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError:
        return None
    if current != pynvml.NVML_DEVICE_MIG_ENABLE:
        return None
    parent = _device(pynvml, handle, index, name)
    slices: list[GPUDevice] = []
    # An empty place (a slice destroyed, or never made) is NOT_FOUND; any other error is raised, so a GPU
    # whose slices cannot be read is not mistaken for one without slices.
    empty = getattr(pynvml, "NVMLError_NotFound", ())
    for mig_index in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, mig_index)
        except empty:
            continue
        slices.append(_slice(pynvml, mig, parent))
    return slices


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    """Log ``message`` the first time only: the hub re-reads the inventory every minute while a layout changes."""
    if message not in _warned:
        _warned.add(message)
        log.warning("%s", message)


def _device(pynvml: Any, handle: Any, index: int, name: str) -> GPUDevice:
    """One whole GPU from its NVML handle (for a GPU in MIG mode: its slices' parent)."""
    total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
    return GPUDevice(
        uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
        index=index,
        name=name,
        memory_total_bytes=total,
        model=_model_from_name(name, total),
    )


def _slice(pynvml: Any, handle: Any, parent: GPUDevice) -> GPUDevice:
    """One MIG slice from its NVML handle: its profile, and its GPU's (``parent``) UUID, index and model."""
    total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
    try:
        name = _text(pynvml.nvmlDeviceGetName(handle))
    except pynvml.NVMLError:
        name = ""
    profile = profile_in_name(name) or _profile_from_attributes(pynvml, handle, total)
    return GPUDevice(
        uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
        index=parent.index,
        name=f"{parent.name} MIG {profile}".strip(),
        memory_total_bytes=total,
        model=parent.model,
        mig=True,
        profile=profile,
        parent_uuid=parent.uuid,
        gpu_instance_id=_gpu_instance_id(pynvml, handle),
    )


def _gpu_instance_id(pynvml: Any, handle: Any) -> int | None:
    """A slice's GPU instance id (what DCGM calls it), or None where the driver or library cannot say:
    that slice then has no DCGM reading, which idle reclaim never counts as idle."""
    try:
        return int(pynvml.nvmlDeviceGetGpuInstanceId(handle))
    except (pynvml.NVMLError, AttributeError, TypeError, ValueError):
        return None


def _profile_from_attributes(pynvml: Any, handle: Any, total: int) -> str:
    """A slice's profile from its compute slices and memory, where its name does not carry it."""
    try:
        compute = int(pynvml.nvmlDeviceGetAttributes(handle).gpuInstanceSliceCount)
    except (pynvml.NVMLError, AttributeError):
        return ""
    return f"{compute}g.{round(total / 10**9)}gb"


def _text(value: object) -> str:
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
        spec = simulated_spec_text(simulated_spec)
        devices = parse_simulated_spec(spec, node)
        shown = simulated_spec if spec == simulated_spec else f"{simulated_spec.strip()} ({spec})"
        return DeviceInventory(
            "simulated",
            devices,
            f"{counted(devices, 'simulated ')} from WORKBENCH_SIMULATED_GPUS={shown}: "
            "no real hardware, readings are made up",
        )
    try:
        import pynvml  # from nvidia-ml-py
    except ImportError as exc:
        return DeviceInventory("none", [], f"no NVIDIA driver found ({exc}); servers will be CPU only")
    try:
        devices, unread = nvml_read()
    except pynvml.NVMLError as exc:  # NVMLError_LibraryNotFound (pynvml's word for a failed load), a driver mismatch...
        return DeviceInventory("none", [], f"no NVIDIA driver found ({exc}); servers will be CPU only")
    if not devices and not unread:
        return DeviceInventory("none", [], "NVML found no GPUs; servers will be CPU only")
    left_out = f" ({'; '.join(unread)}: left out)" if unread else ""
    return DeviceInventory("nvml", devices, f"{counted(devices)} found by NVML{left_out}", unread=tuple(unread))


def simulated_spec_text(value: str) -> str:
    """The spec itself, or, for ``@FILE``, the spec written in that file: the hub re-reads it like NVML
    (``inventory_refresh_seconds``), so a demo or a test can change a simulated MIG layout while the hub runs."""
    if not value.strip().startswith("@"):
        return value
    path = Path(value.strip()[1:])
    setting = f"WORKBENCH_SIMULATED_GPUS={value.strip()}"
    try:
        spec = path.read_text().strip()
    except OSError as exc:
        raise DeviceSpecError(f"{setting}: cannot read {path} ({exc.strerror})") from None
    if not spec:
        raise DeviceSpecError(f"{setting}: {path} is empty; write a spec such as 2xH100-80GB")
    return spec


def counted(devices: list[GPUDevice], adjective: str = "") -> str:
    """ "4 GPU(s)", or "2 GPU(s) and 10 MIG slice(s)" where slices are among them (their GPUs not counted)."""
    slices = sum(1 for d in devices if d.mig)
    whole = len(devices) - slices
    if not slices:
        return f"{whole} {adjective}GPU(s)"
    return f"{whole} {adjective}GPU(s) and {slices} MIG slice(s)" if whole else f"{slices} {adjective}MIG slice(s)"
