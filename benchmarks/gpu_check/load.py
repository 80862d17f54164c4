"""The matmul load of step 2: ``python -m gpu_check.load SECONDS DEVICE`` (cuda or cpu).

Prints ``READY <pid>`` once its tensors are on the device (so the monitor step knows when load
starts), then one JSON line with what it achieved.  On CUDA: bf16 8192^3 products plus a 4 GiB
buffer, so both utilization and memory used move; on a CPU (dry run) small fp32 products.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch


def main() -> None:
    seconds, device = float(sys.argv[1]), sys.argv[2]
    if device == "cuda":
        n, dtype, extra = 8192, torch.bfloat16, torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    else:
        n, dtype, extra = 256, torch.float32, None
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    c = a @ b
    if device == "cuda":
        torch.cuda.synchronize()
    print(f"READY {os.getpid()}", flush=True)
    t0, products = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        for _ in range(50):
            c = a @ b
        products += 50
        if device == "cuda":
            torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "device": device,
                "n": n,
                "dtype": str(dtype),
                "products": products,
                "seconds": elapsed,
                "tflops": 2 * n**3 * products / elapsed / 1e12,
                "extra_buffer_bytes": 0 if extra is None else extra.numel(),
                "torch": torch.__version__,
            }
        ),
        flush=True,
    )
    del c


if __name__ == "__main__":
    main()
