"""``GPUMonitor``: the live GPU numbers inside a notebook, as an ipywidgets widget.

Where the numbers come from, and why: the server extension's sampler writes
each sample to a small JSON file whose path it passes to kernels in
``WORKBENCH_GPU_MONITOR_SNAPSHOT``.  The widget reads that file, so it shows
exactly what the status bar shows and a kernel adds no NVML calls (ten
widgets in ten notebooks still mean one sampler per server).  A kernel not
started by a monitored server (plain ``jupyter console``, VS Code) has no such
file; then the widget runs its own ``Sampler`` on the same sources.

Why it keeps updating while a training cell runs: a daemon thread in the
kernel sets the widget's ``value`` trait once per interval.  ipykernel sends
comm messages from any thread through its IOPub thread, so updates reach the
browser while the shell thread is busy with the cell.  ``stop()`` (or closing
the widget) ends the thread.
"""

from __future__ import annotations

import html
import json
import os
import threading
import time

import ipywidgets as widgets

from workbench_devices import make_source

from .kernel import register as register_kernel_handler
from .kernel import torch_memory
from .sampler import MIN_INTERVAL_SECONDS, SNAPSHOT_ENV, Sampler

_GIB = 1024**3


def _gib(value) -> str:
    return "n/a" if value is None else f"{value / _GIB:.1f}"


def render_html(sample: dict, torch_mem: list[dict] | None = None) -> str:
    """The widget's HTML for one sample (a plain function, easy to test)."""
    source = sample.get("source", "none")
    label = " <b>(simulated)</b>" if source == "simulated" else ""
    rows = []
    torch_by_index = {t["cuda_index"]: t for t in (torch_mem or [])}
    for gpu in sample.get("gpus", []):
        used, total = gpu.get("memory_used_bytes"), gpu.get("memory_total_bytes")
        frac = (used or 0) / total if total else 0
        colour = "#d32f2f" if frac > 0.9 else "#1976d2"
        util = gpu.get("utilization_percent")
        util_text = (
            f"{util:.0f}%"
            if util is not None
            else html.escape(gpu.get("unsupported", {}).get("utilization_percent", "n/a"))
        )
        extra = ""
        t = torch_by_index.get(gpu.get("cuda_index"))
        if t:
            extra = f" · torch {_gib(t['allocated_bytes'])} allocated / {_gib(t['reserved_bytes'])} reserved GiB"
        if gpu.get("memory_note"):
            extra += f" · <i>{html.escape(gpu['memory_note'])}</i>"
        if gpu.get("state") != "ok":
            extra += f" · <b>{html.escape(gpu.get('message', ''))}</b>"
        temp = gpu.get("temperature_c")
        power = gpu.get("power_w")
        rows.append(
            "<div style='margin:2px 0'>"
            f"<code>cuda:{gpu.get('cuda_index')}</code> {html.escape(gpu.get('name', ''))}: "
            f"util <b class='gpu-util'>{util_text}</b>, "
            f"memory <b class='gpu-mem' style='color:{colour}'>{_gib(used)} / {_gib(total)} GiB</b>"
            f"{'' if temp is None else f', {temp:.0f} °C'}{'' if power is None else f', {power:.0f} W'}{extra}"
            f"<div style='background:#eee;height:6px;width:240px'><div style='background:{colour};height:6px;"
            f"width:{min(100, frac * 100):.0f}%'></div></div></div>"
        )
    if not rows:
        rows.append(f"<div>{html.escape(sample.get('message') or 'no GPU data')}</div>")
    stamp = time.strftime("%H:%M:%S", time.localtime(sample.get("timestamp", time.time())))
    return f"<div class='workbench-gpu-widget'><div>GPU monitor{label} · {stamp}</div>{''.join(rows)}</div>"


def _read(path: str, sampler) -> dict:
    if sampler is not None:
        return sampler.sample_once()
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError) as exc:
        return {"source": "none", "state": "error", "message": f"monitor snapshot unreadable: {exc}", "gpus": []}


class GPUMonitor(widgets.HTML):
    """Live GPU utilization and memory in a notebook cell.

    ``GPUMonitor(interval=1.0)``; ``.stop()`` ends the updates.  ``.sample``
    holds the last reading as a dict.
    """

    def __init__(self, interval: float = 1.0, snapshot_path: str | None = None, **kwargs):
        interval = max(float(interval), MIN_INTERVAL_SECONDS)
        path = snapshot_path or os.environ.get(SNAPSHOT_ENV) or ""
        from_server = bool(path) and os.path.exists(path)
        sampler = None if from_server else Sampler(make_source(), interval, 1)
        first = _read(path, sampler)
        # The first reading goes into the model's initial state: the widget
        # shows numbers as soon as it is displayed.
        super().__init__(value=render_html(first, torch_memory()), **kwargs)
        self.interval = interval
        self.snapshot_path = path
        self.data_source = "server" if from_server else "kernel"
        self._sampler = sampler
        self.sample: dict = first
        self.updates = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-monitor-widget", daemon=True)
        self._thread.start()
        register_kernel_handler()  # the side panel can now ask this kernel for torch memory

    def read(self) -> dict:
        return _read(self.snapshot_path, self._sampler)

    def refresh(self) -> None:
        self.sample = self.read()
        self.value = render_html(self.sample, torch_memory())
        self.updates += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - a closed comm during shutdown
                break

    def stop(self) -> None:
        self._stop.set()

    def close(self):
        self.stop()
        super().close()
