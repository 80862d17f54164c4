"""One sampler thread per server, so the cost of GPU readings does not grow with open tabs.

The readings themselves come from ``workbench_devices`` (shared with the hub);
what is the monitor's own is the schedule: ``Sampler`` reads one source in one
daemon thread at a fixed interval, keeps ten minutes of history, and hands
each sample to listeners.  Clients only ever read the last sample.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

MIN_INTERVAL_SECONDS = 0.25
# Path of the server's latest sample, exported to kernels (see handlers.py, widget.py).
SNAPSHOT_ENV = "WORKBENCH_GPU_MONITOR_SNAPSHOT"


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
            maxlen=max(1, math.ceil(history_seconds / self.interval))
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
        except Exception as exc:  # a sampler must never die: logged with its traceback, and shown
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
            except Exception:  # one listener's failure is logged; the others still get the sample
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
                {
                    "timestamp": [],
                    "utilization_percent": [],
                    "memory_used_bytes": [],
                    "temperature_c": [],
                    "power_w": [],
                },
            )
            series["timestamp"].append(round(ts, 3))
            for key in ("utilization_percent", "memory_used_bytes", "temperature_c", "power_w"):
                series[key].append(gpu.get(key))
    return out
