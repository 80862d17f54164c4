"""Step 0: the machine and the versions, for summary.md's head."""

from __future__ import annotations

import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version

from . import DRY, smi
from .report import raw_dir, write

PACKAGES = [
    "torch",
    "nvidia-ml-py",
    "jupyter_server",
    "jupyter_client",
    "ipykernel",
    "nbclient",
    "nbformat",
    "tornado",
    "pyzmq",
    "jupyterlab-nvdashboard",
    "workbench-devices",
]


def main() -> None:
    raw = raw_dir()
    info = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "packages": {},
    }
    for name in PACKAGES:
        try:
            info["packages"][name] = version(name)
        except PackageNotFoundError:
            info["packages"][name] = None
    try:
        if DRY:
            raise ImportError("dry run: torch.cuda not asked")
        import torch

        info.update(
            torch=torch.__version__,
            torch_cuda=torch.version.cuda,
            cuda_available=torch.cuda.is_available(),
            device_count=torch.cuda.device_count(),
            devices=[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        )
    except Exception as exc:  # noqa: BLE001 - torch missing or its CUDA unusable, in any of its ways: the report says which
        info["torch_note"] = str(exc)
    rows, err = smi.query_gpu(["name", "driver_version", "memory.total"])
    info["nvidia_smi"] = rows or err
    _rc, plain, _ = smi.run([])
    (raw / "nvidia-smi.txt").write_text(plain)
    try:
        with open("/proc/meminfo") as fh:
            info["mem_total_kib"] = int(fh.readline().split()[1])
    except OSError:
        pass
    write(raw, "versions", info, [f"versions: {info}"])


if __name__ == "__main__":
    main()
