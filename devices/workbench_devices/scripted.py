"""Scripted utilization for simulated GPUs: a test or a demo decides what a GPU reads.

Set ``WORKBENCH_SIMULATED_UTILIZATION`` to the path of a JSON file (the hub
passes it on to the workbench service and to user servers, so every reader
agrees). The simulated source reads it again whenever the file changes.
"""

from __future__ import annotations

import json
import math
import os

from .inventory import GPUDevice

SCRIPT_ENV = "WORKBENCH_SIMULATED_UTILIZATION"


class ScriptedUtilization:
    """Utilization per simulated GPU from a JSON file, read again when it changes.

    The file is one JSON object; keys are GPU UUIDs (``GPU-sim-00-h100-80gb``),
    device indexes as strings (``"0"``), or ``"*"`` for every other GPU;
    values are a percentage (0 to 100) or ``null`` for "no reading" (the
    monitor then reports ``utilization_percent: null``). GPUs it does not name
    keep the made-up load. Example: ``{"GPU-sim-00-h100-80gb": 0, "*": 80}``.
    A file that is missing or not valid JSON scripts nothing (made-up load
    everywhere), so a test can write it at any moment; writes should be
    atomic (write a temporary file, then rename it).
    """

    def __init__(self, path: str):
        self.path = path
        self._stamp: tuple | None = None
        self._table: dict[str, float | None] = {}

    def table(self) -> dict[str, float | None]:
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            self._stamp, self._table = None, {}
            return self._table
        if stamp != self._stamp:
            self._stamp, self._table = stamp, _parse_script(self.path)
        return self._table

    def lookup(self, device: GPUDevice) -> tuple[bool, float | None]:
        table = self.table()
        for key in (device.uuid, str(device.index), "*"):
            if key in table:
                return True, table[key]
        return False, None


def _parse_script(path: str) -> dict[str, float | None]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    table: dict[str, float | None] = {}
    for key, value in data.items():
        if value is None:
            table[str(key)] = None
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            table[str(key)] = float(max(0.0, min(100.0, value)))
    return table
