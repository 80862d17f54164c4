"""SIMULATED stand-in for ``torch`` in gpu_check's dry run: just enough of ``torch.cuda`` for
workbench_gpu_monitor.kernel.torch_memory() and torch.cuda.memory_stats().  Not a measurement."""

from __future__ import annotations

import sys
import types


class _Props:
    uuid = "sim-00-h200-141gb"  # torch prints UUIDs without the 'GPU-' prefix


class _Cuda:
    def __init__(self):
        self.allocated, self.reserved = 0, 0

    def is_available(self):
        return True

    def is_initialized(self):
        return True

    def device_count(self):
        return 1

    def get_device_properties(self, i):
        return _Props()

    def allocate(self, nbytes):
        self.allocated += nbytes
        self.reserved = max(self.reserved, -(-self.allocated // (2 << 20)) * (2 << 20))

    def free(self, nbytes):
        self.allocated -= nbytes

    def memory_allocated(self, i=0):
        return self.allocated

    def memory_reserved(self, i=0):
        return self.reserved

    def memory_stats(self, i=0):
        return {
            "allocated_bytes.all.current": self.allocated,
            "reserved_bytes.all.current": self.reserved,
            "allocated_bytes.all.peak": self.allocated,
            "num_alloc_retries": 0,
        }


def install():
    module = types.ModuleType("torch")
    module.__version__ = "0.0-simulated (gpu_check.fake_torch)"
    module.cuda = _Cuda()
    sys.modules["torch"] = module
    return module
