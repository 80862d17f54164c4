"""The contract's reference implementations: a fake host backend and a fake engine backend.

They keep the backend contract (``workbench_spawner.mixin``) over a runtime
made of Python objects, so the policy's life cycle can be tested in
milliseconds: ``tests/conformance/test_conformance.py`` runs the same
scenarios against them as against the real backends' classes, and the
lifecycle and quota tests spawn through them. ``FakeWorld`` is what runs
"out there": the servers the runtime knows, by lease ref, including ones
that run without a lease (orphans after a hub restart).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from jupyterhub.spawner import Spawner

from workbench_devices import DeviceInventory, discover_devices
from workbench_spawner.ledger.lease_limits import LeaseLimits
from workbench_spawner.ledger.reconcile_book import SERVER_ADOPTED, SERVER_STOPPED
from workbench_spawner.ledger.store import AllocationStore, Lease
from workbench_spawner.mixin import GPUSpawnerMixin
from workbench_spawner.placement.engine import EngineJob, EnginePlacement
from workbench_spawner.placement.engine_spawner import EngineSpawner
from workbench_spawner.placement.host import NoGPUAvailableError, Report, _nothing
from workbench_spawner.policy.gpu_policy import GPUPolicy
from workbench_spawner.policy.settings import PolicySettings


@dataclass
class FakeWorld:
    """The runtime's truth: which servers run (ref -> (user, server, GPUs)), and what was cancelled."""

    running: dict[str, tuple[str, str, tuple[str, ...]]] = field(default_factory=dict)
    cancelled: list[str] = field(default_factory=list)
    answers: bool = True  # False: the runtime cannot be asked (gpu_lease_alive says None)
    # Why a server ended out there, by ref, in the ledger's words (what gpu_lease_gone_reason reports).
    ended: dict[str, str] = field(default_factory=dict)


class FakeRuntime(Spawner):
    """A runtime whose start can succeed, fail or hang, and whose server can die."""

    behaviour = "ok"
    alive = False
    world: FakeWorld | None = None  # None: the runtime cannot tell (gpu_lease_alive answers None)

    async def start(self):
        if self.behaviour == "fail":
            raise RuntimeError("image not found")
        if self.behaviour == "hang":
            await asyncio.sleep(3600)
        self.alive = True
        if self.world is not None:
            self.world.running[self.runtime_key()] = (
                self.user.name,
                self.name,
                tuple(getattr(self, "gpu_uuids", ())),
            )
        return "http://127.0.0.1:9999"

    async def stop(self, now=False):
        if self.world is not None:
            self.world.running.pop(self.runtime_key(), None)
        self.alive = False

    def runtime_key(self) -> str:
        """This server's entry in the ``world``."""
        return f"fake:{self.user.name}/{self.name}"

    async def poll(self):
        if self.alive and self.world is not None and self.runtime_key() not in self.world.running:
            self.alive = False  # ended out there (killed, cancelled): the runtime says so
        return None if self.alive else 0


class WorldReconcile:
    """Both fakes' answers to the reconciler, from what runs in the ``world`` (their runtime's truth)."""

    def gpu_lease_alive(self, lease: Lease) -> bool | None:
        if self.world is None or not self.world.answers:
            return None
        return lease.ref in self.world.running

    def gpu_lease_gone_reason(self, lease: Lease) -> str | None:
        return self.world.ended.get(lease.ref) if self.world is not None else None

    def gpu_reconcile_orphans(self) -> None:
        adopt_orphans(self.world, self.gpu_policy)


class FakeHostSpawner(WorldReconcile, GPUSpawnerMixin, FakeRuntime):
    """Host placement: the policy leases GPUs, then the fake runtime starts the server with them."""

    workbench_backend = "fake-host"
    placement_mode = "host"

    def gpu_environment(self, uuids: list[str]) -> dict[str, str]:
        return {"FAKE_VISIBLE_DEVICES": ",".join(uuids)}

    def gpu_lease_ref(self) -> str:
        return self.runtime_key() if self.alive else ""


def adopt_orphans(world: FakeWorld | None, policy: GPUPolicy) -> None:
    """The documented rule of both fakes: adopt a server without a lease if its GPUs are free, else end it;
    never one whose spawn is in flight or whose lease is being written (``orphan_now``), on any pass."""
    if world is None:
        return
    store = policy.store
    leased = {lease.ref for lease in store.leases()}
    for ref, (user, server, uuids) in list(world.running.items()):
        if ref in leased or not uuids or not policy.orphan_now(user, server) or ref not in world.running:
            continue
        if store.adopt(user, server, list(uuids), ref):
            policy.record_fix(SERVER_ADOPTED, f"reconcile: adopted {ref} of {user}/{server}")
        else:
            world.running.pop(ref, None)
            world.cancelled.append(ref)
            policy.record_fix(SERVER_STOPPED, f"reconcile: ended {ref} of {user}/{server}: its GPUs are leased")


class FakeEnginePlacement(EnginePlacement):
    """An engine that places at once on the first free GPUs, or keeps the job pending until the deadline."""

    def __init__(self, store: AllocationStore, inventory: DeviceInventory, poll: float = 0.01):
        super().__init__(store)
        self.inventory = inventory
        self.poll = poll
        self.clock = time.monotonic
        self.admitted: set[str] = set()

    async def admit_to_queue(
        self,
        key: str,
        count: int,
        model: str | None,
        groups: Sequence[str],
        deadline: float,
        describe=lambda text: None,
    ) -> None:
        self.admitted.add(key)

    def withdraw(self, key: str) -> None:
        self.admitted.discard(key)

    async def place(
        self,
        user: str,
        server: str,
        count: int,
        model: str | None,
        timeout: float,
        report: Report = _nothing,
        groups: Sequence[str] = (),
        job: EngineJob | None = None,
        limits: LeaseLimits | None = None,
    ) -> Lease | None:
        if job is None:
            raise NoGPUAvailableError("nothing was submitted")
        self.withdraw(job.admitted)
        deadline = job.deadline if job.deadline is not None else self.clock() + timeout
        if limits is not None:  # as the engine template: a refusal names what the other servers hold
            limits = dataclasses.replace(limits, kind=model, kinds={d.uuid: d.kind for d in self.inventory.devices})
        while True:
            held = {u for lease in self.store.leases() for u in lease.gpu_uuids}
            free = [d.uuid for d in self.inventory.devices if d.uuid not in held and model in (None, d.model)]
            if not count:
                return None
            adopt = functools.partial(
                self.store.adopt, user, server, free[:count], f"engine:{job.job_id}", None, "node-1", tuple(groups)
            )
            if len(free) >= count and await asyncio.to_thread(adopt, limits=limits):
                return await asyncio.to_thread(self.store.lease_of, user, server)
            job.describe(f"The engine keeps job {job.job_id} pending: Resources")
            if self.clock() >= deadline:
                raise NoGPUAvailableError(f"The engine did not start job {job.job_id} in time; it was cancelled.")
            await asyncio.sleep(self.poll)


class FakeEngineSpawner(WorldReconcile, EngineSpawner, FakeRuntime):
    """Engine placement (``EngineSpawner``, as the real engines): the policy admits, the fake engine places and the
    lease is learned back."""

    workbench_backend = "fake-engine"
    lease_ref_prefix = "engine"
    _ids = itertools.count(1)

    def engine_inventory(self) -> DeviceInventory:
        return discover_devices(self.simulated_gpus or "2")

    def engine_placement(self, settings: PolicySettings, store: AllocationStore) -> FakeEnginePlacement:
        return FakeEnginePlacement(store, settings.inventory)

    async def engine_submit(self) -> EngineJob:
        if self.behaviour == "fail":
            from jupyterhub.spawner import SpawnException

            raise SpawnException(
                "The engine refused the job: no such partition.", reason="engine_refused", status_code=400
            )
        self.job_id = str(next(self._ids))
        return EngineJob(job_id=self.job_id)

    async def engine_connect(self, lease: Lease | None) -> tuple[str, int]:
        if self.behaviour == "hang":
            await asyncio.sleep(3600)
        self.alive = True
        if self.world is not None:
            self.world.running[self.gpu_lease_ref()] = (self.user.name, self.name, tuple(self.gpu_uuids))
        return "127.0.0.1", 9999

    async def engine_cancel(self) -> None:
        job_id = getattr(self, "job_id", "")
        if job_id and self.world is not None:
            self.world.cancelled.append(f"engine:{job_id}")
            self.world.running.pop(f"engine:{job_id}", None)
        self.job_id = ""

    def gpu_lease_ref(self) -> str:
        return f"{self.lease_ref_prefix}:{self.job_id}" if getattr(self, "job_id", "") else ""

    def runtime_key(self) -> str:
        return self.gpu_lease_ref()

    async def stop(self, now=False):
        await self.engine_cancel()
        await super().stop(now=now)

    def get_state(self):
        state = super().get_state()
        if getattr(self, "job_id", ""):
            state["job_id"] = self.job_id  # as batchspawner keeps it: the job outlives a hub restart
        return state

    def load_state(self, state):
        super().load_state(state)
        self.job_id = state.get("job_id", "")

    def clear_state(self):
        super().clear_state()
        self.job_id = ""
