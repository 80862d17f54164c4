"""Turn the outputs of the scripts gpu_check.sh only calls into sections of summary.md.

python -m gpu_check.collect overhead RAWDIR            # monitor_overhead.py's stdout
python -m gpu_check.collect notebooks RAWDIR OUTDIR    # gpu_notebooks.sh's results file
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from . import DRY


def overhead(raw: Path) -> None:
    log = (raw / "overhead.log").read_text()
    text = "\n".join(line for line in log.splitlines() if not line.startswith("{"))
    args = (raw / "overhead.args").read_text().strip() if (raw / "overhead.args").exists() else ""
    (raw / "overhead.md").write_text(
        "### 2b. benchmarks/monitor_overhead.py --source nvml, 1, 10 and 50 clients\n\n"
        f"`monitor_overhead.py {args}`{' (dry run: simulated source, 1 client, short window)' if DRY else ''}\n\n"
        f"```\n{text.strip()}\n```\n"
    )


def notebooks(raw: Path, out: Path) -> None:
    found = sorted((raw / "notebooks").glob("*.md"))
    note = (
        "(dry run: only 00-environment-check, on the CPU, WORKBENCH_NOTEBOOK_QUICK=1, through a copy of the script)"
        if DRY
        else ""
    )
    lines = ["## 3. Notebooks: benchmarks/gpu_notebooks.sh", ""]
    if not found:
        lines += [f"No results file from gpu_notebooks.sh {note}; its output is in raw.tar.gz (notebooks.log)."]
    else:
        text = found[-1].read_text()
        shutil.copy2(found[-1], out / "notebooks.md")
        status = [line[3:] for line in text.splitlines() if line.startswith("## ") and line != "## Summary"]
        summary, keep = [], False
        for line in text.splitlines():
            if line == "## Summary":
                keep = True
                continue
            if keep and line.startswith("## "):
                break
            if keep:
                summary.append(line)
        lines += [
            f"`{found[-1].name}` {note}, copied whole to notebooks.md beside this file (commit it as "
            "benchmarks/results/<date>-<gpu>.md). Notebooks: " + "; ".join(status),
            "",
            *[s for s in summary if s.strip() or True],
        ]
    (raw / "notebooks.md").write_text("\n".join(lines).rstrip() + "\n")


if __name__ == "__main__":
    what, raw = sys.argv[1], Path(sys.argv[2])
    overhead(raw) if what == "overhead" else notebooks(raw, Path(sys.argv[3]))
