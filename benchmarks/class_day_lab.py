"""The simulated lab of ``class_day.py``: user servers, people and the hub API stand-in.

``Lab`` plays every person of a trace (``class_day.Person``) on a virtual-time asyncio loop
(``virtual_time.py``) against the project's own code: ``GPUPolicy`` for admission and placement
(``HostAllocator``, its ``WaitList``, the reservation filter, the queue timeout) and, when idle
reclaim is on, the workbench service's ``Reclaimer``, for which the lab is both the hub API
(``users``, ``stop_server``) and the utilization source (``read``). It counts what the table
shows: waits, GPU-hours held idle and used, refusals, warnings and reclaims.

**Sharing** (``Sharing``): the GPUs are whole and exclusive (``whole``), each cut into a MIG
layout (``mig``: every student asks for a slice of the layout's first profile, as the spawn form's
``gpu_profile``; other users ask for "1 GPU", which admission turns into a slice on a hub with no
whole GPUs), or time-sliced (``timesliced``: ``servers_per_gpu`` servers share one GPU). GPU-hours
are counted per device, weighted by its share (``GPUDevice.share``: a 1g slice-hour is 1/7 of a
GPU-hour): a device is "used" while at least one of its servers is busy, "idle" while held and none
is. The reclaimer reads a device's utilization, as NVML does: a time-sliced GPU reads busy while
any of its servers is. With ``slowdown`` (time-slicing only), k busy servers on one GPU each run at
1/k speed (processor sharing, no switching overhead); without it a shared GPU is as fast as a free one.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from class_day_trace import CLASS, CLASS_MINUTES, LECTURE, PRE, START, Person, burst, stretch
from workbench_devices import DeviceInventory, GPUDevice
from workbench_devices.inventory import simulated_gpu_instance_id
from workbench_devices.mig import parse_layout
from workbench_hub.service.fleet import Fleet
from workbench_hub.service.gpu_reclaim import Reclaimer
from workbench_hub.service.utilization import HostReadings, ServerMonitorReadings, SourceChooser
from workbench_spawner.ledger import endings
from workbench_spawner.ledger.reservation_book import ReservationBook
from workbench_spawner.ledger.store import AllocationStore, UsageRow
from workbench_spawner.placement.host import HostAllocator, NoGPUAvailableError
from workbench_spawner.policy.gpu_policy import GPUPolicy
from workbench_spawner.policy.settings import PolicySettings
from workbench_spawner.rules.admission import Refusal, admit
from workbench_spawner.rules.quota import Quota
from workbench_spawner.rules.reservations import Reservation
from workbench_spawner.rules.window import parse_window

NODE = "sim-node"
# The shipped defaults: WORKBENCH_QUEUE_TIMEOUT, WORKBENCH_GPU_IDLE_CHECK_SECONDS, WORKBENCH_CULL_IDLE_SECONDS.
QUEUE_TIMEOUT, CHECK_SECONDS, CULL_MINUTES = 300.0, 30.0, 60.0
# The wait list's re-check (gpu_queue_recheck_interval, 2 s by default) only finds what the hub did
# not see: releases by another process, a reservation's window opening or its grace ending. Every
# release in the lab is seen (it wakes the line at once), so a 30 s re-check changes only those
# two instants, by at most 30 s, and saves thousands of fruitless database transactions.
RECHECK = 30.0
# JupyterHub's concurrent_spawn_limit (default 100): more pending spawns are refused at once (429),
# before any of our code runs; the user tries again like after a refusal.
SPAWN_LIMIT = 100
MODEL = "H200-141GB"


@dataclass(frozen=True)
class Sharing:
    """How the lab's GPUs are shared (see the module docstring)."""

    name: str = "whole"
    layout: str = ""  # every GPU's MIG layout ("7x1g.18gb"); "": whole GPUs
    servers_per_gpu: int = 1  # time-slicing: servers that may share one GPU
    slowdown: bool = False  # k busy servers on one GPU each run at 1/k speed


WHOLE = Sharing()  # the default: whole GPUs, one server each


def simulated_inventory(gpus: int, layout: str = "") -> DeviceInventory:
    """``gpus`` simulated H200-141GBs, whole or each cut into the MIG ``layout``, built as
    ``parse_simulated_spec("8xH200-141GB:mig=7x1g.18gb")`` builds them, UUIDs included (built here:
    ``WORKBENCH_SIMULATED_GPUS`` stops at 64 GPUs, a big lab has more)."""
    slices = parse_layout(MODEL, layout) if layout else []
    devices: list[GPUDevice] = []
    for i in range(gpus):
        uuid, name = f"GPU-sim-{i:02d}-{MODEL.lower()}", "NVIDIA H200 (simulated)"
        whole = GPUDevice(uuid, i, name, memory_total_bytes=141 << 30, model=MODEL, simulated=True)
        cut = [
            replace(
                whole,
                uuid=f"MIG-sim-{i:02d}-{MODEL.lower()}-{place}-{profile.name}",
                name=f"{whole.name} MIG {profile.name}",
                memory_total_bytes=profile.memory_gb * 10**9,
                mig=True,
                profile=profile.name,
                parent_uuid=whole.uuid,
                gpu_instance_id=simulated_gpu_instance_id(place),
            )
            for place, profile in enumerate(slices)
        ]
        devices += cut or [whole]
    what = f"{len(devices)} simulated MIG slices of {gpus} GPUs" if slices else f"{gpus} simulated GPUs"
    return DeviceInventory("simulated", devices, what)


# -- one scenario ------------------------------------------------------------------------


@dataclass
class Result:
    name: str
    lab: str = "whole"  # Sharing.name
    waits: list[float] = field(default_factory=list)  # class requests, minutes
    light_waits: list[float] = field(default_factory=list)
    heavy_waits: list[float] = field(default_factory=list)
    other_waits: list[float] = field(default_factory=list)
    out_of_order: int = 0  # leases given while a request that first asked earlier waited in line
    idle_hours: float = 0.0
    used_hours: float = 0.0
    busy_server_hours: float = 0.0  # servers' busy time (unweighted)
    contended_hours: float = 0.0  # of it, time a GPU was busy for another server too (time-slicing)
    never: int = 0
    refusals: int = 0
    warned: int = 0
    reclaims: int = 0
    seconds: float = 0.0


class Lab:
    """The simulated servers and people; also the hub API (``users``, ``stop_server``) and the
    utilization source the reclaimer reads."""

    name = "host"

    def __init__(
        self,
        people: list[Person],
        gpus: int,
        workdir: Path,
        *,
        reclaim: float,
        fair: bool,
        reserve: bool,
        seed: int,
        sharing: Sharing = WHOLE,
    ):
        if reserve and sharing.layout:
            raise ValueError("a reservation holds whole GPUs: a lab of MIG slices has none to reserve")
        self.loop = asyncio.get_running_loop()
        self.people = {p.name: p for p in people}
        self.result = Result("", sharing.name)
        self.sharing = sharing
        self.noise = random.Random(seed + 1)  # utilization within a phase; never decides a phase
        self.holding: dict[str, bool] = {}
        self.busy: dict[str, bool] = {}
        self.counted_at: dict[str, float] = {}  # device -> minute its hours were last counted
        self.device: dict[str, str] = {}  # name -> the device its server holds
        self.on: dict[str, set[str]] = {}  # device -> the servers holding it
        self.changed: dict[str, asyncio.Event] = {}  # device -> set when its busy servers change
        self.asking: dict[str, float] = {}  # name -> minute its current request began
        self.in_line: dict[str, float] = {}  # the same, only while in the wait list (not between retries)
        self.retry = {p.name: p.stream("retry") for p in people}  # pauses before trying again
        self.got_any: set[str] = set()
        self.tasks: list[asyncio.Task] = []
        self.warned_now: set[tuple[str, str]] = set()
        self.token = "simulated"
        inventory = simulated_inventory(gpus, sharing.layout)
        self.shares = {d.uuid: d.share for d in inventory.devices}
        self.profile = inventory.profiles()[0] if sharing.layout else None  # what a student asks for
        self.store = AllocationStore(f"sqlite:///{workdir / f'{sharing.name}-{reclaim:g}-{fair}-{reserve}.sqlite'}")
        settings = PolicySettings(
            self.store.url,
            inventory,
            default_quota=Quota(1),
            queue_timeout=QUEUE_TIMEOUT,
            node=NODE,
            queue_order="fair-share" if fair else "fifo",
            gpu_idle_minutes=reclaim,
            servers_per_gpu=sharing.servers_per_gpu,
        )
        placement = HostAllocator(
            self.store,
            inventory,
            NODE,
            slots_per_gpu=sharing.servers_per_gpu,
            recheck_interval=RECHECK,
            queue_order=settings.queue_order,
            tz=UTC,
            clock=self.now,
            queue_clock=self.loop.time,
        )
        self.policy = GPUPolicy(settings, self.store, placement=placement)
        with self.store.writes().begin() as session:  # last week's GPU-hours, in the ledger
            session.add_all(
                [
                    UsageRow(
                        gpu_uuid=inventory.devices[0].uuid,
                        user=p.name,
                        server="",
                        node=NODE,
                        started=START - timedelta(days=3, hours=p.week_hours),
                        ended=START - timedelta(days=3),
                        reason="stopped",
                    )
                    for p in people
                    if p.week_hours > 0
                ]
            )
        if reserve:
            res = Reservation(
                CLASS, max(1, gpus * 3 // 4), parse_window(f"{START:%Y-%m-%d} 10:00-12:00"), grace_minutes=15
            )
            ReservationBook(self.store).create(res, {MODEL: gpus}, self.now() - timedelta(hours=1), UTC)
        fleet = Fleet(self.store, settings=settings)
        chooser = SourceChooser(HostReadings(fleet), ServerMonitorReadings(None), NODE)
        chooser.register(NODE, self)
        self.reclaimer = (
            Reclaimer(fleet, self, chooser, None, clock=self.now, interval=CHECK_SECONDS) if reclaim else None
        )

    # -- clocks ------------------------------------------------------------------------------

    def minute(self) -> float:
        return self.loop.time() / 60.0 - PRE

    def now(self) -> datetime:
        return START + timedelta(minutes=self.minute())

    async def until(self, minute: float) -> None:
        await asyncio.sleep(max(0.0, minute - self.minute()) * 60.0)

    # -- what the reclaimer calls: the hub API and the utilization source --------------------

    async def users(self) -> list[dict]:
        return [
            {
                "name": n,
                "groups": list(self.people[n].groups),
                "servers": {"": {"ready": True, "pending": None, "url": f"/user/{n}/"}},
            }
            for n, held in self.holding.items()
            if held
        ]

    async def stop_server(self, user: str, server: str) -> None:
        self.result.reclaims += 1
        self.stop(user, "stopped")

    async def read(self, lease, server_path) -> dict[str, float | None]:
        """A device's utilization (NVML's view): a time-sliced GPU is busy while any of its servers is."""
        return {u: self.noise.uniform(60, 95) if self.busy_on(u) else self.noise.uniform(0, 3) for u in lease.gpu_uuids}

    # -- servers -----------------------------------------------------------------------------

    def busy_on(self, uuid: str | None) -> int:
        return sum(1 for n in self.on.get(uuid, ()) if self.busy.get(n)) if uuid else 0

    def count(self, uuid: str) -> None:
        """Add the time since the device's last change to its idle or used hours, weighted by its share
        (class window only), and its servers' busy and contended time."""
        now = min(max(self.minute(), 0.0), CLASS_MINUTES)
        then = min(max(self.counted_at.get(uuid, now), 0.0), CLASS_MINUTES)
        if self.on.get(uuid) and now > then:
            hours, busy = (now - then) / 60, self.busy_on(uuid)
            if busy:
                self.result.used_hours += hours * self.shares[uuid]
            else:
                self.result.idle_hours += hours * self.shares[uuid]
            self.result.busy_server_hours += busy * hours
            self.result.contended_hours += busy * hours if busy > 1 else 0.0
        self.counted_at[uuid] = self.minute()

    def set_busy(self, name: str, busy: bool) -> None:
        uuid = self.device.get(name)
        if uuid is not None:
            self.count(uuid)
        busy = busy and self.holding.get(name, False)
        if busy != self.busy.get(name, False) and uuid is not None:
            self.changed.pop(uuid, asyncio.Event()).set()  # wakes the servers slowed down on it
        self.busy[name] = busy

    def stop(self, name: str, otherwise: str) -> None:
        """The spawner's stop: release with the reason the service announced for it, if any (``end_server``)."""
        if not self.holding.get(name):
            return
        self.set_busy(name, False)  # counts the device's hours
        uuid = self.device.pop(name)
        self.holding[name] = False
        self.on[uuid].discard(name)
        self.policy.end_server(name, "", endings.for_reason(otherwise))

    async def progress(self, name: str, work: float, limit: float) -> float:
        """Busy for ``work`` minutes of work, at most ``limit`` minutes long, at 1/k speed while k servers
        are busy on its GPU (``Sharing.slowdown``); returns the work done."""
        done, end = 0.0, self.minute() + limit
        while done < work - 1e-9 and self.minute() < end - 1e-9:
            uuid, began = self.device.get(name), self.minute()
            k = max(1, self.busy_on(uuid))
            changed = self.changed.setdefault(uuid, asyncio.Event()) if uuid else asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), min((work - done) * k, end - began) * 60.0)
            done += (self.minute() - began) / k
        return min(done, work)

    async def get_gpu(self, p: Person) -> bool:
        """Spawn (admission, then placement with the queue timeout), retrying after refusals."""
        began = self.asking[p.name] = self.minute()
        while True:
            if len(self.in_line) >= SPAWN_LIMIT:
                self.result.refusals += 1
                await asyncio.sleep(self.retry[p.name].uniform(0.5, 3.0) * 60.0)
                continue
            ctx = await asyncio.to_thread(self.policy.admission_context, p.name, "", list(p.groups), default_gpus=1)
            ask = {"gpus": 1, "gpu_profile": self.profile} if self.profile and p.kind == "student" else {"gpus": 1}
            verdict = admit(ask, ctx)
            assert not isinstance(verdict, Refusal), verdict.message
            self.in_line[p.name] = began
            try:
                kind = verdict.request.kind  # None: whole GPUs; "1g.18gb": a slice (the spawner's request.kind)
                lease = await self.policy.place(p.name, "", 1, kind, QUEUE_TIMEOUT, groups=p.groups)
            except NoGPUAvailableError:
                self.result.refusals += 1
                del self.in_line[p.name]  # not in line during the pause before trying again
                await asyncio.sleep(self.retry[p.name].uniform(0.5, 3.0) * 60.0)
                continue
            finally:
                self.in_line.pop(p.name, None)
            if any(b < began for b in self.in_line.values()):
                self.result.out_of_order += 1  # fair share or a reservation chose
            self.record(p, self.minute() - began)
            uuid = lease.gpu_uuids[0]
            self.count(uuid)
            self.device[p.name], self.holding[p.name], self.busy[p.name] = uuid, True, False
            self.on.setdefault(uuid, set()).add(p.name)
            self.got_any.add(p.name)
            return True

    def record(self, p: Person, wait: float) -> None:
        self.asking.pop(p.name, None)
        if p.kind != "student":
            self.result.other_waits.append(wait)  # other users: research and visitors
            return
        self.result.waits.append(wait)
        (self.result.heavy_waits if p.week_hours >= 8 else self.result.light_waits).append(wait)

    async def work(self, p: Person, minutes: float, gpu: bool) -> None:
        """``minutes`` of work time (the lecture stops it); GPU work needs the GPU (asked again if it
        was reclaimed meanwhile) and keeps it busy."""
        while minutes > 1e-9:
            t = self.minute()
            if LECTURE[0] <= t < LECTURE[1] and p.kind == "student":
                self.set_busy(p.name, False)
                await self.until(LECTURE[1])
                continue
            if gpu and not self.holding.get(p.name):
                await self.get_gpu(p)  # reclaimed (e.g. during the lecture): back in line
                continue
            limit = math.inf if t >= LECTURE[1] or p.kind != "student" else LECTURE[0] - t
            self.set_busy(p.name, gpu)
            if gpu and self.sharing.slowdown:
                minutes -= await self.progress(p.name, minutes, limit)
                continue
            step = min(minutes, limit)
            await asyncio.sleep(step * 60.0)
            minutes -= step
        self.set_busy(p.name, False)

    # -- people ------------------------------------------------------------------------------

    async def student(self, p: Person) -> None:
        """Arrive, follow the lab's plan until leaving; leave (stop, or abandon the server to the culler)."""
        await self.until(p.arrival)
        plan = self.loop.create_task(self.follow(p))
        self.tasks.append(plan)
        await self.until(p.leave)
        if p.leave >= CLASS_MINUTES:
            return  # the end of class ends the run
        plan.cancel()
        await asyncio.gather(plan, return_exceptions=True)
        if p.name in self.asking:
            self.record(p, p.leave - self.asking[p.name])  # gave up waiting: left
        if not p.abandons:
            self.stop(p.name, "stopped")
            return
        self.set_busy(p.name, False)
        await self.until(p.leave + CULL_MINUTES)  # nobody there: the idle culler stops it
        self.stop(p.name, "culled: idle")

    async def follow(self, p: Person) -> None:
        work = p.stream("work")
        await self.get_gpu(p)
        plan = [("stretch", work.uniform(1, 4))]
        for k in range(p.part1):
            plan += [("burst", burst(work))] + ([("stretch", stretch(work))] if k < p.part1 - 1 else [])
        if p.part2:
            plan += [("part2", 0.0), ("stretch", work.uniform(1, 4))]
            for k in range(p.part2):
                plan += [("burst", burst(work))] + ([("stretch", stretch(work))] if k < p.part2 - 1 else [])
        for what, minutes in plan:
            if what == "part2":
                await self.until(LECTURE[1])
            else:
                await self.work(p, minutes, gpu=what == "burst")
        if p.stops_when_done:
            self.stop(p.name, "stopped")

    async def other(self, p: Person) -> None:
        await self.until(p.arrival)
        await self.get_gpu(p)
        if p.kind == "forgotten":
            return  # held, idle, never used in class
        if p.kind == "morning":
            await self.work(p, max(0.0, p.leave - 10 - self.minute()), gpu=True)  # busy until 10 min before
            await self.until(p.leave)
            if not p.abandons:
                self.stop(p.name, "stopped")
                return
            await self.until(p.leave + CULL_MINUTES)
            self.stop(p.name, "culled: idle")
            return
        await self.work(p, p.job_minutes if p.kind == "job" else 10 * CLASS_MINUTES, gpu=True)
        self.stop(p.name, "stopped")

    async def reclaim_loop(self) -> None:
        """The service's loop (``Reclaimer.run_forever``), keeping each pass's report."""
        while True:
            await asyncio.sleep(CHECK_SECONDS)
            report = await self.reclaimer.run_pass()
            self.result.warned += len(set(report.warned) - self.warned_now)  # new warnings only
            self.warned_now = set(report.warned)

    async def run(self) -> Result:
        self.tasks += [
            self.loop.create_task(self.student(p) if p.kind in ("student", "visitor") else self.other(p))
            for p in self.people.values()
        ]
        if self.reclaimer is not None:
            self.tasks.append(self.loop.create_task(self.reclaim_loop()))
        await self.until(CLASS_MINUTES)
        for uuid in list(self.on):
            self.count(uuid)
        for name, began in list(self.asking.items()):
            self.record(self.people[name], CLASS_MINUTES - began)  # still waiting at class end
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.result.never = sum(1 for p in self.people.values() if p.kind == "student" and p.name not in self.got_any)
        self.store.dispose()
        return self.result
