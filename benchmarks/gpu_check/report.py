"""What every step shares: where its files go, how it says what it did."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from . import DRY


def raw_dir() -> Path:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    path.mkdir(parents=True, exist_ok=True)
    return path


def write(raw: Path, step: str, data: dict, lines: list[str]) -> None:
    data = {"step": step, "dry_run": DRY, "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **data}
    (raw / f"{step}.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    (raw / f"{step}.md").write_text("\n".join(lines).rstrip() + "\n")
    print("\n".join(lines), flush=True)


def table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    for r in rows:
        out.append("| " + " | ".join("" if v is None else str(v) for v in r) + " |")
    return out


def fmt(value, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)
