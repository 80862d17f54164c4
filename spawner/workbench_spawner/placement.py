"""Placement: which GPUs on which node an admitted request gets.

Two kinds of backend place differently. On one host we place: a transaction
in the GPU database picks free GPUs, and a first-come, first-served wait list
holds the rest (``HostAllocator``, for the local and docker backends). On an
engine such as Slurm the engine places, and the backend learns the node and
GPUs back; its queue is the wait. Both end in the same place: a ``Lease`` in
the ledger (``AllocationStore``), which the fleet view, metrics, GPU-hours
and reconcile read. ``Placement`` is that small common interface.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from typing import Callable

from workbench_devices import DeviceInventory

from .store import AllocationStore, Lease
from .waitlist import WaitList, WaitTimeout

log = logging.getLogger("workbench.placement")

Report = Callable[[int], None]


class NoGPUAvailable(Exception):
    """Nothing could be placed within the wait; str(err) is meant for the user."""


class Placement(ABC):
    """Turns an admitted request into a lease in the ledger, waiting if it must."""

    def __init__(self, store: AllocationStore):
        self.store = store

    @abstractmethod
    async def place(self, user: str, server: str, count: int, model: str | None, timeout: float,
                    report: Report = lambda ahead: None) -> Lease:
        """A lease of ``count`` GPUs (of ``model``), or NoGPUAvailable after ``timeout`` s."""

    def release(self, user: str, server: str, reason: str) -> tuple[str, ...]:
        """End the lease (the ledger keeps it); blocking, so call it from a worker thread."""
        released = self.store.release(user, server, reason)
        if released:
            log.info("Released GPU(s) %s of %s/%s (%s)", ", ".join(released), user, server or "default", reason)
            self.released()
        return released

    def released(self) -> None:
        """Hook: GPUs came free (wake whoever waits). Called from any thread."""

    def waiting(self) -> int:
        """Requests waiting for GPUs now."""
        return 0


class HostAllocator(Placement):
    """Our own placement on one host: a database transaction plus a FIFO wait list."""

    def __init__(self, store: AllocationStore, inventory: DeviceInventory, node: str,
                 slots_per_gpu: int = 1, recheck_interval: float = 2.0):
        super().__init__(store)
        self.inventory = inventory
        self.node = node
        self.slots_per_gpu = max(1, slots_per_gpu)
        self.waitlist: WaitList[Lease] = WaitList(recheck_interval)

    def candidates(self, model: str | None) -> list[str]:
        return [d.uuid for d in self.inventory.devices if model is None or d.model == model]

    def free_count(self, model: str | None = None) -> int:
        """GPUs a new server could get right now (reads the database: call from a thread)."""
        holders = self.store.holders()
        return sum(1 for uuid in self.candidates(model) if len(holders.get(uuid, [])) < self.slots_per_gpu)

    async def place(self, user: str, server: str, count: int, model: str | None, timeout: float,
                    report: Report = lambda ahead: None) -> Lease:
        candidates = self.candidates(model)

        async def try_take() -> Lease | None:
            return await asyncio.to_thread(self.store.allocate, user, server, count, candidates,
                                           self.slots_per_gpu, node=self.node)

        try:
            return await self.waitlist.wait_for(f"{user}/{server}", count, try_take, timeout, report)
        except WaitTimeout:
            free = await asyncio.to_thread(self.free_count, model)
            what = f"{count} {model + ' ' if model else ''}GPU{'s' if count != 1 else ''}"
            raise NoGPUAvailable(
                f"No {what} became free within {timeout:g} seconds "
                f"({free} free now, {len(self.waitlist.waiting())} still waiting). "
                "Try again later, ask for fewer GPUs, or start a CPU-only server (0 GPUs)."
            ) from None

    def released(self) -> None:
        self.waitlist.notify()

    def waiting(self) -> int:
        return len(self.waitlist.waiting())
