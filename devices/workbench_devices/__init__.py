"""The GPU inventory of GPU Workbench: which GPUs exist, which are this server's, what they read.

The hub (to hand GPUs out) and every user server (to show them) need one
answer to "which GPUs are there", and the hub image must not build a
JupyterLab extension to get it: so this is a small pure-Python package with
nothing but nvidia-ml-py underneath, installed on both sides.

* ``inventory``: discovery (NVML, or the simulated fleet of
  ``WORKBENCH_SIMULATED_GPUS``);
* ``selection``: which of those belong to this server (``WORKBENCH_GPUS``,
  else ``CUDA_VISIBLE_DEVICES``) and their CUDA ordinals;
* ``sources``: one reading of the selected GPUs, from NVML or simulated;
* ``scripted``: utilization a test or demo scripts for simulated GPUs
  (``WORKBENCH_SIMULATED_UTILIZATION``).
"""

from .inventory import (
    SIMULATED_UUID_PREFIX,
    DeviceInventory,
    DeviceSpecError,
    GPUDevice,
    discover_devices,
    nvml_devices,
    nvml_read,
    parse_simulated_spec,
    simulated_node_key,
    simulated_spec_text,
)
from .scripted import SCRIPT_ENV, ScriptedUtilization
from .selection import Selection, select_devices
from .sources import NVMLSource, SimulatedSource, make_source

__version__ = "0.1.0"

__all__ = [
    "SCRIPT_ENV",
    "SIMULATED_UUID_PREFIX",
    "DeviceInventory",
    "DeviceSpecError",
    "GPUDevice",
    "NVMLSource",
    "ScriptedUtilization",
    "Selection",
    "SimulatedSource",
    "discover_devices",
    "make_source",
    "nvml_devices",
    "nvml_read",
    "parse_simulated_spec",
    "select_devices",
    "simulated_node_key",
    "simulated_spec_text",
]
