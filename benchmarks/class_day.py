"""A day of class, simulated: what idle reclaim, fair share and a reservation do to GPU waits and waste.

Replays one seeded trace of a 2-hour course lab through the project's own code, with simulated
user servers and a simulated clock (``virtual_time.py``: an asyncio loop that jumps to its next
timer instead of sleeping; no processes, no hub, no sleeping). ``class_day_trace.py`` makes the
trace, ``class_day_lab.py`` plays it:

* **admission**: ``GPUPolicy.admission_context`` + ``admission.admit`` for every spawn, as
  ``mixin.py`` does;
* **placement and the wait list**: ``GPUPolicy.place`` -> ``HostAllocator.place`` on a real GPU
  database (SQLite on tmpfs): the ``WaitList`` (fifo, or fair share with its 30-minute aging
  bound; the first arrival kept across retries), classes under reservations, the queue timeout
  (``WORKBENCH_QUEUE_TIMEOUT``, 300 s: ``NoGPUAvailableError``), the reservation filter inside
  ``AllocationStore.allocate``; a stop releases as the spawner does (the ledger reason from
  ``NoticeBook.announced``). The wait list re-checks every 30 s instead of 2 s
  (``gpu_queue_recheck_interval``): every release in the lab wakes the line at once, so the
  re-check only finds a window opening or a grace period ending, up to 28 s later;
* **idle reclaim**: the workbench service's ``Reclaimer.run_pass`` every 30 s
  (``WORKBENCH_GPU_IDLE_CHECK_SECONDS``), reading the simulated servers as its utilization
  source: servers are warned a lead before they are stopped, stopped through the hub API
  stand-in, and the ledger says "reclaimed: GPU idle 10 min".

The store, the GPU-hours and quota ledgers and the notices read "now" through ``utcnow``, which has no
clock parameter; the benchmark points every workbench module's ``utcnow`` at the simulated clock
(``ledger_clock_modules``).

**The trace model** (``--seed``, default 13). Minutes from the start of class (Tuesday 10:00);
the simulation starts at 9:30, the class ends at minute 120; a lecture from 45 to 60 stops the
students' GPU work (servers stay, idle).

* **Students** (group ``ml-course``, ``--students``): 75 % arrive in the first 10 minutes, the
  rest over the first hour, and ask for 1 GPU on arrival. Part 1 of the lab: a setup stretch
  (1-4 min), then 3-6 **bursts** of GPU work (log-normal, median 3 min, ``--burst-minutes``;
  60-95 % utilization) separated by idle **stretches** (reading, writing code, CPU work: 0-3 %;
  exponential, mean 12 min, one in five 20-40 min). Part 2, after the lecture, is GPU work for
  40 % of them (2-5 more bursts); the other 60 % analyse results on the CPU: the **less
  saturated phase**. When their GPU work is done 30 % stop the server; 70 % keep it open (the
  tab stays, so the idle culler never stops it). 15 % leave early (minute 50 to 110); half of
  those close the laptop without stopping the server, which the idle culler stops 60 minutes
  later (``WORKBENCH_CULL_IDLE_SECONDS``). GPU-hours in the past week (fair share's measure):
  70 % **light** (0-2 h), 20 % medium (2-8 h), 10 % **heavy** (8-25 h, e.g. a project).
* **Other users**, not in the class: the **morning session** (group ``nlp-course``, one per two
  GPUs) holds GPUs from 9:30 and leaves between 9:55 and 10:10 (busy until 10 minutes before;
  half stop their server, half leave it to the culler); **researchers** (``research``, 20-60
  GPU-hours this week): 5 % of the class size hold GPUs from before (one in three trains past
  the class, two in three are servers left open and idle), and 1 in 15 of the class size ask
  between 9:30 and 11:50 for a 20-60 minute training job; **visitors** (``nlp-course``
  homework, light, 1 in 10 of the class size) ask between 9:40 and 11:40 and work like students
  (2-4 bursts) for a 40-80 minute session, then half stop and half abandon their server. So
  non-members wait in line when class starts and ask all through it.
* **Refusals and retries**: a spawn not served within the queue timeout is refused; the user
  tries again after 0.5-3 minutes, until served or gone. JupyterHub's ``concurrent_spawn_limit``
  (100 pending spawns) refuses more at once (429), retried the same way (it binds only in a
  large class: the 2,000-student run). A wait is counted from the first ask to
  the lease, across refusals; one never served counts until class end or until its user left
  (so high percentiles are lower bounds when some are never served).
* **After a reclaim** a user asks again when their next burst starts; servers warned by the
  reclaimer are not rescued (nobody runs fake work to keep a GPU).

Why this is a course lab: students arrive in a burst and all ask at once while the previous
session is still leaving; notebook work is short GPU bursts between long stretches of reading
and coding, so a held GPU idles most of the time; most students leave servers open when done; a
lecture idles every held GPU at once; the second half needs fewer GPUs; and the hub serves other
users during class. The fractions are assumptions, not measurements; ``--seed`` shows the spread.

Scenarios, each replaying the same trace (a feature off is the shipped default):
``baseline`` (fifo, no idle reclaim, no reservation), ``idle-reclaim`` (``gpu_idle_minutes``
from ``--idle-minutes``, threshold 5 %, warned min(10 min, half the limit) before),
``fair-share`` (``WORKBENCH_QUEUE_ORDER=fair-share``, aging 30 min), ``reservation`` (3/4 of the
GPUs for ``ml-course`` 10:00-12:00, grace 15 min, no preempt) and ``all`` (the three together).
**Sharing** (``--sharing``, default ``whole``): the same trace, same seed, on labs that share the
GPUs differently (``class_day_lab.py``): ``whole`` (the GPUs whole and exclusive), ``mig`` (each
GPU cut into ``--mig-layout``, 7x1g.18gb: 56 slices on 8 H200s; every student asks for one slice
of it), ``timesliced`` (``servers_per_gpu`` = ``--servers-per-gpu``, 4: that many servers share a
GPU) and ``timesliced-slowdown`` (the same, and k busy servers on one GPU each run at 1/k speed).
GPU-hours count a slice by its share (slice-hours / 7 for 1g); a time-sliced GPU counts once, "used"
while any of its servers is busy; "busy shared" is the share of the servers' busy time spent on a
GPU busy for another server too. A reservation holds whole GPUs, so the ``mig`` lab skips
``reservation`` and ``all``. Not modelled: a slice's or a shared GPU's memory limit (a notebook
that needs more than 18 GB, or 4 notebooks that need more than 141 GB together), a 1g slice's
1/7 of the compute (a burst takes as long on a slice as on a whole GPU), and, without
``-slowdown``, any slowdown of a time-sliced GPU.

"Out of arrival order" counts leases given while a request that first asked earlier was in line:
0 in fifo (unless a user was kept out of the line, e.g. by the spawn limit, for longer than the
15 minutes a retry keeps its first arrival), so it shows how often fair share or a reservation
decided.

    .venv/bin/python benchmarks/class_day.py [--students 60] [--gpus 8] [--seed 13] \\
        [--idle-minutes 10,30,5] [--scenarios all] [--jobs 2] [--sharing whole,mig,timesliced]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import math
import multiprocessing
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

# The packages' sources first (an installed wheel may be older), and the benchmarks' own modules.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "spawner"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "devices"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hub"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from class_day_lab import QUEUE_TIMEOUT, WHOLE, Lab, Result, Sharing
from class_day_trace import BURST_MEDIAN, CLASS_MINUTES, Person, make_trace
from virtual_time import virtual_loop
from workbench_devices.mig import MigLayoutError, parse_layout
from workbench_spawner.ledger import store as store_module


def run(
    people: list[Person],
    gpus: int,
    workdir: Path,
    *,
    reclaim: float = 0.0,
    fair: bool = False,
    reserve: bool = False,
    seed: int = 13,
    sharing: Sharing = WHOLE,
) -> Result:
    """One scenario on its own simulated clock and GPU database."""
    began = time.perf_counter()
    loop = virtual_loop()
    asyncio.set_event_loop(loop)
    saved = {m: m.utcnow for m in ledger_clock_modules()}
    try:
        lab = loop.run_until_complete(_make_lab(people, gpus, workdir, reclaim, fair, reserve, seed, sharing))
        for module in saved:
            module.utcnow = lab.now  # the ledger's "now" is the simulated one (see the docstring)
        result = loop.run_until_complete(lab.run())
    finally:
        for module, original in saved.items():
            module.utcnow = original
        loop.close()
        asyncio.set_event_loop(None)
    result.seconds = time.perf_counter() - began
    return result


def ledger_clock_modules() -> list:
    """Every loaded module of the workbench that reads "now" through the store's ``utcnow``.

    They import it by name (``from ...store import utcnow``), so each module's own name must point at
    the simulated clock: a module missed here would mix the wall clock into the ledger (GPU-hours
    moved to ``rules/gpu_hours.py`` once and fair share silently read real time)."""
    importlib.import_module("workbench_spawner.policy.gpu_policy")  # loads the policy's modules, as the lab does

    original = store_module.utcnow
    return [
        module
        for name, module in sorted(sys.modules.items())
        if name.startswith(("workbench_spawner", "workbench_hub")) and getattr(module, "utcnow", None) is original
    ]


async def _make_lab(people, gpus, workdir, reclaim, fair, reserve, seed, sharing) -> Lab:
    return Lab(people, gpus, workdir, reclaim=reclaim, fair=fair, reserve=reserve, seed=seed, sharing=sharing)


# -- the command line ----------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


SCENARIOS = {
    "baseline": dict(fair=False, reserve=False),
    "idle-reclaim": dict(fair=False, reserve=False),
    "fair-share": dict(fair=True, reserve=False),
    "reservation": dict(fair=False, reserve=True),
    "all": dict(fair=True, reserve=True),
}


SHARINGS = ("whole", "mig", "timesliced", "timesliced-slowdown")


def sharing_modes(names: list[str], layout: str = "7x1g.18gb", servers_per_gpu: int = 4) -> tuple[Sharing, ...]:
    """The labs of ``--sharing``, in the order given."""
    modes = {
        "whole": WHOLE,
        "mig": Sharing("mig", layout=layout),
        "timesliced": Sharing("timesliced", servers_per_gpu=servers_per_gpu),
        "timesliced-slowdown": Sharing("timesliced-slowdown", servers_per_gpu=servers_per_gpu, slowdown=True),
    }
    return tuple(modes[n] for n in names)


def _one(job: tuple) -> Result:
    label, people, gpus, workdir, options = job
    result = run(people, gpus, Path(workdir), **options)
    result.name = label
    return result


def plan(names: list[str], minutes: list[float], sharings: tuple[Sharing, ...] = (WHOLE,)) -> list[tuple[str, dict]]:
    """Every scenario on every lab (a lab of MIG slices has no whole GPUs to reserve: no reservation)."""
    rows = []
    for sharing in sharings:
        for name in names:
            if SCENARIOS[name]["reserve"] and sharing.layout:
                continue
            if name == "idle-reclaim":
                rows += [
                    (f"idle-reclaim ({m:g} min)", dict(SCENARIOS[name], reclaim=m, sharing=sharing)) for m in minutes
                ]
            elif name == "all":
                label = f"all three (reclaim {minutes[0]:g} min)"
                rows.append((label, dict(SCENARIOS[name], reclaim=minutes[0], sharing=sharing)))
            else:
                rows.append((name, dict(SCENARIOS[name], reclaim=0.0, sharing=sharing)))
    return rows


def table(results: list[Result]) -> list[str]:
    lines = [
        "| lab | scenario | p50 wait | p95 wait | max wait | p95 light / heavy students | p95 others "
        "| GPU-h idle | GPU-h used | busy shared | never got a GPU | refused (retried) | warned | reclaimed "
        "| out of arrival order | run s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        shared = r.contended_hours / r.busy_server_hours if r.busy_server_hours else 0.0
        lines.append(
            f"| {r.lab} | {r.name} | {pct(r.waits, 0.5):.1f} | {pct(r.waits, 0.95):.1f} "
            f"| {max(r.waits, default=0):.1f} "
            f"| {pct(r.light_waits, 0.95):.1f} / {pct(r.heavy_waits, 0.95):.1f} | {pct(r.other_waits, 0.95):.1f} "
            f"| {r.idle_hours:.2f} | {r.used_hours:.2f} | {shared:.0%} | {r.never} | {r.refusals} | {r.warned} "
            f"| {r.reclaims} | {r.out_of_order} | {r.seconds:.1f} |"
        )
    return lines


def goal(base: Result, rec: Result) -> str:
    idle_cut = 1 - rec.idle_hours / base.idle_hours if base.idle_hours else 0.0
    p95_base, p95_rec = pct(base.waits, 0.95), pct(rec.waits, 0.95)
    p95_cut = 1 - p95_rec / p95_base if p95_base else 0.0
    met = idle_cut >= 0.5 and p95_cut >= 1 / 3
    return (
        f"{rec.lab} / {rec.name} vs baseline: idle GPU-hours {-idle_cut:+.0%} (goal -50 % or better), p95 wait "
        f"{-p95_cut:+.0%} (goal -33 % or better): {'goal met' if met else 'goal NOT met'}"
    )


def sharing_goal(r: Result) -> str:
    """The issue's goal for slices: nobody unserved, p95 wait under 5 minutes."""
    met = r.never == 0 and pct(r.waits, 0.95) < 5.0
    return (
        f"{r.lab} / {r.name}: {r.never} student(s) never served, p95 wait {pct(r.waits, 0.95):.1f} min "
        f"(goal: nobody unserved and p95 under 5 min): {'goal met' if met else 'goal NOT met'}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--students", type=int, default=60)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument(
        "--idle-minutes",
        default="10,30,5",
        help="gpu_idle_minutes of the idle-reclaim rows, a comma list (default 10,30,5); the first "
        "is also used by 'all'",
    )
    parser.add_argument(
        "--burst-minutes",
        type=float,
        default=3.0,
        help="median length of a burst of GPU work (default 3: a training cell of a course lab)",
    )
    parser.add_argument("--scenarios", default="all", help="comma list of " + ", ".join(SCENARIOS) + ", or 'all'")
    parser.add_argument(
        "--sharing",
        default="whole",
        help="comma list of the labs to replay the trace on: " + ", ".join(SHARINGS) + ", or 'all' (default whole)",
    )
    parser.add_argument("--mig-layout", default="7x1g.18gb", help="every H200's MIG layout in the mig lab")
    parser.add_argument("--servers-per-gpu", type=int, default=4, help="servers_per_gpu of the timesliced labs")
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="scenarios run in this many processes at once (default: 2 or the CPUs)",
    )
    args = parser.parse_args(argv)
    names = list(SCENARIOS) if args.scenarios == "all" else [s.strip() for s in args.scenarios.split(",")]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    sharing = list(SHARINGS) if args.sharing == "all" else [s.strip() for s in args.sharing.split(",")]
    if [s for s in sharing if s not in SHARINGS] or not sharing:
        parser.error(f"--sharing: choose from {', '.join(SHARINGS)}, or 'all'; not {args.sharing!r}")
    try:
        parse_layout("H200-141GB", args.mig_layout)
    except MigLayoutError as exc:
        parser.error(f"--mig-layout: {exc}")
    if args.students < 1 or args.gpus < 1 or args.jobs < 1 or args.servers_per_gpu < 1:
        parser.error("--students, --gpus, --jobs and --servers-per-gpu must be at least 1")
    if not 0 < args.burst_minutes <= 60:
        parser.error("--burst-minutes must be between 0 and 60")
    try:
        minutes = [float(m) for m in args.idle_minutes.split(",")]
    except ValueError:
        parser.error(f"--idle-minutes must be numbers, such as 10,30,5, not {args.idle_minutes!r}")
    if any(not 0.05 <= m <= 7 * 24 * 60 for m in minutes):
        parser.error("--idle-minutes must each be between 0.05 and 10080 (gpu_idle_minutes' bounds)")
    BURST_MEDIAN[0] = args.burst_minutes
    began = time.perf_counter()
    trace = make_trace(args.students, args.seed, args.gpus)
    print(
        f"class_day: {args.students} students (+{len(trace) - args.students} other users), {args.gpus} simulated "
        f"GPUs, {CLASS_MINUTES:g}-minute class, seed {args.seed}, bursts median {args.burst_minutes:g} min, "
        f"queue timeout {QUEUE_TIMEOUT:g} s; {platform.node()} {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, {args.jobs} process(es)"
    )
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None  # the rules, not the disk, are measured
    with tempfile.TemporaryDirectory(prefix="class-day-", dir=shm) as tmp:
        jobs = [
            (label, trace, args.gpus, str(Path(tmp) / str(i)), dict(options, seed=args.seed))
            for i, (label, options) in enumerate(
                plan(names, minutes, sharing_modes(sharing, args.mig_layout, args.servers_per_gpu))
            )
        ]
        for job in jobs:
            Path(job[3]).mkdir()
        if args.jobs > 1 and len(jobs) > 1:
            with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
                results = pool.map(_one, jobs, chunksize=1)
        else:
            results = [_one(job) for job in jobs]
    print(
        "\nWaits in minutes (class requests; a request is counted from the first ask to the lease, across "
        "refusals; never served: until class end or leaving).\n"
    )
    print("\n".join(table(results)))
    print()
    for rec in (r for r in results if r.name.startswith("idle-reclaim")):
        base = next((r for r in results if r.name == "baseline" and r.lab == rec.lab), None)
        if base:
            print(goal(base, rec))
    for r in results if len(sharing) > 1 or sharing != ["whole"] else ():
        print(sharing_goal(r))
    print(f"total run time {time.perf_counter() - began:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
