"""benchmarks/gpu_check.sh in its dry mode: every step's code runs without a GPU, the summary has
every section, and the comparisons flag differences planted in the fake nvidia-smi.

The fake nvidia-smi reports 1024 MiB more memory for simulated GPU 1 and 20 C more for GPU 0:
the inventory must flag GPU 1's memory total (and only it), the monitor GPU 0's temperature
(and not GPU 1's, nor any memory.used).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from gpu_check import inventory, smi

REPO = Path(__file__).resolve().parents[2]

BANNER = "DRY RUN — simulated, not measurements"
SECTIONS = [
    "## Steps",
    "## 1. Inventory: workbench NVML discovery against nvidia-smi -q",
    "## 2. Monitor: Sampler (NVML source) against nvidia-smi --query-gpu",
    "### 2b. benchmarks/monitor_overhead.py --source nvml, 1, 10 and 50 clients",
    "### 2c. jupyterlab-nvdashboard beside it",
    "## 3. Notebooks: benchmarks/gpu_notebooks.sh",
    "## 4. Per-kernel torch memory: kernel.py against torch.cuda.memory_stats()",
    "## Targets",
]


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    env = dict(
        os.environ,
        PYTHON=sys.executable,
        GPU_CHECK_FAKE_SMI_PLANT="memory_total@1+1024,temperature@0+20",
        WORKBENCH_SIMULATED_GPUS="2xH200-141GB",
    )
    env.pop("OUT", None)
    proc = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--dry-run", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    raw = out / "unpacked"
    with tarfile.open(out / "raw.tar.gz") as tar:
        tar.extractall(raw, filter="data")
    return out, raw / "raw", proc.stdout


def jsn(raw: Path, name: str) -> dict:
    return json.loads((raw / f"{name}.json").read_text())


def section(summary: str, title: str) -> str:
    start = summary.index(title) + len(title)
    nxt = [i for i in (summary.find("\n## ", start), summary.find("\n### ", start)) if i != -1]
    return summary[start : min(nxt) if nxt else len(summary)]


def test_summary_is_marked_dry_and_has_every_section(dry):
    out, _raw, _ = dry
    summary = (out / "summary.md").read_text()
    assert summary.startswith(f"# {BANNER}")
    for title in SECTIONS:
        assert title in summary, title
        assert "Not reported" not in section(summary, title), title


def test_every_step_ran_and_exited_zero(dry):
    _out, raw, _ = dry
    steps = [line.split("\t") for line in (raw / "steps.tsv").read_text().splitlines()]
    assert [s[0] for s in steps] == [
        "versions",
        "inventory",
        "kernel_memory",
        "monitor",
        "overhead",
        "nvdashboard",
        "notebooks",
    ]
    assert all(s[1] == "0" for s in steps), steps


def test_out_fits_what_the_device_tool_brings_back(dry):
    out, _raw, _ = dry
    files = sorted(p.name for p in out.iterdir() if p.is_file())
    assert files == ["notebooks.md", "raw.tar.gz", "run.log", "summary.md"]


def test_inventory_flags_the_planted_memory_total_and_nothing_else(dry):
    out, raw, _ = dry
    diffs = jsn(raw, "inventory")["differences"]
    assert [(d["gpu"], d["field"]) for d in diffs] == [(1, "memory total (MiB)")]
    assert diffs[0]["nvidia_smi"] - diffs[0]["nvml"] == pytest.approx(1024)
    text = section((out / "summary.md").read_text(), SECTIONS[1])
    assert "| 1 | memory total (MiB) | 144384.0 | 145408.0 | **DIFFERENCE** |" in text
    assert "| 0 | memory total (MiB) | 144384.0 | 144384.0 | yes |" in text


def test_monitor_flags_the_planted_temperature_only(dry):
    _out, raw, _ = dry
    mon = jsn(raw, "monitor")
    diffs = mon["differences"]
    assert diffs, "planted temperature offset not reported"
    assert all("GPU 0 temperature.gpu" in d for d in diffs), diffs
    assert {d.split()[0] for d in diffs} == {"load", "idle"}
    assert mon["load"]["device"] == "cpu"
    assert mon["load"]["products"] > 0


def test_kernel_memory_and_overhead_ran(dry):
    out, raw, _ = dry
    km = jsn(raw, "kernel_memory")
    assert km["differences"] == []
    assert {r["where"] for r in km["rows"]} == {"in process", "ipykernel, control channel"}
    summary = (out / "summary.md").read_text()
    assert "server CPU s/min" in section(summary, SECTIONS[3])
    assert "00-environment-check" in section(summary, SECTIONS[5])


def test_compare_flags_each_field():
    nvml = [{"uuid": "GPU-a", "index": 0, "name": "NVIDIA H200", "memory_total_mib": 143771.0, "mig": False}]
    same = [{"uuid": "GPU-a", "name": "NVIDIA H200", "memory_total_mib": 143771.0, "mig_mode": "Disabled"}]
    assert all(r["agree"] for r in inventory.compare(nvml, same))
    for field, value, row in [
        ("uuid", "GPU-b", "uuid"),
        ("name", "NVIDIA H100", "name"),
        ("memory_total_mib", 143000.0, "memory total (MiB)"),
        ("mig_mode", "Enabled", "mig mode"),
    ]:
        rows = inventory.compare(nvml, [dict(same[0], **{field: value})])
        assert [r["field"] for r in rows if not r["agree"]] == [row], field
    assert [r["field"] for r in inventory.compare(nvml, same + same) if not r["agree"]] == ["present"]


REAL_Q = """
==============NVSMI LOG==============

Timestamp                                 : Thu Dec  3 10:00:00 2026
Driver Version                            : 580.159.04
CUDA Version                              : 13.0

Attached GPUs                             : 1
GPU 00000000:00:07.0
    Product Name                          : NVIDIA H200
    MIG Mode
        Current                           : Disabled
        Pending                           : Disabled
    GPU UUID                              : GPU-5ad1a4f0-0000-1111-2222-333344445555
    FB Memory Usage
        Total                             : 143771 MiB
        Reserved                          : 551 MiB
        Used                              : 0 MiB
    BAR1 Memory Usage
        Total                             : 262144 MiB
"""


def test_parse_q_reads_the_real_format():
    parsed = smi.parse_q(REAL_Q)
    assert (parsed["driver_version"], parsed["cuda_version"]) == ("580.159.04", "13.0")
    assert smi.q_gpu_fields(parsed["gpus"][0]) == {
        "uuid": "GPU-5ad1a4f0-0000-1111-2222-333344445555",
        "name": "NVIDIA H200",
        "memory_total_mib": 143771.0,
        "mig_mode": "Disabled",
        "minor_number": None,
        "bus_id": "00000000:00:07.0",
    }
    assert smi.parse_csv("87, 4821, 41, [N/A]\n", ["u", "m", "t", "p"]) == [
        {"u": "87", "m": "4821", "t": "41", "p": None}
    ]
