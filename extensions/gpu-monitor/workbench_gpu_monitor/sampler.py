"""Readings of this server's own GPUs: which devices, and one sampler thread.

Three pieces, all independent of Jupyter so the kernel widget and the
benchmark can use them too:

* ``select_devices`` decides which GPUs belong to this server
  (``WORKBENCH_GPUS``, else ``CUDA_VISIBLE_DEVICES``, else every device) and
  maps each one to the CUDA ordinal that the user's PyTorch will see.
* ``SimulatedSource`` / ``NVMLSource`` turn those devices into one reading
  (a plain dict, the JSON shape pinned in DESIGN.md).  NVML errors are caught
  per device and per counter: a MIG slice without utilization counters gives
  ``null`` plus a reason, a lost GPU gives ``"state": "lost"`` and the source
  re-initialises NVML on the next tick, a missing library gives a readable
  ``"state": "unavailable"`` snapshot.  Nothing here raises to the caller.
* ``Sampler`` runs one source in one daemon thread at a fixed interval, keeps
  ten minutes of history, and hands each sample to listeners.  Clients only
  ever read the last sample, so the cost does not grow with open tabs.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Mapping

from .devices import DeviceInventory, GPUDevice, discover_devices

log = logging.getLogger(__name__)

MIN_INTERVAL_SECONDS = 0.25
NO_GPU_MESSAGE = "no GPU assigned"
ATTRIBUTION_NOTE = "device total, may include other processes"
# Path of the server's latest sample, exported to kernels (see handlers.py, widget.py).
SNAPSHOT_ENV = "WORKBENCH_GPU_MONITOR_SNAPSHOT"


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


def _device_stub(device: GPUDevice, cuda_index: int | None) -> dict:
    return {
        "uuid": device.uuid,
        "name": device.name,
        "index": device.index,
        "cuda_index": cuda_index,
        "mig": device.mig,
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


class SimulatedSource:
    """Made-up but deterministic readings: a function of the wall clock and device index.

    Two servers (or a server and a kernel) looking at the same simulated GPU at
    the same second see the same numbers, and numbers change every second so a
    browser test can watch them move.
    """

    source = "simulated"

    def __init__(self, selection: Selection, clock: Callable[[], float] = time.time):
        self.selection = selection
        self.clock = clock

    def read(self) -> dict:
        now = self.clock()
        gpus = []
        for device in self.selection.devices:
            i = device.index
            util = 55 + 35 * math.sin(0.21 * now + 1.3 * i) + 9 * math.sin(1.7 * now + 2.1 * i)
            util = max(0.0, min(100.0, util))
            fraction = 0.45 + 0.3 * math.sin(0.037 * now + 0.9 * i) + 0.02 * math.sin(0.9 * now + i)
            fraction = max(0.02, min(0.97, fraction))
            total = device.memory_total_bytes
            used = int(total * fraction) // (1 << 20) * (1 << 20)
            limit = 700.0 if "H1" in device.model.upper() or "H2" in device.model.upper() else 400.0
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
            gpus.append(reading)
        return _snapshot(self.source, self.selection, gpus, now)


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

    def __init__(self, selection: Selection, pynvml=None):
        self.selection = selection
        self._pynvml = pynvml
        self._initialised = False
        self._handles: dict[str, object] = {}
        self._init_error = ""
        self._need_reinit = False

    # -- life cycle -----------------------------------------------------
    def _nvml(self):
        if self._pynvml is None:
            import pynvml  # nvidia-ml-py

            self._pynvml = pynvml
        return self._pynvml

    def _ensure_init(self) -> bool:
        if self._initialised and not self._need_reinit:
            return True
        try:
            nvml = self._nvml()
            if self._initialised:
                try:
                    nvml.nvmlShutdown()
                except Exception:  # noqa: BLE001 - best effort before a re-init
                    pass
                self._initialised = False
            nvml.nvmlInit()
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded...
            self._init_error = _nvml_error_text(exc, "NVML not available")
            return False
        self._initialised = True
        self._need_reinit = False
        self._handles = {}
        self._init_error = ""
        return True

    def close(self) -> None:
        if self._initialised:
            try:
                self._nvml().nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
            self._initialised = False

    def _handle(self, uuid: str):
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
        except Exception as exc:  # noqa: BLE001
            return self._device_failed(reading, exc)

        def counter(key: str, call: Callable[[], object], mig_reason: str = "n/a (MIG)"):
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


def _memory_info(nvml, handle):
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


def _processes(nvml, handle) -> list:
    found = {}
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


def _is_lost(nvml, exc: Exception) -> bool:
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


def make_source(environ: Mapping[str, str] | None = None):
    """The source this process should read: simulated when asked, else NVML."""
    env = os.environ if environ is None else environ
    spec = env.get("WORKBENCH_SIMULATED_GPUS", "")
    if spec.strip() not in ("", "0"):
        try:
            inventory = discover_devices(spec)
        except ValueError as exc:
            return SimulatedSource(Selection([], {}, "unavailable", str(exc), "simulated"))
        return SimulatedSource(select_devices(inventory, env))
    if "WORKBENCH_GPUS" in env and not env["WORKBENCH_GPUS"].strip():
        # CPU-only server: do not even load NVML.
        return NVMLSource(Selection([], {}, "no-gpu", NO_GPU_MESSAGE, "none"))
    inventory = discover_devices(None)
    return NVMLSource(select_devices(inventory, env))


Listener = Callable[[dict], None]


class Sampler:
    """One background thread reading one source at a fixed interval.

    ``latest`` is the last sample; ``history`` the last ``history_seconds``.
    Listeners are called from the sampler thread: they must be quick and
    thread-safe (the server extension hands the sample to the event loop).
    """

    def __init__(self, source, interval: float = 1.0, history_seconds: float = 600.0):
        self.source = source
        self.interval = max(float(interval), MIN_INTERVAL_SECONDS)
        self.history: collections.deque[dict] = collections.deque(
            maxlen=max(1, int(math.ceil(history_seconds / self.interval)))
        )
        self.latest: dict | None = None
        self.samples_taken = 0
        self.last_duration = 0.0
        self._listeners: list[Listener] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def sample_once(self) -> dict:
        started = time.perf_counter()
        try:
            sample = self.source.read()
        except Exception as exc:  # noqa: BLE001 - a sampler must never die
            log.exception("GPU sampler failed")
            sample = {
                "source": getattr(self.source, "source", "none"),
                "state": "error",
                "message": f"sampler error: {exc}",
                "timestamp": time.time(),
                "gpus": [],
            }
        self.last_duration = time.perf_counter() - started
        sample["interval_seconds"] = self.interval
        with self._lock:
            self.latest = sample
            self.history.append(sample)
            self.samples_taken += 1
        for listener in list(self._listeners):
            try:
                listener(sample)
            except Exception:  # noqa: BLE001
                log.exception("GPU sample listener failed")
        return sample

    def history_since(self, since: float = 0.0) -> list[dict]:
        with self._lock:
            return [s for s in self.history if s["timestamp"] > since]

    def start(self) -> None:
        if self._thread is not None:
            return
        self.sample_once()
        self._thread = threading.Thread(target=self._run, name="gpu-monitor-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_at = time.monotonic() + self.interval
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            self.sample_once()
            next_at += self.interval
            if next_at < time.monotonic():  # fell behind (suspended laptop): skip, do not burst
                next_at = time.monotonic() + self.interval

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        close = getattr(self.source, "close", None)
        if close:
            close()


def compact_history(samples: Iterable[dict]) -> dict:
    """History as per-GPU arrays, small enough to send on panel open."""
    out: dict[str, dict[str, list]] = {}
    for sample in samples:
        ts = sample["timestamp"]
        for gpu in sample.get("gpus", []):
            series = out.setdefault(
                gpu["uuid"],
                {"timestamp": [], "utilization_percent": [], "memory_used_bytes": [], "temperature_c": [], "power_w": []},
            )
            series["timestamp"].append(round(ts, 3))
            for key in ("utilization_percent", "memory_used_bytes", "temperature_c", "power_w"):
                series[key].append(gpu.get(key))
    return out
