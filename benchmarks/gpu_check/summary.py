"""Stitch the steps' sections into summary.md, in the shape of a benchmarks/results file.

    python -m gpu_check.summary RAWDIR OUTFILE

Run after every step, so that summary.md holds what finished even if a later step is killed.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

from . import DRY, DRY_BANNER

SECTIONS = [  # (step as in steps.tsv, its .md, title used when it did not finish)
    ("inventory", "inventory.md", "## 1. Inventory: workbench NVML discovery against nvidia-smi -q"),
    ("monitor", "monitor.md", "## 2. Monitor: Sampler (NVML source) against nvidia-smi --query-gpu"),
    ("overhead", "overhead.md", "### 2b. benchmarks/monitor_overhead.py --source nvml, 1, 10 and 50 clients"),
    ("nvdashboard", "nvdashboard.md", "### 2c. jupyterlab-nvdashboard beside it"),
    ("notebooks", "notebooks.md", "## 3. Notebooks: benchmarks/gpu_notebooks.sh"),
    ("kernel_memory", "kernel_memory.md", "## 4. Per-kernel torch memory: kernel.py against torch.cuda.memory_stats()"),
]
TARGETS = (
    "Targets (issue 15; report, do not tune): compile >= 1.3x over eager on the notebook's model; AMP bf16 >= 2x "
    "over fp32 with >= 30 % less peak memory; matmul >= 70 % of peak (about 790 TFLOP/s dense bf16 measured on "
    "this machine kind)."
)


def load(raw: Path, name: str) -> dict:
    try:
        return json.loads((raw / name).read_text())
    except (OSError, ValueError):
        return {}


def steps(raw: Path) -> dict[str, dict]:
    out = {}
    try:
        for line in (raw / "steps.tsv").read_text().splitlines():
            name, rc, seconds, limit, note = (line.split("\t") + [""] * 5)[:5]
            out[name] = {"rc": rc, "seconds": seconds, "limit": limit, "note": note}
    except OSError:
        pass
    return out


def main() -> None:
    raw, out = Path(sys.argv[1]), Path(sys.argv[2])
    v, inv, st = load(raw, "versions.json"), load(raw, "inventory.json"), steps(raw)
    smi_rows = v.get("nvidia_smi") if isinstance(v.get("nvidia_smi"), list) else []
    gpu = smi_rows[0].get("name") if smi_rows else (v.get("devices") or ["?"])[0]
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    pk = v.get("packages", {})
    lines = []
    if DRY:
        lines += [
            f"# {DRY_BANNER}",
            "",
            f"**{DRY_BANNER}.** Produced by `benchmarks/gpu_check.sh --dry-run`: the simulated source stands "
            "in for NVML, "
            "`benchmarks/gpu_check/fake_nvidia_smi.py` for nvidia-smi, `gpu_check.fake_torch` for torch.cuda, and the "
            "matmul ran on the CPU. It shows that every step's code runs; no figure below describes a GPU.",
            "",
        ]
    else:
        lines += [f"# GPU check on {gpu}, {date}", ""]
    lines += (
        [
            f"Machine: {len(smi_rows) or '?'} x {gpu}, {v.get('cpus')} CPUs, "
            f"{round(v.get('mem_total_kib', 0) / 2**20, 1)} GiB RAM (MemTotal at start), {v.get('platform')}.",
            f"Driver {inv.get('driver_version') or (smi_rows[0].get('driver_version') if smi_rows else '?')}, "
            f"CUDA {inv.get('cuda_version') or '?'} (nvidia-smi); PyTorch {v.get('torch') or pk.get('torch')} "
            f"(CUDA {v.get('torch_cuda')}, sees {v.get('device_count')} GPU(s)); Python {v.get('python')}; "
            f"nvidia-ml-py {pk.get('nvidia-ml-py')}, jupyter_server {pk.get('jupyter_server')}, ipykernel "
            f"{pk.get('ipykernel')}, "
            f"nbclient {pk.get('nbclient')}, jupyterlab-nvdashboard {pk.get('jupyterlab-nvdashboard')}.",
            f"Produced by `benchmarks/gpu_check.sh` (date UTC {date}); raw outputs in raw.tar.gz beside this file.",
            "",
            "## Steps",
            "",
            "| step | exit | seconds | time box (s) | note |",
            "| --- | --- | --- | --- | --- |",
        ]
        + [f"| {k} | {s['rc']} | {s['seconds']} | {s['limit']} | {s['note']} |" for k, s in st.items()]
        + [""]
    )
    for step, md, title in SECTIONS:
        path = raw / md
        if path.exists():
            lines += [path.read_text().rstrip(), ""]
        else:
            s = st.get(step)
            why = (
                "not run yet"
                if s is None
                else f"did not finish (exit {s['rc']}, {s['note'] or 'see its log in raw.tar.gz'})"
            )
            lines += [title, "", f"Not reported: {why}.", ""]
    lines += ["## Targets", "", TARGETS, ""]
    text = "\n".join(lines)
    if DRY:
        text += f"\n{DRY_BANNER}.\n"
    out.write_text(text)


if __name__ == "__main__":
    main()
