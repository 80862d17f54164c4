"""Step 2a: the monitor's Sampler (NVML source) against ``nvidia-smi --query-gpu``, under load then idle.

The Sampler runs in its own thread as in a user server; each of its samples triggers, at once,
``nvidia-smi --query-gpu=utilization.gpu,memory.used,temperature.gpu,power.draw
--format=csv,noheader,nounits`` (and ``--query-compute-apps``), and the pairs are compared per
field and per phase.  The load is a separate process (gpu_check.load), as a notebook kernel
would be, so its PID should appear among the sampler's processes.

Environment: GPU_CHECK_LOAD_S (default 60; dry 3), GPU_CHECK_IDLE_S (20; dry 2.5),
GPU_CHECK_INTERVAL (1.0; dry 1.0).
"""

from __future__ import annotations

import os
import queue
import statistics
import subprocess
import sys
import threading
import time

from . import DRY, smi
from .report import fmt, raw_dir, table, write

FIELDS = ["utilization.gpu", "memory.used", "temperature.gpu", "power.draw"]
# (sampler key, nvidia-smi field, unit, scale from the sampler's unit, tolerance)
COMPARED = [
    ("utilization_percent", "utilization.gpu", "%", 1.0, 10.0),
    ("memory_used_bytes", "memory.used", "MiB", 1 / 2**20, 64.0),
    ("temperature_c", "temperature.gpu", "C", 1.0, 2.0),
    ("power_w", "power.draw", "W", 1.0, 15.0),
]
AGREE_FRACTION = 0.9
SETTLE_S = 1.0 if DRY else 3.0  # after the load starts or stops, samples are 'transition', not compared


def env_float(name: str, real: float, dry: float) -> float:
    return float(os.environ.get(name) or (dry if DRY else real))


def main() -> None:
    raw = raw_dir()
    load_s = env_float("GPU_CHECK_LOAD_S", 60, 3)
    idle_s = env_float("GPU_CHECK_IDLE_S", 20, 2.5)
    interval = env_float("GPU_CHECK_INTERVAL", 1.0, 1.0)
    from workbench_devices import make_source
    from workbench_gpu_monitor.sampler import Sampler

    env = dict(os.environ)
    if not DRY:
        env["WORKBENCH_SIMULATED_GPUS"] = ""
    else:
        env.setdefault("WORKBENCH_SIMULATED_GPUS", "1xH200-141GB")
    source = make_source(env)
    sampler = Sampler(source, interval=interval)
    marks: dict[str, float] = {}
    pairs: list[dict] = []
    todo: queue.Queue = queue.Queue()

    def worker():
        while True:
            sample = todo.get()
            if sample is None:
                return
            t_smi0 = time.time()
            # Dry run only: the fake nvidia-smi answers for the sample's moment, since simulated
            # readings move with the wall clock and its start-up takes a large part of a second.
            smi_env = dict(os.environ, GPU_CHECK_FAKE_SMI_AT=repr(sample["timestamp"])) if DRY else None
            rows, err = smi.query_gpu(FIELDS, env=smi_env)
            rc, apps, _ = smi.run(
                ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"], 10, smi_env
            )
            t_smi = time.time()
            pairs.append(
                {
                    "sample": sample,
                    "smi": rows,
                    "smi_error": err,
                    "t_smi": (t_smi0 + t_smi) / 2,
                    "apps": smi.parse_csv(apps, ["pid", "used_memory"]) if rc == 0 else [],
                }
            )

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    sampler.add_listener(lambda s: todo.put(s))
    sampler.start()
    time.sleep(interval if DRY else 3 * interval)  # idle samples before the load
    load = subprocess.Popen(
        [sys.executable, "-m", "gpu_check.load", str(load_s), "cpu" if DRY else "cuda"],
        stdout=subprocess.PIPE,
        text=True,
    )
    ready = load.stdout.readline().split()
    marks["load_start"] = time.time()
    load_pid = int(ready[1]) if len(ready) == 2 and ready[0] == "READY" else None
    out, _ = load.communicate(timeout=load_s + 120)
    marks["load_end"] = time.time()
    time.sleep(idle_s)
    marks["idle_end"] = time.time()
    sampler.stop()
    todo.put(None)
    thread.join(30)
    load_result = {}
    for line in out.splitlines():
        if line.startswith("{"):
            import json

            load_result = json.loads(line)

    def phase(t: float) -> str:
        if t < marks["load_start"]:
            return "before"
        if t < marks["load_start"] + SETTLE_S:
            return "transition"
        if t < marks["load_end"]:
            return "load"
        if t < marks["load_end"] + SETTLE_S:
            return "transition"
        return "idle"

    diffs: dict[tuple[str, str], list] = {}
    skews, sampler_pids, smi_pids, unsupported, notes = [], set(), set(), {}, set()
    series = []
    for p in pairs:
        s = p["sample"]
        ph = phase(s["timestamp"])
        skews.append(p["t_smi"] - s["timestamp"])
        for g in s.get("gpus", []):
            unsupported.update(g.get("unsupported") or {})
            if g.get("memory_note"):
                notes.add(g["memory_note"])
            if ph == "load":
                sampler_pids.update(proc["pid"] for proc in g.get("processes", []))
            row = p["smi"][g["index"]] if g["index"] < len(p["smi"]) else {}
            entry = {"t": round(s["timestamp"], 3), "phase": ph, "gpu": g["index"]}
            for key, field, _unit, scale, _tol in COMPARED:
                mine = g.get(key)
                mine = None if mine is None else mine * scale
                theirs = smi.number(row.get(field))
                entry[key] = mine
                entry[field] = theirs
                if ph in ("load", "idle", "before") and mine is not None and theirs is not None:
                    diffs.setdefault((ph if ph != "before" else "idle", g["index"], field), []).append((mine, theirs))
            series.append(entry)
        if ph == "load":
            smi_pids.update(int(a["pid"]) for a in p["apps"] if a.get("pid"))

    rows, differences = [], []
    gpus = sorted({k[1] for k in diffs}) or [0]
    for ph, gi in ((ph, gi) for ph in ("load", "idle") for gi in gpus):
        for _key, field, unit, _scale, tol in COMPARED:
            got = diffs.get((ph, gi, field), [])
            if not got:
                rows.append([ph, gi, field, 0, "n/a", "n/a", "n/a", "n/a", f"±{tol:g} {unit}", "**NO PAIRS**"])
                differences.append(f"{ph} GPU {gi} {field}: no readings to compare")
                continue
            absd = [abs(a - b) for a, b in got]
            within = sum(d <= tol for d in absd) / len(absd)
            ok = within >= AGREE_FRACTION
            rows.append(
                [
                    ph,
                    gi,
                    field,
                    len(got),
                    fmt(statistics.mean(a for a, _ in got)),
                    fmt(statistics.mean(b for _, b in got)),
                    fmt(statistics.mean(absd), 2),
                    fmt(max(absd), 2),
                    f"±{tol:g} {unit}",
                    f"{within:.0%} within" + ("" if ok else " **DIFFERS**"),
                ]
            )
            if not ok:
                differences.append(
                    f"{ph} GPU {gi} {field}: mean |diff| {statistics.mean(absd):.2f} {unit}, "
                    f"{within:.0%} of {len(got)} pairs within ±{tol:g}"
                )
    skew_med = statistics.median(skews) if skews else None
    load_line = (
        f"{load_result.get('tflops', 0):.4g} TFLOP/s ({load_result.get('dtype')} {load_result.get('n')}^3 on "
        f"{load_result.get('device')}, {load_result.get('products')} products in {load_result.get('seconds', 0):.1f} s)"
        if load_result
        else "no result from the load process"
    )
    lines = [
        "## 2. Monitor: Sampler (NVML source) against nvidia-smi --query-gpu",
        "",
        f"- source `{getattr(source, 'source', '?')}`, interval {interval:g} s, {load_s:g} s of matmul load "
        f"then {idle_s:g} s idle;"
        f" {len(pairs)} samples, each followed by nvidia-smi (median lag {fmt(skew_med, 3)} s)",
        f"- load: {load_line}; load PID {load_pid}",
        f"- processes during load: sampler saw PIDs {sorted(sampler_pids) or 'none'}, nvidia-smi "
        "--query-compute-apps saw "
        f"{sorted(smi_pids) or 'none'}; load PID seen by sampler: {'yes' if load_pid in sampler_pids else 'no'}, "
        f"by nvidia-smi: {'yes' if load_pid in smi_pids else 'no'}",
        f"- counters the source marked unsupported: {unsupported or 'none'}; memory notes: {sorted(notes) or 'none'}",
        f"- **{'all fields agree' if not differences else str(len(differences)) + ' difference(s)'}** "
        f"(a field agrees when {AGREE_FRACTION:.0%} of pairs are within its tolerance; transitions of "
        f"{SETTLE_S:g} s left out)",
        "",
        *table(
            [
                "phase",
                "GPU",
                "field",
                "pairs",
                "sampler mean",
                "nvidia-smi mean",
                "mean abs diff",
                "max abs diff",
                "tolerance",
                "verdict",
            ],
            rows,
        ),
    ]
    if differences:
        lines += ["", "Differences:"] + [f"- {d}" for d in differences]
    write(
        raw,
        "monitor",
        {
            "interval": interval,
            "load_s": load_s,
            "idle_s": idle_s,
            "marks": marks,
            "load": load_result,
            "load_pid": load_pid,
            "sampler_pids": sorted(sampler_pids),
            "smi_pids": sorted(smi_pids),
            "unsupported": unsupported,
            "differences": differences,
            "series": series,
            "median_lag_s": skew_med,
        },
        lines,
    )


if __name__ == "__main__":
    main()
