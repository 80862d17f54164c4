"""A day of class, simulated: what idle reclaim, fair share and a reservation do to GPU waits and waste.

Replays one seeded trace of a 2-hour course lab through the project's own rules, with simulated
servers and a simulated clock (no processes, no hub, no sleeping):

* **admission**: ``workbench_spawner.admission.admit`` for every GPU request (the default quota);
* **placement**: a real GPU database (``AllocationStore`` on a SQLite file) and the host
  allocator's reservation filter (``HostAllocator.choose`` with R's reservation rules and a
  simulated clock) inside ``AllocationStore.allocate``; the wait list in the order of
  ``workbench_spawner.queue_order.order`` (fifo or fair-share with its aging bound);
* **idle reclaim**: ``workbench_spawner.idle`` (``advance`` / ``judge``, the warning lead, the
  ledger reason) for every held GPU on every tick, as the workbench service does.

The trace model (``--seed``, default 13), per student of group ``ml-course``:

* **arrival**: 75 % in the first 10 minutes of class, the rest spread over the first hour; each
  asks for 1 GPU on arrival;
* **activity**, from the moment the student gets a GPU: alternating **bursts of GPU work**
  (log-normal, median 3 min, ``--burst-minutes``; utilization 60-95 %) and **idle stretches**
  (exponential, mean 12 min; 0-3 %: reading, writing code, CPU work; one in five a long one of
  20-40 min); everybody is idle during the lecture part from minute 45 to 60 (work pauses);
* **leaving**: 20 % leave early (between minute 50 and 110); of those, 40 % close the laptop
  without stopping the server, which then holds its GPU idle until the end; everybody else keeps
  the server until class ends;
* **after a reclaim** the student asks again when their next burst of work starts (their work
  waits meanwhile; the wait counts as any other);
* **other users** (5 % of the class size, group ``research``, not in ``ml-course``) already hold
  GPUs when class starts: one in three runs a long training job (busy), two in three are servers
  forgotten since the morning (idle); they matter for the reservation and for idle reclaim.

Scenarios, each with the same trace (a feature off is the shipped default):

* ``baseline``: fifo, no idle reclaim, no reservation;
* ``idle-reclaim``: ``gpu_idle_minutes`` = 10 (warned 5 minutes before), threshold 5 %;
* ``fair-share``: ``WORKBENCH_QUEUE_ORDER=fair-share`` (aging 30 min), GPU-hours from the simulated
  ledger;
* ``reservation``: 3/4 of the GPUs reserved for ``ml-course`` during class (grace 15 min, no preempt);
* ``all``: the three together.

Printed per scenario, for the class's GPU requests: p50/p95 wait for a GPU (a request never served
counts its wait until class end, so p95 is a lower bound when some never got one), GPU-hours held
idle (held while under the threshold), GPU-hours used (held while busy), and students who never got
a GPU; then the goal check for idle reclaim against the baseline.

    .venv/bin/python benchmarks/class_day.py [--students 60] [--gpus 8] [--seed 13] [--scenarios all]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for sub in ("spawner", "devices"):
    sys.path.insert(0, str(REPO / sub))

from workbench_devices import DeviceInventory, GPUDevice  # noqa: E402
from workbench_spawner.admission import AdmissionContext, Admitted, admit  # noqa: E402
from workbench_spawner.idle import STOP, WARN, GpuTrack, IdleRule, advance, judge, ledger_reason  # noqa: E402
from workbench_spawner.quota import EffectiveQuota, Quota  # noqa: E402
from workbench_spawner.store import AllocationStore  # noqa: E402

from workbench_spawner.placement import HostAllocator  # noqa: E402
from workbench_spawner.queue_order import Waiting, order  # noqa: E402
from workbench_spawner.reservation_book import ReservationBook  # noqa: E402
from workbench_spawner.reservations import Reservation, parse_window  # noqa: E402

CLASS = "ml-course"
START = datetime(2026, 12, 8, 10, 0, tzinfo=timezone.utc)  # a Tuesday
CLASS_MINUTES = 120
TICK = 0.5  # minutes
LECTURE = (45.0, 60.0)
NODE = "sim-node"


# -- the trace ---------------------------------------------------------------------------

@dataclass
class Person:
    """One user's script; every random draw comes from the person's own stream, so the k-th burst of a
    student has the same length in every scenario, whenever it happens."""

    name: str
    groups: tuple[str, ...]
    arrival: float  # minutes from class start
    leave: float  # minutes: stops the server then, or abandons it (see ``abandons``)
    abandons: bool  # leaves without stopping the server: it stays, idle, until class end or reclaim
    kind: str  # "student" | "training" (a long busy run) | "forgotten" (an idle server from before)
    seed: int

    def stream(self) -> random.Random:
        return random.Random(self.seed)


def make_trace(students: int, seed: int) -> list[Person]:
    rng = random.Random(seed)
    people = []
    for i in range(students):
        arrival = rng.uniform(0, 10) if rng.random() < 0.75 else rng.uniform(10, 60)
        leaves_early = rng.random() < 0.20
        leave = rng.uniform(50, 110) if leaves_early else CLASS_MINUTES
        abandons = leaves_early and rng.random() < 0.40
        people.append(Person(f"student{i:04d}", (CLASS,), arrival, leave, abandons, "student", rng.randrange(1 << 30)))
    for i in range(max(1, students // 20)):
        kind = "training" if i % 3 == 0 else "forgotten"
        people.append(Person(f"other{i:03d}", ("research",), rng.uniform(-30, -1), CLASS_MINUTES, False, kind,
                             rng.randrange(1 << 30)))
    return people


BURST_MEDIAN = [3.0]  # minutes; --burst-minutes


def burst(rng: random.Random) -> float:
    """A burst of GPU work: a training cell, an evaluation (log-normal, median 3 min by default)."""
    return rng.lognormvariate(math.log(BURST_MEDIAN[0]), 0.6)


def stretch(rng: random.Random) -> float:
    """Reading, writing code, CPU work: mean 12 min; one in five a long one (20-40 min)."""
    return rng.uniform(20, 40) if rng.random() < 0.2 else rng.expovariate(1 / 12)


def simulated_inventory(gpus: int) -> DeviceInventory:
    """``gpus`` simulated H100s (built here: ``WORKBENCH_SIMULATED_GPUS`` stops at 64, a big lab has more)."""
    devices = [GPUDevice(uuid=f"GPU-sim-{i:03d}-h100-80gb", index=i, name="NVIDIA H100 80GB HBM3 (simulated)",
                         memory_total_bytes=80 << 30, model="H100-80GB", simulated=True) for i in range(gpus)]
    return DeviceInventory("simulated", devices, f"{gpus} simulated GPUs")


# -- one scenario --------------------------------------------------------------------------

@dataclass
class Result:
    name: str
    waits: list[float]
    idle_hours: float
    used_hours: float
    never: int
    reclaims: int
    seconds: float


@dataclass
class State:
    """Where one person is: away, waiting, holding (busy until / idle until), or reclaimed (idle until)."""

    phase: str = "away"
    until: float = 0.0
    busy: bool = False
    joined: float = 0.0


def run(people: list[Person], gpus: int, *, reclaim: bool, fair: bool, reserve: bool, seed: int,
        workdir: Path, idle_minutes: float = 10.0) -> Result:
    began = time.perf_counter()
    noise = random.Random(seed + 1)  # utilization within a phase; never decides a phase
    clock_now = [START]
    store = AllocationStore(f"sqlite:///{workdir / f'{reclaim}{fair}{reserve}{idle_minutes:g}.sqlite'}")
    inventory = simulated_inventory(gpus)
    candidates = [d.uuid for d in inventory.devices]
    allocator = HostAllocator(store, inventory, NODE, queue_order="fair-share" if fair else "fifo",
                              tz=timezone.utc, clock=lambda: clock_now[0])
    if reserve:
        window = parse_window(f"{START:%Y-%m-%d} 10:00-12:00")
        res = Reservation(group=CLASS, gpus=max(1, gpus * 3 // 4), window=window, grace_minutes=15)
        ReservationBook(store).create(res, {inventory.devices[0].model: gpus}, START, timezone.utc)
    rule = IdleRule(minutes=idle_minutes, threshold=5, warn_minutes=10) if reclaim else IdleRule(minutes=0)
    ctx = AdmissionContext(quota=EffectiveQuota(Quota(1), "default"), inventory_size=gpus,
                           inventory_models=[inventory.devices[0].model])
    streams = {p.name: p.stream() for p in people}
    state = {p.name: State() for p in people}
    tracks: dict[str, GpuTrack] = {}
    gpu_hours = {p.name: 0.0 for p in people}
    got_any: set[str] = set()
    waits: list[float] = []
    idle_hours = used_hours = 0.0
    reclaims = 0
    holders = 0

    def ask(p: Person, s: State, t: float) -> None:
        verdict = admit({"gpus": 1}, ctx)  # the default quota: 1 GPU
        assert isinstance(verdict, Admitted), verdict
        s.phase, s.joined = "waiting", t

    t = -30.0
    while t < CLASS_MINUTES:
        clock_now[0] = START + timedelta(minutes=t)
        lecture = LECTURE[0] <= t < LECTURE[1]
        for p in people:
            s = state[p.name]
            if s.phase == "away" and p.arrival <= t < p.arrival + TICK:
                ask(p, s, t)
            elif s.phase == "reclaimed" and t >= s.until and t < p.leave:
                ask(p, s, t)  # wants to work again: back in line
            if t >= p.leave and s.phase in ("waiting", "reclaimed"):
                if s.phase == "waiting":
                    waits.append(t - s.joined)
                s.phase = "gone"
            elif t >= p.leave and s.phase == "holding" and p.kind == "student":
                if p.abandons:
                    s.phase = "abandoned"  # the server stays, idle
                else:
                    store.release(p.name, "", "stopped")
                    tracks.pop(p.name, None)
                    s.phase = "gone"
                    holders -= 1
            elif s.phase == "holding" and p.kind == "student" and t >= s.until:
                s.busy = not s.busy  # a burst ends in a stretch, a stretch in the next burst
                s.until = t + (burst(streams[p.name]) if s.busy else stretch(streams[p.name]))
            if lecture and s.phase == "holding" and s.busy and CLASS in p.groups:
                s.until += TICK  # the lecture pauses the work
        # Serve the line in the configured order while GPUs are free.
        free = gpus - holders
        waiting = [p.name for p in people if state[p.name].phase == "waiting"]
        if waiting and free > 0:
            line = [Waiting(n, n, state[n].joined * 60, gpu_hours[n]) for n in waiting]
            ordered = [w.key for w in order(line, "fair-share" if fair else "fifo", t * 60, 30.0)]
            active = allocator.active_reservations()
            failures = 0
            by_name = {p.name: p for p in people}
            for name in ordered:
                if free <= 0 or failures > 8:
                    break
                groups = by_name[name].groups
                choose = allocator.choose(groups, 1, active)
                lease = store.allocate(name, "", 1, candidates, node=NODE, groups=groups, choose=choose)
                if lease is None:
                    failures += 1
                    continue
                s = state[name]
                waits.append(t - s.joined)
                got_any.add(name)
                tracks[name] = GpuTrack(NODE, lease.gpu_uuids[0], name, "")
                kind = by_name[name].kind
                s.phase, s.busy = "holding", kind != "forgotten"
                s.until = t + (burst(streams[name]) if kind == "student" else 10_000)
                free -= 1
                holders += 1
        # Readings, the ledger's GPU-hours and idle reclaim.
        for p in people:
            s = state[p.name]
            if s.phase not in ("holding", "abandoned"):
                continue
            working = s.phase == "holding" and s.busy and not (lecture and CLASS in p.groups)
            value = noise.uniform(60, 95) if working else noise.uniform(0, 3)
            if value < 5:
                idle_hours += TICK / 60
            else:
                used_hours += TICK / 60
            gpu_hours[p.name] += TICK / 60
            if not rule.enabled:
                continue
            tracks[p.name] = advance(tracks[p.name], value, rule.threshold, clock_now[0], "host")
            verdict = judge([tracks[p.name]], rule, clock_now[0], stale_after=timedelta(minutes=2))
            if verdict.action == STOP:
                store.release(p.name, "", ledger_reason(rule))
                del tracks[p.name]
                holders -= 1
                reclaims += 1
                if s.phase == "holding" and p.kind == "student":
                    s.phase = "reclaimed"  # asks again when this stretch is over
                else:
                    s.phase = "gone"
            elif verdict.action == WARN:
                pass  # the countdown is shown; a student in a stretch does not react to it
        t += TICK
    for p in people:
        if state[p.name].phase == "waiting":
            waits.append(CLASS_MINUTES - state[p.name].joined)  # never served before class end
    never = sum(1 for p in people if CLASS in p.groups and p.name not in got_any)
    store.dispose()
    return Result("", waits, idle_hours, used_hours, never, reclaims, time.perf_counter() - began)


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


SCENARIOS = {
    "baseline": dict(reclaim=False, fair=False, reserve=False),
    "idle-reclaim": dict(reclaim=True, fair=False, reserve=False),
    "fair-share": dict(reclaim=False, fair=True, reserve=False),
    "reservation": dict(reclaim=False, fair=False, reserve=True),
    "all": dict(reclaim=True, fair=True, reserve=True),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--students", type=int, default=60)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--idle-minutes", default="10",
                        help="gpu_idle_minutes for the scenarios with idle reclaim; a comma list (5,10,20) adds "
                             "one idle-reclaim row per value (the first is used by 'all')")
    parser.add_argument("--burst-minutes", type=float, default=3.0,
                        help="median length of a burst of GPU work (default 3: a training cell of a course lab)")
    parser.add_argument("--scenarios", default="all",
                        help="comma list of " + ", ".join(SCENARIOS) + ", or 'all' (default)")
    args = parser.parse_args(argv)
    names = list(SCENARIOS) if args.scenarios == "all" else [s.strip() for s in args.scenarios.split(",")]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown or args.students < 1 or args.gpus < 1:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}" if unknown else "students and gpus must be >= 1")
    if not 0 < args.burst_minutes <= 60:
        parser.error("--burst-minutes must be between 0 and 60")
    BURST_MEDIAN[0] = args.burst_minutes
    began = time.perf_counter()
    trace = make_trace(args.students, args.seed)
    print(f"class_day: {args.students} students (+{len(trace) - args.students} other users), {args.gpus} simulated "
          f"GPUs, {CLASS_MINUTES}-minute class, seed {args.seed}, bursts median {args.burst_minutes:g} min, "
          f"tick {TICK * 60:g} s; "
          f"{platform.node()} {os.cpu_count()} CPUs, Python {platform.python_version()}")
    try:
        minutes = [float(m) for m in args.idle_minutes.split(",")]
    except ValueError:
        parser.error(f"--idle-minutes must be numbers, not {args.idle_minutes!r}")
    results = []
    # The GPU database on tmpfs where there is one: the figures are about the rules, not the disk.
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="class-day-", dir=shm) as tmp:
        for name in names:
            runs = minutes if name == "idle-reclaim" else minutes[:1]
            for m in runs:
                r = run(trace, args.gpus, seed=args.seed, workdir=Path(tmp), idle_minutes=m, **SCENARIOS[name])
                r.name = f"{name} ({m:g} min)" if SCENARIOS[name]["reclaim"] else name
                results.append(r)
    print()
    print(f"| scenario | p50 wait (min) | p95 wait (min) | GPU-h held idle | GPU-h used | never got a GPU "
          f"| reclaims | run s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r.name} | {pct(r.waits, 0.5):.1f} | {pct(r.waits, 0.95):.1f} | {r.idle_hours:.2f} | "
              f"{r.used_hours:.2f} | {r.never} | {r.reclaims} | {r.seconds:.2f} |")
    base = next((r for r in results if r.name == "baseline"), None)
    print()
    for rec in [r for r in results if r.name.startswith("idle-reclaim")] if base else []:
        idle_cut = 1 - rec.idle_hours / base.idle_hours if base.idle_hours else 0.0
        p95_base, p95_rec = pct(base.waits, 0.95), pct(rec.waits, 0.95)
        p95_cut = 1 - p95_rec / p95_base if p95_base else 0.0
        print(f"{rec.name} vs baseline: idle GPU-hours {-idle_cut:+.0%} (goal: -50 % or better), "
              f"p95 wait {-p95_cut:+.0%} (goal: -33 % or better): "
              f"{'goal met' if idle_cut >= 0.5 and p95_cut >= 1 / 3 else 'goal NOT met'}")
    print(f"total run time {time.perf_counter() - began:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
