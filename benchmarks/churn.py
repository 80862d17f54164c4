"""An hour of a class's churn, compressed: does the GPU ledger stay true while the world changes?

Drives the project's own life cycle (``GPUSpawnerMixin``: admission, the wait list, placement, the
ledger, stop and poll; ``GPUPolicy``'s reconciler loop and inventory re-reads) over the contract's
reference host backend (``tests/unit/fake_backends.py``: servers are Python objects in a
``FakeWorld``, the runtime's truth), on a real GPU database and a simulated GPU layout in a file.
For ``--seconds`` (90) of wall-clock time, ``--students`` (120) students:

* ask for a whole GPU or a ``1g.18gb`` slice of the H200, wait in line, work a while and stop;
* one in four gives up while waiting (the task is cancelled, then the hub stops the server one
  second later, as JupyterHub's DELETE of a pending spawn does);
* one in six of the running servers dies on its own without the hub's poll noticing (only the
  reconciler can close its lease);

and the world changes under them:

* at 35 % of the run the H200's layout is cut again (``7x1g.18gb`` to ``3x2g.35gb``), at 65 %
  back, while slices are held (the GPU must wait for its servers, never hand a device out twice);
* from 45 % to 55 % the runtime cannot be asked (an engine outage: ``gpu_lease_alive`` answers
  None); five servers are deleted out there meanwhile; when it answers again the reconciler is
  woken (``reconcile_soon``) and must close their leases.

Sampled every 50 ms, from the world's side: **devices double-held** (two running servers on one
device, or a whole GPU and one of its slices both in use; target 0 at every sample) and the
ledger's **drift** (leases whose server is gone, servers running without a lease: found and
fixed by the reconciler, counted). At the end everyone stops: **orphans** (servers running that
the hub does not track) and leftover leases must be 0.

Then the reconciler's **cost per pass** at 2,000 leases (2,000 simulated GPUs, every server alive):
the median of 20 ``reconcile_now()`` passes, against a target of 50 ms on this machine.

    .venv/bin/python benchmarks/churn.py [--students 120] [--seconds 90] [--seed 7] [--out FILE]

Simulated GPUs and a simulated runtime: it measures the ledger's rules and their cost, not real
servers (tests/integration has those).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import platform
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.unit's fakes

from jupyterhub.spawner import SpawnException

from tests.unit.fake_backends import FakeHostSpawner, FakeWorld
from workbench_devices import parse_simulated_spec
from workbench_spawner.ledger import reasons
from workbench_spawner.ledger.reconcile_book import ReconcileBook
from workbench_spawner.ledger.store import AllocationStore
from workbench_spawner.policy.gpu_policy import GPUPolicy, _policies

WHOLE = "4xH100-80GB"
LAYOUTS = (f"{WHOLE},1xH200-141GB:mig=7x1g.18gb", f"{WHOLE},1xH200-141GB:mig=3x2g.35gb")


def physical_gpus() -> dict[str, str]:
    """Every device any layout of the run has -> the physical GPU it is (itself, or a slice's GPU)."""
    of: dict[str, str] = {}
    for spec in LAYOUTS:
        for d in parse_simulated_spec(spec):
            of[d.uuid] = d.parent_uuid if d.mig and d.parent_uuid else d.uuid
    return of


@dataclass
class Churn:
    """What the run saw."""

    samples: int = 0
    double_held_max: int = 0
    double_held_samples: int = 0
    stale_leases_max: int = 0  # leases whose server is gone (the reconciler's to close)
    unleased_servers_max: int = 0  # servers running without a lease (the reconciler's to adopt or end)
    spawns: int = 0
    served: int = 0
    refused: int = 0
    cancelled: int = 0
    stopped: int = 0
    died: int = 0
    deleted_in_outage: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    fixes: dict[str, int] = field(default_factory=dict)
    orphans_at_end: int = 0
    leases_at_end: int = 0
    layout_waits_seen: int = 0


class Lab:
    """The hub's side (one policy, a spawner per student) and the world's side (``FakeWorld``)."""

    def __init__(self, workdir: Path, seconds: float) -> None:
        self.layout = workdir / "layout.txt"
        self.layout.write_text(LAYOUTS[0])
        self.url = f"sqlite:///{workdir / 'workbench.sqlite'}"
        self.world = FakeWorld()
        self.seconds = seconds
        self.spawners: dict[str, FakeHostSpawner] = {}
        self.of = physical_gpus()

    def spawner(self, user: str) -> FakeHostSpawner:
        spawner = self.spawners.get(user)
        if spawner is None:
            spawner = FakeHostSpawner(
                user=SimpleNamespace(name=user, url=f"/user/{user}/", escaped_name=user),
                hub=SimpleNamespace(public_host="", api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/"),
                orm_spawner=SimpleNamespace(name="", server=None),
                gpu_db_url=self.url,
                simulated_gpus=f"@{self.layout}",
                inventory_refresh_seconds=0.5,
                reconcile_seconds=1.0,
                gpu_queue_timeout=max(5.0, self.seconds / 6),
                gpu_queue_recheck_interval=0.5,
            )
            spawner.world = self.world
            self.spawners[user] = spawner
        return spawner

    @property
    def policy(self) -> GPUPolicy:
        return next(iter(self.spawners.values())).gpu_policy

    def double_held(self) -> int:
        """Devices (or physical GPUs) that two running servers use at once, as the world has it."""
        by_device: dict[str, int] = {}
        whole: dict[str, int] = {}
        sliced: dict[str, int] = {}
        for _user, _server, uuids in list(self.world.running.values()):
            for uuid in uuids:
                by_device[uuid] = by_device.get(uuid, 0) + 1
                gpu = self.of.get(uuid, uuid)
                (whole if gpu == uuid else sliced)[gpu] = (whole if gpu == uuid else sliced).get(gpu, 0) + 1
        twice = sum(1 for n in by_device.values() if n > 1)
        return twice + sum(1 for gpu in whole if gpu in sliced)


async def student(lab: Lab, user: str, rng: random.Random, churn: Churn, start_at: float, end_at: float) -> None:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, start_at - loop.time()))
    spawner = lab.spawner(user)
    while loop.time() < end_at - 2:
        options = {"gpus": 1, "gpu_profile": "1g.18gb"} if rng.random() < 0.4 else {"gpus": 1}
        try:
            await spawner._apply_gpu_options(options)
        except SpawnException:  # no such profile now (the layout changed): ask for a whole GPU
            await spawner._apply_gpu_options({"gpus": 1})
        churn.spawns += 1
        lab.world.ended.pop(spawner.runtime_key(), None)  # a new server under the same ref: no old reason
        starting = asyncio.ensure_future(spawner.start())
        give_up = rng.random() < 0.25
        try:
            if give_up:
                await asyncio.wait_for(asyncio.shield(starting), rng.uniform(0.2, 3.0))
            else:
                await starting
        except TimeoutError:
            # The student stops a pending spawn: JupyterHub cancels the start, waits a second, then stops.
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            await asyncio.sleep(1.0)
            await spawner.stop()
            churn.cancelled += 1
            await asyncio.sleep(rng.uniform(0.5, 3.0))
            continue
        except SpawnException:  # refused at the queue timeout, or the layout took the asked profile away
            churn.refused += 1
            await asyncio.sleep(rng.uniform(0.5, 3.0))
            continue
        churn.served += 1
        work = rng.uniform(2.0, lab.seconds / 6)
        if rng.random() < 1 / 6:
            await asyncio.sleep(work / 2)
            # Dies out there; nobody polls it here: only the reconciler can find out.
            ref = spawner.runtime_key()
            if lab.world.running.pop(ref, None) is not None:
                lab.world.ended[ref] = reasons.SERVER_EXITED
                spawner.alive = False
                churn.died += 1
        else:
            await asyncio.sleep(work)
            if spawner.alive:
                await spawner.stop()
                churn.stopped += 1
        # A server that ended out there (died, deleted) looks running to the hub until its lease is closed:
        # JupyterHub starts no server it believes runs, so the student waits for the reconciler first.
        while await asyncio.to_thread(spawner.gpu_policy.store.lease_of, user, "") is not None:
            await asyncio.sleep(0.2)
        await asyncio.sleep(rng.uniform(0.5, 4.0))


async def world_changes(lab: Lab, churn: Churn, rng: random.Random, t0: float) -> None:
    """The layout is cut again and back; the runtime is away for a while and servers are deleted meanwhile."""
    loop = asyncio.get_running_loop()

    async def at(fraction: float) -> None:
        await asyncio.sleep(max(0.0, t0 + fraction * lab.seconds - loop.time()))

    await at(0.35)
    lab.layout.write_text(LAYOUTS[1])
    await at(0.45)
    lab.world.answers = False  # the engine cannot be asked
    await at(0.48)
    running = list(lab.world.running)
    for ref in rng.sample(running, min(5, len(running))):
        if lab.world.running.pop(ref, None) is not None:
            lab.world.ended[ref] = reasons.POD_DELETED
            lab.spawners[ref.removeprefix("fake:").split("/")[0]].alive = False
            churn.deleted_in_outage += 1
    await at(0.55)
    lab.world.answers = True
    lab.policy.reconcile_soon()  # the engine's view came back: as the Kubernetes watch does
    await at(0.65)
    lab.layout.write_text(LAYOUTS[0])


async def sample(lab: Lab, churn: Churn, until: float) -> None:
    loop = asyncio.get_running_loop()
    while loop.time() < until:
        if lab.spawners:
            double = lab.double_held()
            churn.samples += 1
            churn.double_held_max = max(churn.double_held_max, double)
            churn.double_held_samples += bool(double)
            leases = await asyncio.to_thread(lab.policy.store.leases)
            refs = {lease.ref for lease in leases if lease.ref}
            churn.stale_leases_max = max(churn.stale_leases_max, len(refs - set(lab.world.running)))
            churn.unleased_servers_max = max(churn.unleased_servers_max, len(set(lab.world.running) - refs))
            churn.layout_waits_seen = max(churn.layout_waits_seen, len(lab.policy.layout_waiting))
        await asyncio.sleep(0.05)


async def run_churn(students: int, seconds: float, seed: int, workdir: Path) -> Churn:
    rng = random.Random(seed)
    lab = Lab(workdir, seconds)
    churn = Churn()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    end = t0 + seconds
    lab.spawner("warmup")  # the policy exists before the first sample
    policy = await asyncio.to_thread(lambda: lab.policy)
    # The grace a fresh lease gets from the reconciler (10 s in a hub), compressed with the hour.
    policy.reconcile_grace_seconds = 1.0
    tasks = [
        asyncio.ensure_future(
            student(lab, f"s{i:03d}", random.Random(rng.random()), churn, t0 + rng.uniform(0, seconds * 0.6), end)
        )
        for i in range(students)
    ]
    changes = asyncio.ensure_future(world_changes(lab, churn, random.Random(seed + 1), t0))
    sampler = asyncio.ensure_future(sample(lab, churn, end + 10))
    await asyncio.gather(*tasks, changes)
    # Class is over: everyone still running stops; the reconciler and the layout settle.
    for spawner in lab.spawners.values():
        if spawner.alive:
            await spawner.stop()
    await asyncio.sleep(3)  # past the grace: the last pass sees every lease
    await asyncio.to_thread(policy.reconcile_now)
    await sampler
    churn.orphans_at_end = len(lab.world.running)
    churn.leases_at_end = len(policy.store.leases())
    for row in policy.store.usage():
        churn.reasons[reasons.reason_kind(row.reason)] = churn.reasons.get(reasons.reason_kind(row.reason), 0) + 1
    churn.fixes = ReconcileBook(policy.store).counts()
    policy.stop_reconciler()
    return churn


def reconciler_cost(workdir: Path, leases: int = 2000, passes: int = 20) -> dict:
    """Median and p95 wall time of one reconciler pass over ``leases`` live leases (SQLite, every server alive)."""
    from workbench_devices import DeviceInventory, GPUDevice
    from workbench_spawner.policy.settings import PolicySettings

    url = f"sqlite:///{workdir / 'cost.sqlite'}"
    # More GPUs than a simulated spec allows (64): a cluster's worth, made directly.
    devices = [
        GPUDevice(f"GPU-bench-{i:05d}", i, "NVIDIA H100 80GB HBM3", 80 << 30, model="H100-80GB", simulated=True)
        for i in range(leases)
    ]
    store = AllocationStore(url)
    world = FakeWorld()
    for i, d in enumerate(devices):
        ref = f"fake:u{i}/"
        store.adopt(f"u{i}", "", [d.uuid], ref)
        world.running[ref] = (f"u{i}", "", (d.uuid,))
    settings = PolicySettings(url, DeviceInventory("simulated", devices, "simulated"), node="n1", reconcile_seconds=0)
    policy = GPUPolicy(settings, store)
    from tests.unit.fake_backends import adopt_orphans

    def alive(lease) -> bool:
        return lease.ref in world.running

    policy.reconcile(alive, lambda: adopt_orphans(world, policy), lambda lease: None)
    policy.reconcile_grace_seconds = 0
    times = []
    for _ in range(passes):
        t = time.perf_counter()
        closed = policy.reconcile_now()
        times.append((time.perf_counter() - t) * 1000)
        assert closed == [], "a live lease was closed"
    policy.stop_reconciler()
    times.sort()
    return {
        "leases": leases,
        "passes": passes,
        "median_ms": round(statistics.median(times), 1),
        "p95_ms": round(times[int(0.95 * (passes - 1))], 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=120)
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--leases", type=int, default=2000)
    parser.add_argument("--out", type=Path, help="write the results as JSON here too")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    _policies.clear()
    with tempfile.TemporaryDirectory(prefix="wb-churn-") as tmp:
        started = time.monotonic()
        churn = asyncio.run(run_churn(args.students, args.seconds, args.seed, Path(tmp)))
        churn_s = time.monotonic() - started
        cost = reconciler_cost(Path(tmp), args.leases)
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} ({platform.machine()}, {__import__('os').cpu_count()} cores)",
        "python": platform.python_version(),
        "students": args.students,
        "seconds": args.seconds,
        "seed": args.seed,
        "wall_s": round(churn_s, 1),
        "churn": churn.__dict__,
        "reconciler_cost": cost,
        "targets": {
            "double_held_max": 0,
            "orphans_at_end": 0,
            "leases_at_end": 0,
            "reconciler_median_ms_under": 50,
        },
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    ok = (
        churn.double_held_max == 0 and churn.orphans_at_end == 0 and churn.leases_at_end == 0 and cost["median_ms"] < 50
    )
    print("targets met" if ok else "TARGETS MISSED", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
