"""Step 1: the workbench's NVML discovery next to ``nvidia-smi -q``, field by field.

Fields: UUID, name, memory total (MiB), MIG mode.  GPUs are paired by NVML index (the order
nvidia-smi lists them in); a GPU only one side lists is a difference too.
"""

from __future__ import annotations

import os

from . import DRY, smi
from .report import raw_dir, table, write

MEMORY_TOLERANCE_MIB = 1.0


def workbench_side() -> tuple[list[dict], str, str]:
    """(devices, discovery source, discovery message)."""
    import workbench_devices as wd

    if DRY:
        inv = wd.discover_devices(os.environ.get("WORKBENCH_SIMULATED_GPUS") or "1xH200-141GB")
        devices = inv.devices
    else:
        devices = wd.nvml_devices()  # raises if NVML cannot start: the step fails loudly
        inv = wd.discover_devices(None)  # the hub's and monitor's view, with its message
    return (
        [
            {
                "uuid": d.uuid,
                "index": d.index,
                "name": d.name,
                "memory_total_mib": d.memory_total_bytes / 2**20,
                "mig": d.mig,
                "model": d.model,
            }
            for d in devices
        ],
        inv.source,
        inv.message,
    )


def compare(nvml: list[dict], smi_gpus: list[dict]) -> list[dict]:
    """One row per (GPU, field): both values and whether they agree."""
    rows = []
    by_index: dict[int, list[dict]] = {}
    for d in nvml:
        by_index.setdefault(d["index"], []).append(d)
    for i, s in enumerate(smi_gpus):
        devices = by_index.pop(i, [])
        mig_on = (s.get("mig_mode") or "").lower() == "enabled"
        whole = [d for d in devices if not d["mig"]]
        d = whole[0] if whole else None
        if not devices:
            rows.append({"gpu": i, "field": "present", "nvml": None, "nvidia_smi": s.get("uuid"), "agree": False})
            continue
        rows.append(
            {
                "gpu": i,
                "field": "mig mode",
                "nvml": "Enabled" if any(x["mig"] for x in devices) else "Disabled",
                "nvidia_smi": s.get("mig_mode"),
                "agree": any(x["mig"] for x in devices) == mig_on,
            }
        )
        if mig_on:  # NVML lists the slices instead of the GPU: compare what the slices can show
            rows.append(
                {
                    "gpu": i,
                    "field": "MIG slices (NVML)",
                    "nvml": len(devices),
                    "nvidia_smi": "see nvidia-smi -L",
                    "agree": len(devices) > 0,
                }
            )
            continue
        rows.append(
            {
                "gpu": i,
                "field": "uuid",
                "nvml": d["uuid"],
                "nvidia_smi": s.get("uuid"),
                "agree": d["uuid"] == s.get("uuid"),
            }
        )
        rows.append(
            {
                "gpu": i,
                "field": "name",
                "nvml": d["name"],
                "nvidia_smi": s.get("name"),
                "agree": d["name"] == s.get("name"),
            }
        )
        mem_s = s.get("memory_total_mib")
        rows.append(
            {
                "gpu": i,
                "field": "memory total (MiB)",
                "nvml": round(d["memory_total_mib"], 1),
                "nvidia_smi": mem_s,
                "agree": mem_s is not None and abs(d["memory_total_mib"] - mem_s) <= MEMORY_TOLERANCE_MIB,
            }
        )
    for i, devices in sorted(by_index.items()):
        rows.append({"gpu": i, "field": "present", "nvml": devices[0]["uuid"], "nvidia_smi": None, "agree": False})
    return rows


def main() -> None:
    raw = raw_dir()
    rc, q_text, err = smi.run(["-q"])
    (raw / "nvidia-smi-q.txt").write_text(q_text + (f"\n[stderr]\n{err}" if err else ""))
    _, l_text, _ = smi.run(["-L"])
    parsed = smi.parse_q(q_text) if rc == 0 else {"gpus": []}
    smi_gpus = [smi.q_gpu_fields(g) for g in parsed["gpus"]]
    nvml, source, message = workbench_side()
    rows = compare(nvml, smi_gpus)
    mig_uuids = [x["uuid"] for x in smi.parse_list(l_text) if x["kind"] == "MIG"]
    for d in nvml:
        if d["mig"]:
            rows.append(
                {
                    "gpu": d["index"],
                    "field": f"MIG uuid {d['uuid']}",
                    "nvml": d["uuid"],
                    "nvidia_smi": d["uuid"] if d["uuid"] in mig_uuids else None,
                    "agree": d["uuid"] in mig_uuids,
                }
            )
    differences = [r for r in rows if not r["agree"]]
    if rc != 0:
        differences.append(
            {
                "gpu": None,
                "field": "nvidia-smi -q",
                "nvml": None,
                "nvidia_smi": f"exit {rc}: {err.strip()}",
                "agree": False,
            }
        )
    verdict = "all fields agree" if not differences and rows else f"{len(differences)} difference(s)"
    lines = [
        "## 1. Inventory: workbench NVML discovery against nvidia-smi -q",
        "",
        f"- workbench discovery: source `{source}`, {len(nvml)} device(s): {message}",
        f"- nvidia-smi -q: {len(smi_gpus)} GPU(s), driver {parsed.get('driver_version')}, CUDA "
        f"{parsed.get('cuda_version')}",
        f"- **{verdict}** (memory tolerance {MEMORY_TOLERANCE_MIB:g} MiB)",
        "",
        *table(
            ["GPU", "field", "workbench (NVML)", "nvidia-smi -q", "agree"],
            [
                [r["gpu"], r["field"], r["nvml"], r["nvidia_smi"], "yes" if r["agree"] else "**DIFFERENCE**"]
                for r in rows
            ],
        ),
    ]
    if differences:
        lines += ["", "Differences:"] + [
            f"- GPU {r['gpu']}, {r['field']}: workbench {r['nvml']!r}, nvidia-smi {r['nvidia_smi']!r}"
            for r in differences
        ]
    write(
        raw,
        "inventory",
        {
            "source": source,
            "message": message,
            "nvml": nvml,
            "nvidia_smi": smi_gpus,
            "driver_version": parsed.get("driver_version"),
            "cuda_version": parsed.get("cuda_version"),
            "rows": rows,
            "differences": differences,
        },
        lines,
    )


if __name__ == "__main__":
    main()
