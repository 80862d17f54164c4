"""The kernel side: PyTorch's view of GPU memory, answered over the control channel.

NVML sees what the driver gave a process; PyTorch users think in
``torch.cuda.memory_allocated`` (live tensors) and ``memory_reserved`` (what
the caching allocator holds).  The gap explains "why does the card show more
than my tensors".  Only the kernel can answer, so the JupyterLab panel asks it
with a ``workbench_gpu_request`` message on the *control* channel: the
control thread replies even while a training cell keeps the shell busy, and
no code is executed in the user's namespace.

The handler is registered by ``%load_ext workbench_gpu_monitor`` or by
creating a ``GPUMonitor`` widget.  It never imports torch and never
initialises CUDA: a kernel that has not used CUDA reports that.
"""

from __future__ import annotations

import os
import sys

REQUEST = "workbench_gpu_request"
REPLY = "workbench_gpu_reply"


def torch_memory() -> list[dict]:
    """Allocated / reserved bytes per CUDA device, if this process already uses torch.cuda."""
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return []
        out = []
        for i in range(torch.cuda.device_count()):
            entry: dict[str, object] = {
                "cuda_index": i,
                "allocated_bytes": int(torch.cuda.memory_allocated(i)),
                "reserved_bytes": int(torch.cuda.memory_reserved(i)),
            }
            uuid = getattr(torch.cuda.get_device_properties(i), "uuid", None)
            if uuid is not None:
                entry["uuid"] = uuid if str(uuid).startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
            out.append(entry)
        return out
    except Exception:  # noqa: BLE001 - never break a notebook for a display
        return []


def report() -> dict:
    torch = sys.modules.get("torch")
    return {
        "pid": os.getpid(),
        "torch_imported": torch is not None,
        "torch_version": getattr(torch, "__version__", None) if torch is not None else None,
        "devices": torch_memory(),
    }


def register(kernel=None) -> bool:
    """Install the control-channel handler in this ipykernel; False outside a kernel."""
    if kernel is None:
        try:
            from ipykernel.kernelbase import Kernel
        except ImportError:
            return False
        if not Kernel.initialized():
            return False
        kernel = Kernel.instance()
    handlers = getattr(kernel, "control_handlers", None)
    if handlers is None:
        return False
    if REQUEST not in handlers:

        def handle(stream, ident, parent):
            kernel.session.send(stream, REPLY, report(), parent, ident)

        handlers[REQUEST] = handle
    return True


def load_ipython_extension(ipython) -> None:
    register(getattr(ipython, "kernel", None))
