"""Run ``nvidia-smi`` and parse what it prints (``-q``, ``-L``, ``--query-*`` in CSV)."""

from __future__ import annotations

import re
import subprocess

GPU_HEADER = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
KEY_VALUE = re.compile(r"^(\s*)([^:]+?)\s*:\s*(.*)$")


def run(args: list[str], timeout: float = 30, env: dict | None = None) -> tuple[int, str, str]:
    try:
        proc = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=timeout, env=env)
    except FileNotFoundError:
        return 127, "", "nvidia-smi not found on PATH"
    except subprocess.TimeoutExpired:
        return 124, "", f"nvidia-smi {' '.join(args)} timed out after {timeout} s"
    return proc.returncode, proc.stdout, proc.stderr


def parse_q(text: str) -> dict:
    """``nvidia-smi -q``: driver and CUDA versions, and per GPU a flat dict of 'Section/Key' -> value.

    Indentation gives the nesting ("FB Memory Usage" / "Total"); only the first occurrence of a
    key is kept, so a MIG device's nested "FB Memory Usage" does not overwrite the GPU's.
    """
    top: dict[str, str] = {}
    gpus: list[dict] = []
    current: dict | None = None
    stack: list[tuple[int, str]] = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("="):
            continue
        header = GPU_HEADER.match(line)
        if header:
            current = {"Bus Id": header.group(1)}
            gpus.append(current)
            stack = []
            continue
        match = KEY_VALUE.match(line)
        indent = len(line) - len(line.lstrip())
        if match is None:  # a section title without a colon ("FB Memory Usage")
            title = line.strip()
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, title))
            continue
        _, key, value = match.groups()
        if current is None:
            top.setdefault(key.strip(), value.strip())
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = "/".join([s for _, s in stack] + [key.strip()])
        current.setdefault(path, value.strip())
    return {
        "driver_version": top.get("Driver Version"),
        "cuda_version": top.get("CUDA Version"),
        "attached_gpus": top.get("Attached GPUs"),
        "gpus": gpus,
    }


def mib(value: str | None) -> float | None:
    """'143771 MiB' or '143771' -> 143771.0; '[N/A]' and friends -> None."""
    if value is None:
        return None
    m = re.match(r"^\s*([-+]?\d+(?:\.\d+)?)", value)
    return float(m.group(1)) if m else None


def q_gpu_fields(gpu: dict) -> dict:
    """The fields the inventory compares, from one GPU of :func:`parse_q`."""
    return {
        "uuid": gpu.get("GPU UUID"),
        "name": gpu.get("Product Name"),
        "memory_total_mib": mib(gpu.get("FB Memory Usage/Total")),
        "mig_mode": gpu.get("MIG Mode/Current"),
        "minor_number": gpu.get("Minor Number"),
        "bus_id": gpu.get("Bus Id"),
    }


def parse_csv(text: str, fields: list[str]) -> list[dict]:
    """``--format=csv,noheader,nounits`` rows -> dicts; '[N/A]', 'N/A', '[Not Supported]' -> None."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        values = [v.strip() for v in line.split(",")]
        row = {}
        for field, value in zip(fields, values, strict=False):  # a short line: the fields it has
            row[field] = None if value.strip("[]").lower() in ("n/a", "not supported", "unknown error", "") else value
        rows.append(row)
    return rows


def number(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def query_gpu(fields: list[str], timeout: float = 10, env: dict | None = None) -> tuple[list[dict], str]:
    rc, out, err = run([f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"], timeout, env)
    if rc != 0:
        return [], (err or out).strip() or f"nvidia-smi exited {rc}"
    return parse_csv(out, fields), ""


def parse_list(text: str) -> list[dict]:
    """``nvidia-smi -L``: GPUs and MIG devices with their UUIDs."""
    out = []
    for line in text.splitlines():
        m = re.search(r"^\s*(GPU|MIG)\s+(.*?)\s*\(UUID:\s*([^)]+)\)", line)
        if m:
            out.append({"kind": m.group(1), "label": m.group(2), "uuid": m.group(3).strip()})
    return out
