"""One reading of this server's GPUs, from NVML or the simulated fleet, that never raises.

Every reader of GPU numbers (the monitor's sampler thread, a notebook widget
without a server, the hub's fleet view of simulated GPUs, the benchmark) needs
the same readings in the same plain-dict shape (the one ``api/gpu/metrics``
serves, see extensions/gpu-monitor/README.md), so they are made here, without
Jupyter.  NVML errors are caught per device and per counter: a MIG slice
without utilization counters gives ``null`` plus a reason, a lost GPU gives
``"state": "lost"`` and the source re-initialises NVML on the next read, a
missing library gives a readable ``"state": "unavailable"`` snapshot.  The
simulated readings are a function of the wall clock, so two processes looking
at the same simulated GPU at the same second agree.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from typing import Any

from .inventory import GPUDevice, discover_devices
from .scripted import SCRIPT_ENV, ScriptedUtilization
from .selection import NO_GPU_MESSAGE, Selection, select_devices

ATTRIBUTION_NOTE = "device total, may include other processes"


def _device_stub(device: GPUDevice, cuda_index: int | None) -> dict:
    return {
        "uuid": device.uuid,
        "name": device.name,
        "index": device.index,
        "cuda_index": cuda_index,
        "mig": device.mig,
        # A MIG slice: its profile and its GPU (``index`` is the GPU's), so a panel can name both.
        "profile": device.profile or None,
        "parent_uuid": device.parent_uuid or None,
        "state": "ok",
        "message": "",
        "memory_used_bytes": None,
        "memory_total_bytes": device.memory_total_bytes,
        "memory_reserved_bytes": None,
        "utilization_percent": None,
        "temperature_c": None,
        "power_w": None,
        "power_limit_w": None,
        "processes": [],
        "memory_attribution": "processes",
        "memory_note": "",
        "unsupported": {},
    }


# What a driver keeps on an idle GPU with no process on it (NVML's "reserved"):
# the only memory a free simulated GPU shows.
SIMULATED_DRIVER_RESERVED_BYTES = 512 << 20


class SimulatedSource:
    """Made-up but deterministic readings: a function of the wall clock and device index.

    Two servers (or a server and a kernel) looking at the same simulated GPU at
    the same second see the same numbers, and numbers change every second so a
    browser test can watch them move.

    Only a GPU that some server holds shows made-up load.  A free one reads as
    a real idle card does: 0 % utilization, only the driver's reservation of
    memory, idle power and temperature, no processes.  ``held`` says which are
    held: ``None`` (the default) means every selected GPU, which is right for a
    user server's monitor (its GPUs are its own); the hub's fleet view, which
    reads the whole inventory, passes a callable that returns the UUIDs the
    ledger has leases for at that moment (or a fixed collection).

    A **script** (``WORKBENCH_SIMULATED_UTILIZATION``: the path of a JSON
    file, see ``scripted_utilization``) overrides the made-up utilization of
    the GPUs it names, so a test or a demo can make a GPU idle, busy, or
    unreadable; it is read again whenever the file changes.
    """

    source = "simulated"

    def __init__(
        self,
        selection: Selection,
        clock: Callable[[], float] = time.time,
        held: Callable[[], Collection[str]] | Collection[str] | None = None,
        script: str | None = None,
    ):
        self.selection = selection
        self.clock = clock
        self.held = held
        self.script = ScriptedUtilization(script) if script else None

    def _held_now(self) -> Collection[str] | None:
        held = self.held
        return held() if callable(held) else held

    def read(self) -> dict:
        now = self.clock()
        held = self._held_now()
        gpus = []
        for device in self.selection.devices:
            if held is not None and device.uuid not in held:
                gpus.append(self._idle(device, now))
                continue
            i = device.index
            util = 55 + 35 * math.sin(0.21 * now + 1.3 * i) + 9 * math.sin(1.7 * now + 2.1 * i)
            util = max(0.0, min(100.0, util))
            fraction = 0.45 + 0.3 * math.sin(0.037 * now + 0.9 * i) + 0.02 * math.sin(0.9 * now + i)
            fraction = max(0.02, min(0.97, fraction))
            total = device.memory_total_bytes
            used = int(total * fraction) // (1 << 20) * (1 << 20)
            limit = _simulated_power_limit(device)
            reading = _device_stub(device, self.selection.cuda_index.get(device.uuid))
            reading.update(
                memory_used_bytes=used,
                memory_reserved_bytes=min(total, 512 << 20),
                utilization_percent=round(util, 1),
                temperature_c=round(32 + util * 0.45 + 2 * math.sin(0.05 * now + i), 1),
                power_w=round(60 + (limit - 60) * util / 100, 1),
                power_limit_w=limit,
                processes=[
                    {
                        "pid": os.getpid(),
                        "name": "python (simulated)",
                        "memory_used_bytes": int(used * 0.9) // (1 << 20) * (1 << 20),
                        "own": True,
                    }
                ],
            )
            gpus.append(self._scripted(_as_slice(reading) if device.mig else reading, device))
        return _snapshot(self.source, self.selection, gpus, now)

    def _scripted(self, reading: dict, device: GPUDevice) -> dict:
        """The script's utilization for this GPU, if it names it; power and temperature follow."""
        if self.script is None:
            return reading
        found, util = self.script.lookup(device)
        if not found:
            return reading
        if util is None:
            reading.update(utilization_percent=None, unsupported={"utilization_percent": "scripted: no reading"})
            return reading
        limit = reading.get("power_limit_w") or _simulated_power_limit(device)
        reading.update(
            utilization_percent=util,
            power_w=round(60 + (limit - 60) * util / 100, 1),
            temperature_c=round(32 + util * 0.45, 1),
        )
        reading["unsupported"].pop("utilization_percent", None)
        return reading

    def _idle(self, device: GPUDevice, now: float) -> dict:
        """A free GPU: no load and no processes, only the driver's reservation."""
        total = device.memory_total_bytes
        reserved = min(total, SIMULATED_DRIVER_RESERVED_BYTES)
        limit = _simulated_power_limit(device)
        reading = _device_stub(device, self.selection.cuda_index.get(device.uuid))
        reading.update(
            memory_used_bytes=reserved,
            memory_reserved_bytes=reserved,
            utilization_percent=0.0,
            temperature_c=round(30 + 1 * math.sin(0.05 * now + device.index), 1),
            power_w=round(0.1 * limit, 1),
            power_limit_w=limit,
            processes=[],
        )
        return _as_slice(reading) if device.mig else reading


def _as_slice(reading: dict) -> dict:
    """A simulated MIG slice reads as a real one does: NVML has no utilization, temperature or power per
    slice, only memory (a script may still give it a utilization, as a site's DCGM reading would)."""
    reading.update(utilization_percent=None, temperature_c=None, power_w=None, power_limit_w=None)
    reading["unsupported"] = {key: "n/a (MIG)" for key in ("utilization_percent", "temperature_c", "power_w")}
    return reading


def _simulated_power_limit(device: GPUDevice) -> float:
    return 700.0 if "H1" in device.model.upper() or "H2" in device.model.upper() else 400.0


def _snapshot(source: str, selection: Selection, gpus: list[dict], now: float | None = None) -> dict:
    state = selection.state
    message = selection.message
    if state == "ok" and gpus and all(g["state"] != "ok" for g in gpus):
        state = "error"
        message = "; ".join(sorted({g["message"] for g in gpus if g["message"]})) or "GPU not readable"
    return {
        "source": source,
        "state": state,
        "message": message,
        "timestamp": time.time() if now is None else now,
        "gpus": gpus,
    }


class NVMLSource:
    """Readings from nvidia-ml-py, initialised once and re-initialised after a lost GPU.

    ``pynvml`` may be injected for tests (a fake module with the same names).
    """

    source = "nvml"

    def __init__(self, selection: Selection, pynvml: Any = None) -> None:
        self.selection = selection
        self._pynvml = pynvml
        self._initialised = False
        self._handles: dict[str, object] = {}
        self._init_error = ""
        self._need_reinit = False

    # -- life cycle -----------------------------------------------------
    def _nvml(self) -> Any:
        if self._pynvml is None:
            import pynvml  # nvidia-ml-py

            self._pynvml = pynvml
        return self._pynvml

    def _ensure_init(self) -> bool:
        if self._initialised and not self._need_reinit:
            return True
        try:
            nvml = self._nvml()
        except ImportError as exc:  # nvidia-ml-py is not installed
            self._init_error = _nvml_error_text(exc, "NVML not available")
            return False
        try:
            if self._initialised:
                with contextlib.suppress(nvml.NVMLError):  # best effort before a re-init
                    nvml.nvmlShutdown()
                self._initialised = False
            nvml.nvmlInit()
        except nvml.NVMLError as exc:  # NVMLError_LibraryNotFound (pynvml's word for a failed load), DriverNotLoaded...
            self._init_error = _nvml_error_text(exc, "NVML not available")
            return False
        self._initialised = True
        self._need_reinit = False
        self._handles = {}
        self._init_error = ""
        return True

    def close(self) -> None:
        if self._initialised:
            nvml = self._nvml()
            with contextlib.suppress(nvml.NVMLError):  # the driver may be gone already
                nvml.nvmlShutdown()
            self._initialised = False

    def _handle(self, uuid: str) -> Any:
        handle = self._handles.get(uuid)
        if handle is None:
            nvml = self._nvml()
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid.encode() if isinstance(uuid, str) else uuid)
            self._handles[uuid] = handle
        return handle

    # -- reading --------------------------------------------------------
    def read(self) -> dict:
        if self.selection.state != "ok":
            return _snapshot(self.source if self.selection.source == "nvml" else "none", self.selection, [])
        if not self._ensure_init():
            selection = replace(self.selection, state="unavailable", message=self._init_error)
            return _snapshot(self.source, selection, [])
        gpus = [self._read_device(d) for d in self.selection.devices]
        return _snapshot(self.source, self.selection, gpus)

    def _read_device(self, device: GPUDevice) -> dict:
        nvml = self._nvml()
        reading = _device_stub(device, self.selection.cuda_index.get(device.uuid))
        try:
            handle = self._handle(device.uuid)
        except nvml.NVMLError as exc:  # not found, or lost: this GPU's reading says which
            return self._device_failed(reading, exc)

        def counter(key: str, call: Callable[[], Any], mig_reason: str = "n/a (MIG)") -> Any:
            try:
                return call()
            except nvml.NVMLError as exc:
                if _is_lost(nvml, exc):
                    raise
                reason = mig_reason if device.mig else _nvml_error_text(exc, "not supported")
                reading["unsupported"][key] = reason
                return None

        try:
            memory = counter("memory_used_bytes", lambda: _memory_info(nvml, handle))
            if memory is not None:
                reading["memory_used_bytes"] = int(memory.used)
                reading["memory_total_bytes"] = int(memory.total)
                reserved = getattr(memory, "reserved", None)
                reading["memory_reserved_bytes"] = int(reserved) if reserved is not None else None
            rates = counter("utilization_percent", lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
            if rates is not None:
                reading["utilization_percent"] = float(rates.gpu)
            reading["temperature_c"] = counter(
                "temperature_c",
                lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
                "n/a (MIG)",
            )
            power = counter("power_w", lambda: nvml.nvmlDeviceGetPowerUsage(handle))
            reading["power_w"] = round(power / 1000.0, 1) if power is not None else None
            limit = counter("power_limit_w", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle))
            reading["power_limit_w"] = round(limit / 1000.0, 1) if limit is not None else None
            processes = counter("processes", lambda: _processes(nvml, handle))
        except nvml.NVMLError as exc:
            return self._device_failed(reading, exc)
        # Counters that MIG slices never have should not read as errors.
        reading["unsupported"].pop("power_limit_w", None)
        self._attribute(reading, processes)
        return reading

    def _attribute(self, reading: dict, processes: list | None) -> None:
        """Keep the processes this server can see; say so when NVML's PIDs are not ours."""
        if processes is None:
            reading["memory_attribution"] = "device"
            reading["memory_note"] = ATTRIBUTION_NOTE
            return
        visible, foreign = [], 0
        for proc in processes:
            pid = int(proc.pid)
            info = _local_process(pid)
            if info is None:
                foreign += 1
                continue
            used = getattr(proc, "usedGpuMemory", None)
            visible.append(
                {
                    "pid": pid,
                    "name": info["name"],
                    "memory_used_bytes": int(used) if used is not None else None,
                    "own": info["own"],
                }
            )
        reading["processes"] = visible
        if foreign or (not visible and (reading["memory_used_bytes"] or 0) > (reading["memory_reserved_bytes"] or 0)):
            # Host PIDs inside a container, or another user's process: the
            # device number is real but cannot be split per process.
            reading["memory_attribution"] = "device"
            reading["memory_note"] = ATTRIBUTION_NOTE

    def _device_failed(self, reading: dict, exc: Exception) -> dict:
        nvml = self._nvml()
        if _is_lost(nvml, exc):
            reading["state"] = "lost"
            reading["message"] = "GPU lost (fell off the bus or was reset); re-initialising NVML"
            self._need_reinit = True
        else:
            reading["state"] = "error"
            reading["message"] = _nvml_error_text(exc, "NVML error")
            self._handles.pop(reading["uuid"], None)
        return reading


def _memory_info(nvml: Any, handle: Any) -> Any:
    """The v2 call (which reports reserved memory) where the driver has it, else v1."""
    version = getattr(nvml, "nvmlMemory_v2", None)
    if version is not None:
        try:
            return nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
        except TypeError:  # old nvidia-ml-py without the version argument
            pass
        except nvml.NVMLError as exc:
            if _is_lost(nvml, exc):
                raise
            # driver too old for v2, or a MIG slice: fall back to v1
    return nvml.nvmlDeviceGetMemoryInfo(handle)


def _processes(nvml: Any, handle: Any) -> list:
    found: dict[int, Any] = {}  # pid -> the driver's process record
    for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        call = getattr(nvml, name, None)
        if call is None:
            continue
        for proc in call(handle):
            found.setdefault(int(proc.pid), proc)
    return list(found.values())


def _local_process(pid: int) -> dict | None:
    """Name and ownership of a PID in our namespace, or None when we cannot see it."""
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as fh:
            name = fh.read().strip()
        own = os.stat(f"/proc/{pid}").st_uid == os.getuid()
    except OSError:
        return None
    return {"name": name, "own": own}


def _is_lost(nvml: Any, exc: Exception) -> bool:
    lost = tuple(
        cls
        for cls in (getattr(nvml, "NVMLError_GpuIsLost", None), getattr(nvml, "NVMLError_Unknown", None))
        if isinstance(cls, type)
    )
    if lost and isinstance(exc, lost):
        return True
    value = getattr(exc, "value", None)
    return value is not None and value == getattr(nvml, "NVML_ERROR_GPU_IS_LOST", object())


def _nvml_error_text(exc: Exception, fallback: str) -> str:
    if isinstance(exc, ImportError):
        return "nvidia-ml-py is not installed: GPU readings unavailable"
    text = str(exc) or exc.__class__.__name__
    if "LibraryNotFound" in exc.__class__.__name__ or "Library Not Found" in text:
        return "no NVIDIA driver found (NVML library missing)"
    if "DriverNotLoaded" in exc.__class__.__name__ or "Driver Not Loaded" in text:
        return "NVIDIA driver not loaded"
    if "LibRmVersionMismatch" in exc.__class__.__name__ or "Mismatch" in text:
        return "NVIDIA driver/library version mismatch (reboot or reload the driver)"
    return f"{fallback}: {text}"


def make_source(environ: Mapping[str, str] | None = None) -> SimulatedSource | NVMLSource:
    """The source this process should read: simulated when asked, else NVML."""
    env = os.environ if environ is None else environ
    spec = env.get("WORKBENCH_SIMULATED_GPUS", "")
    if spec.strip() not in ("", "0"):
        try:
            # On a cluster node, WORKBENCH_SIMULATED_NODE keys the UUIDs to the node.
            inventory = discover_devices(spec, env.get("WORKBENCH_SIMULATED_NODE"))
        except ValueError as exc:
            return SimulatedSource(Selection([], {}, "unavailable", str(exc), "simulated"))
        return SimulatedSource(select_devices(inventory, env), script=env.get(SCRIPT_ENV) or None)
    if "WORKBENCH_GPUS" in env and not env["WORKBENCH_GPUS"].strip():
        # CPU-only server: do not even load NVML.
        return NVMLSource(Selection([], {}, "no-gpu", NO_GPU_MESSAGE, "none"))
    inventory = discover_devices(None)
    return NVMLSource(select_devices(inventory, env))
