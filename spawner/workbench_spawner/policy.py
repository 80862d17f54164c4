"""The GPU policy: one object per hub process that decides who gets which GPU.

Spawner instances are per user server and come and go; the inventory, the
allocation store and the wait list must be shared by all of them, so the
spawner mixin asks ``shared_policy`` for the one instance that matches its
configuration. Backends never touch the store directly: they only turn a
lease into their runtime's words (environment, device requests).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass
from typing import Callable

from workbench_gpu_monitor.devices import DeviceInventory, GPUDevice

from .quota import QuotaBook
from .store import AllocationStore, Lease
from .waitlist import WaitList, WaitTimeout

log = logging.getLogger("workbench.policy")


class NoGPUAvailable(Exception):
    """The wait list timed out; str(err) is meant for the user."""


@dataclass
class GPUStatus:
    device: GPUDevice
    holders: list[tuple[str, str]]
    slots: int

    @property
    def free_slots(self) -> int:
        return max(0, self.slots - len(self.holders))


class GPUPolicy:
    def __init__(self, inventory: DeviceInventory, store: AllocationStore, slots_per_gpu: int = 1,
                 recheck_interval: float = 2.0):
        self.inventory = inventory
        self.store = store
        self.quotas = QuotaBook(store)
        self.slots_per_gpu = max(1, slots_per_gpu)
        self.waitlist: WaitList[Lease] = WaitList(recheck_interval)
        self._reconciled = False
        self._reconcile_lock = threading.Lock()

    @property
    def devices(self) -> list[GPUDevice]:
        return self.inventory.devices

    @property
    def shared(self) -> bool:
        return self.slots_per_gpu > 1

    def models(self) -> list[str]:
        return sorted({d.model for d in self.devices if d.model})

    def status(self) -> list[GPUStatus]:
        holders = self.store.holders()
        return [GPUStatus(d, holders.get(d.uuid, []), self.slots_per_gpu) for d in self.devices]

    def free_count(self, model: str | None = None) -> int:
        """GPUs a new server could get right now."""
        return sum(1 for s in self.status() if s.free_slots > 0 and (model is None or s.device.model == model))

    def held_by_user(self, user: str) -> int:
        return sum(len(lease.gpu_uuids) for lease in self.store.leases() if lease.user == user)

    def candidates(self, model: str | None) -> list[str]:
        return [d.uuid for d in self.devices if model is None or d.model == model]

    async def acquire(
        self,
        user: str,
        server: str,
        count: int,
        model: str | None,
        timeout: float,
        report: Callable[[int], None] = lambda ahead: None,
    ) -> Lease:
        """A lease of ``count`` GPUs, waiting in line when none are free."""
        candidates = self.candidates(model)

        async def try_take() -> Lease | None:
            return await asyncio.to_thread(
                self.store.allocate, user, server, count, candidates, self.slots_per_gpu
            )

        try:
            return await self.waitlist.wait_for(f"{user}/{server}", count, try_take, timeout, report)
        except WaitTimeout:
            what = f"{count} {model + ' ' if model else ''}GPU{'s' if count != 1 else ''}"
            raise NoGPUAvailable(
                f"No {what} became free within {timeout:g} seconds "
                f"({self.free_count(model)} free now, {len(self.waitlist.waiting())} still waiting). "
                "Try again later, ask for fewer GPUs, or start a CPU-only server (0 GPUs)."
            ) from None

    def release(self, user: str, server: str, reason: str) -> tuple[str, ...]:
        released = self.store.release(user, server, reason)
        if released:
            log.info("Released GPU(s) %s of %s/%s (%s)", ", ".join(released), user, server or "default", reason)
            self.waitlist.notify()
        return released

    def reconcile(
        self, is_alive: Callable[[Lease], bool | None], orphans: Callable[[], None] = lambda: None
    ) -> list[Lease]:
        """Release leases whose server is gone; run once per hub start.

        ``is_alive`` answers for one lease: True keep, False release, None
        unknown (kept; the spawner's poll will settle it). ``orphans`` then
        lets the backend deal with servers that run without a lease. Returns
        the leases released.
        """
        with self._reconcile_lock:
            if self._reconciled:
                return []
            self._reconciled = True
        released = []
        known = self.inventory.by_uuid()
        for lease in self.store.leases():
            missing = [u for u in lease.gpu_uuids if u not in known]
            if missing:
                log.warning("%s/%s holds GPU(s) no longer in the inventory: %s", lease.user, lease.server, missing)
            if is_alive(lease) is False:
                self.release(lease.user, lease.server, "reconcile: server gone")
                released.append(lease)
            else:
                log.info("Kept lease of %s/%s on %s after restart", lease.user, lease.server or "default",
                         ", ".join(lease.gpu_uuids))
        orphans()
        return released


_policies: dict[tuple, GPUPolicy] = {}
_policies_lock = threading.Lock()


def shared_policy(key: tuple, build: Callable[[], GPUPolicy]) -> GPUPolicy:
    """The process-wide policy for this configuration key, built once."""
    with _policies_lock:
        policy = _policies.get(key)
        if policy is None:
            policy = _policies[key] = build()
        return policy
