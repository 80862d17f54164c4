"""A stand-in ``pynvml`` module for tests on machines without an NVIDIA driver (every CI machine).

``fake_pynvml(count=..., **calls)`` returns a module whose functions answer like NVML's for ``count``
whole GPUs; ``calls`` replace or add functions (MIG handles, minor numbers, other UUIDs).
"""

from __future__ import annotations

import types
from types import SimpleNamespace


def fake_pynvml(count: int, **calls) -> types.ModuleType:
    fake = types.ModuleType("pynvml")
    fake.NVMLError = type("NVMLError", (Exception,), {})
    fake.NVMLError_NotFound = type("NVMLError_NotFound", (fake.NVMLError,), {})  # NVML_ERROR_NOT_FOUND
    fake.NVML_DEVICE_MIG_ENABLE = 1
    fake.nvmlInit = fake.nvmlShutdown = lambda: None
    fake.nvmlDeviceGetCount = lambda: count
    fake.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)
    fake.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3"
    fake.nvmlDeviceGetMigMode = lambda h: (0, 0)
    fake.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(total=80 << 30)
    fake.nvmlDeviceGetUUID = lambda h: "GPU-" + "-".join(map(str, h))
    for name, call in calls.items():
        setattr(fake, name, call)
    return fake
