"""Which of the inventory's GPUs belong to this server, and the CUDA ordinal of each.

The hub pins a server to its GPUs by UUID (``WORKBENCH_GPUS``), but NVML
ignores ``CUDA_VISIBLE_DEVICES`` and sees every device: without this filter a
server pinned to GPU 2 would show GPU 0.  The hub (to show a server what it
holds) and the monitor (to read only its own devices) must draw that line the
same way, so it lives next to the inventory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from .inventory import DeviceInventory, GPUDevice

NO_GPU_MESSAGE = "no GPU assigned"


@dataclass(frozen=True)
class Selection:
    """The devices this server may show, with the CUDA ordinal of each."""

    devices: list[GPUDevice]
    cuda_index: dict[str, int]
    state: str  # "ok" | "no-gpu" | "unavailable"
    message: str
    source: str  # "nvml" | "simulated" | "none"


def _split(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def _match(entry: str, devices: list[GPUDevice]) -> GPUDevice | None:
    """One CUDA_VISIBLE_DEVICES / WORKBENCH_GPUS entry: an index, a UUID or a UUID prefix."""
    if entry.isdigit():
        index = int(entry)
        for device in devices:
            if device.index == index and not device.mig:
                return device
        return None
    wanted = entry.lower()
    exact = [d for d in devices if d.uuid.lower() == wanted]
    if exact:
        return exact[0]
    # CUDA accepts any unique UUID prefix ("GPU-8a3f").
    prefixed = [d for d in devices if d.uuid.lower().startswith(wanted)]
    return prefixed[0] if len(prefixed) == 1 else None


def select_devices(inventory: DeviceInventory, environ: Mapping[str, str] | None = None) -> Selection:
    """Filter the inventory to this server's GPUs.

    ``WORKBENCH_GPUS`` (set by the workbench spawner, UUIDs) wins; an empty
    value means a CPU-only server.  Without it, ``CUDA_VISIBLE_DEVICES`` is
    read the way CUDA reads it (indices or UUIDs, stop at the first entry
    that names no device, ``-1`` or empty means none).  Without either, every
    device is shown.  NVML ignores ``CUDA_VISIBLE_DEVICES``, so this filter is
    what keeps a server pinned to GPU 2 from showing GPU 0.

    The CUDA ordinal of a device is its position in ``CUDA_VISIBLE_DEVICES``
    when that is set, else its rank among the selected devices by NVML index
    (what CUDA does with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, and inside a
    container whose only devices are these).
    """
    env = os.environ if environ is None else environ
    devices = list(inventory.devices)
    source = inventory.source
    if source == "none" and not devices:
        if "WORKBENCH_GPUS" in env and not env["WORKBENCH_GPUS"].strip():
            return Selection([], {}, "no-gpu", NO_GPU_MESSAGE, source)
        message = (inventory.message or "no NVIDIA driver found").replace("; servers will be CPU only", "")
        return Selection([], {}, "unavailable", message, source)

    cuda_env = env.get("CUDA_VISIBLE_DEVICES")
    cuda_order: list[GPUDevice] | None = None
    if cuda_env is not None:
        cuda_order = []
        for entry in _split(cuda_env):
            device = _match(entry, devices)
            if device is None:  # CUDA stops at the first invalid entry
                break
            cuda_order.append(device)

    missing: list[str] = []
    if "WORKBENCH_GPUS" in env:
        wanted = _split(env["WORKBENCH_GPUS"])
        if not wanted:
            return Selection([], {}, "no-gpu", NO_GPU_MESSAGE, source)
        chosen = []
        for entry in wanted:
            device = _match(entry, devices)
            if device is None:
                missing.append(entry)
            elif device not in chosen:
                chosen.append(device)
    elif cuda_order is not None:
        chosen = cuda_order
        if not chosen:
            return Selection([], {}, "no-gpu", NO_GPU_MESSAGE, source)
    else:
        chosen = devices

    if cuda_order is not None:
        positions = {d.uuid: i for i, d in enumerate(cuda_order)}
        cuda_index = {d.uuid: positions[d.uuid] for d in chosen if d.uuid in positions}
    else:
        ranked = sorted(chosen, key=lambda d: (d.index, d.uuid))
        cuda_index = {d.uuid: i for i, d in enumerate(ranked)}

    if not chosen:
        return Selection(
            [], {}, "unavailable", f"assigned GPU(s) {', '.join(missing)} not visible to this server", source
        )
    message = inventory.message if source == "simulated" else ""
    if missing:
        message = f"assigned GPU(s) {', '.join(missing)} not visible to this server"
    return Selection(chosen, cuda_index, "ok", message, source)
