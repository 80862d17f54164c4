"""Helpers of ``benchmarks/gpu_check.sh``: the one prepared run that checks, on a real GPU, what CI
cannot (NVML inventory and readings, the monitor against the card, the notebooks on CUDA, the
kernel's torch memory).  Each step is a module run as ``python -m gpu_check.<step> RAWDIR``; each
writes ``RAWDIR/<step>.json`` and ``RAWDIR/<step>.md`` (its section of summary.md), and
``gpu_check.summary`` stitches the sections together.  In a dry run (``GPU_CHECK_DRY=1``) the
simulated source and ``fake_nvidia_smi`` stand in for NVML and nvidia-smi.
"""

import os

DRY = os.environ.get("GPU_CHECK_DRY", "0") not in ("", "0")
DRY_BANNER = "DRY RUN — simulated, not measurements"
