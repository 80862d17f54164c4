"""The GPU policy: admission, placement and the ledger, one per hub process.

Spawner instances are per user server and come and go; the settings, the
ledger (the allocation store), the quota book and the placement must be
shared by all of them, so the spawner mixin asks ``shared_policy`` for the
one instance that matches its settings. Backends never touch the store
directly: they translate a lease into their runtime's words (environment,
device requests, a batch job).

Every method that reads or writes the database blocks: the spawner calls
them through ``asyncio.to_thread`` so the hub's event loop never waits on
SQL. ``place`` is the one coroutine.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from workbench_devices import DeviceInventory, GPUDevice
from workbench_spawner.form.options import device_matches
from workbench_spawner.ledger import endings
from workbench_spawner.ledger.drain_book import DrainBook, is_drained
from workbench_spawner.ledger.endings import SILENT, Ending
from workbench_spawner.ledger.gpu_hours import gpu_hours_used
from workbench_spawner.ledger.lease_limits import LeaseLimits, others_holding
from workbench_spawner.ledger.notices import NoticeBook
from workbench_spawner.ledger.quota_book import QuotaBook
from workbench_spawner.ledger.reservation_book import ReservationBook
from workbench_spawner.ledger.store import AllocationStore, Lease
from workbench_spawner.placement.engine import EnginePlacement
from workbench_spawner.placement.host import HostAllocator, NoGPUAvailableError, Placement, Report, holdings
from workbench_spawner.placement.start_line import StartLine
from workbench_spawner.policy.clock import hub_clock, zone
from workbench_spawner.policy.inventory_refresh import (
    LayoutWait,
    held_for_layout,
    merge_layouts,
    store_layout_waiting,
)
from workbench_spawner.policy.reconciler import LAYOUT_CHANGED, Reconciler, slices_gone
from workbench_spawner.policy.settings import PolicySettings, load_policy_settings, store_policy_settings
from workbench_spawner.rules.admission import AdmissionContext
from workbench_spawner.rules.reservations import reserved_now

log = logging.getLogger("workbench.policy")

__all__ = ["GPUPolicy", "GPUStatus", "NoGPUAvailableError", "shared_policy"]


@dataclass
class GPUStatus:
    """One device as the spawn form and admission see it. ``drained``: an admin closed it to new
    servers (``drain_book``); its holders keep running, and it has no free slot for anyone else.
    ``unavailable``: why the engine gives it to no new server now (its node is down, drained, not
    responding: ``EnginePlacement.unusable``), "" when it would; such a device is neither free nor in
    use for the form, admission and the wait sentence."""

    device: GPUDevice
    holders: list[tuple[str, str]]
    slots: int
    drained: bool = False
    unavailable: str = ""

    @property
    def free_slots(self) -> int:
        return 0 if self.drained or self.unavailable else max(0, self.slots - len(self.holders))


class GPUPolicy(Reconciler):
    def __init__(
        self,
        settings: PolicySettings,
        store: AllocationStore,
        placement: Placement | None = None,
        recheck_interval: float = 2.0,
    ):
        self.settings = settings
        self.store = store
        self.tz = zone(settings.time_zone)
        self.clock = hub_clock(settings.test_clock_file)
        # Courses run from their start date to their end date in the hub's time zone, by the hub's clock.
        self.quotas = QuotaBook(store, today=lambda: self.clock().astimezone(self.tz).date())
        self.placement = placement or HostAllocator(
            store,
            settings.inventory,
            settings.node,
            settings.slots(),
            recheck_interval,
            settings.queue_order,
            settings.queue_aging_minutes,
            self.tz,
            self.clock,
        )
        # Spawns in line and servers starting at once, for a class pressing Start together (start_line.py).
        limits = settings.spawn_limits()
        self.start_line = StartLine(limits.max_waiting, limits.max_starting)
        # (user, server) of every spawn between start() and its lease being recorded with a ref: the
        # reconciler leaves those alone (a job submitted, a process forked, its lease not written yet).
        self.starting: set[tuple[str, str]] = set()
        # (user, server) of every stop in progress: the stop releases with its own reason (who asked), so the
        # reconciler must not close the lease first as "server gone" when the process ends before the release.
        self.stopping: set[tuple[str, str]] = set()
        self._init_reconciler()
        # Re-reads the inventory now and then where the hub places GPUs itself (``inventory_refresh``;
        # the spawner sets it): True when a changed one was adopted.
        self.refresh_inventory: Callable[[], bool] = lambda: False
        # The inventory last read (``adopt_inventory``); the one in force (``settings.inventory``) differs
        # where a GPU's new layout waits for the servers on devices it removes (``layout_waiting``).
        self.inventory_read: DeviceInventory = settings.inventory
        self.layout_waiting: list[LayoutWait] = []
        self._layout_lock = threading.RLock()

    @property
    def inventory(self) -> DeviceInventory:
        return self.settings.inventory

    @property
    def devices(self) -> list[GPUDevice]:
        return self.inventory.devices

    @property
    def shared(self) -> bool:
        """Whether any device is time-sliced (more than one server may hold it)."""
        return any(slots > 1 for slots in self.settings.slots().values())

    def models(self) -> list[str]:
        return self.settings.models()

    def sharing(self) -> tuple[tuple[GPUDevice, int], ...]:
        """Every device with its slots where this hub time-slices some device and places GPUs itself
        (admission's ``shared_gpus`` rule); empty otherwise: an engine shares nothing of ours."""
        if isinstance(self.placement, EnginePlacement):
            return ()
        slots = self.settings.slots()  # once: ``shared`` would read them again
        if all(n == 1 for n in slots.values()):
            return ()
        return tuple((d, slots[d.uuid]) for d in self.devices)

    # -- reads (blocking) ---------------------------------------------------------

    def status(
        self, *, leases: Sequence[Lease] | None = None, inventory: DeviceInventory | None = None
    ) -> list[GPUStatus]:
        """Every device with its holders. ``leases`` and ``inventory``: read already by the caller (the spawn
        form reads each once per render and hands them to every read here); left out, read now."""
        if leases is None:
            holders = self.store.holders()
        else:  # as ``store.holders()``: GPU UUID -> [(user, server), ...] in lease order
            holders = {}
            for lease in leases:
                for uuid in lease.gpu_uuids:
                    holders.setdefault(uuid, []).append((lease.user, lease.server))
        engine = isinstance(self.placement, EnginePlacement)
        # Only the hub's own placement reads drains; where an engine places, a stored drain closes nothing,
        # and the engine says itself which devices it would not hand out now (a node down or drained).
        drained = set() if engine else DrainBook(self.store).drained()
        slots = self.settings.slots()
        devices = self.devices if inventory is None else inventory.devices
        waiting = self.layout_held_back()  # a GPU whose layout change waits takes no new server either
        unusable = self.placement.unusable(devices) if isinstance(self.placement, EnginePlacement) else {}
        return [
            GPUStatus(
                d,
                holders.get(d.uuid, []),
                slots[d.uuid],
                is_drained(d, drained) or d.uuid in waiting,
                unusable.get(d.uuid, ""),
            )
            for d in devices
        ]

    def free_count(self, kind: str | None = None) -> int:
        """GPUs (or slices, for a MIG profile's ``kind``) a new server could get right now."""
        return sum(1 for s in self.status() if s.free_slots > 0 and device_matches(s.device, kind))

    def shares(self) -> dict[str, float]:
        """Each device's share of a GPU (a ``1g`` MIG slice 1/7): what a lease records for GPU-hours."""
        return {d.uuid: d.share for d in self.inventory.devices}

    def held_by_user(self, user: str, *, leases: Sequence[Lease] | None = None) -> int:
        """Devices ``user`` holds now, over all their servers (``leases``: read already; left out, read now)."""
        return sum(
            len(lease.gpu_uuids) for lease in (self.store.leases() if leases is None else leases) if lease.user == user
        )

    def admission_context(
        self,
        user: str,
        server: str,
        groups: list[str],
        *,
        leases: Sequence[Lease] | None = None,
        status: Sequence[GPUStatus] | None = None,
        inventory: DeviceInventory | None = None,
        **rules: Any,
    ) -> AdmissionContext:
        """Everything admission looks at for one spawn, read in one go.

        ``rules`` are the spawner's own settings (default_gpus, offered_images,
        profiles); the quota default, CPU rule and contact come from the
        stored settings so the hub and the service agree. ``leases``,
        ``status`` and ``inventory``: what the caller read already (the spawn
        form, once per render); left out, read here, the leases once for
        what the user holds, the free devices and the GPU-hours alike.
        """
        effective = self.quotas.effective(user, groups, self.settings.default_quota)
        if leases is None:
            leases = self.store.leases()
        devices = self.devices if inventory is None else inventory.devices
        # What each other server of the user holds, named in a refusal over quota as the lease's check names it.
        others = others_holding(leases, user, server, {d.uuid: d.kind for d in devices})
        if status is None:
            status = self.status(leases=leases, inventory=inventory)
        free_by_model: dict[str, int] = {}  # whole GPUs by model, slices by kind ("H200-141GB 1g.18gb")
        for s in status:
            if s.free_slots > 0 and s.device.model:
                free_by_model[s.device.kind] = free_by_model.get(s.device.kind, 0) + 1
        return AdmissionContext(
            quota=effective,
            inventory_size=sum(1 for d in devices if not d.mig),
            inventory_models=self.settings.whole_models(),
            slices=self.settings.slices(),
            pins_slices=self.placement.pins_slices,
            sharing=self.sharing(),
            others=others,
            gpu_hours_used=gpu_hours_used(self.store, user, leases=leases),
            free_by_model=free_by_model,
            cpu_servers_allowed=self.settings.cpu_servers_allowed,
            contact=self.settings.quota_contact,
            **rules,
        )

    def reserved_now(
        self, groups: list[str], *, leases: Sequence[Lease] | None = None, inventory: DeviceInventory | None = None
    ) -> list[str]:
        """What the open reservations hold for their members now, one sentence each, for the spawn form.

        After a grace period that is what members hold or wait for (``reservations.reserved_now``).
        ``leases``, ``inventory``: read already by the caller; left out, read here when a window is open."""
        now = self.clock()
        open_now = ReservationBook(self.store).open_at(now, self.tz)
        if not open_now:
            return []  # the usual case: no lease read
        if inventory is None:
            inventory = self.inventory
        return reserved_now(
            open_now,
            now,
            self.tz,
            inventory.count_by_model(),
            groups,
            holdings=holdings(self.store.leases() if leases is None else leases),
            models={d.uuid: d.model for d in inventory.devices},
            waiting=self.placement.waiting_by_group(),
        )

    # -- placement ------------------------------------------------------------------

    async def place(
        self,
        user: str,
        server: str,
        count: int,
        model: str | None,
        timeout: float,
        report: Report = lambda ahead, why="": None,
        groups: tuple[str, ...] = (),
        exclusive: bool = False,
        limits: LeaseLimits | None = None,
    ) -> Lease:
        """Host placement; ``exclusive``: only devices a server holds alone (admission's ``shared_gpus``,
        which only host placement honours: an engine placement is never asked). ``limits``: the user's
        quota, checked where the lease is written (``ledger.lease_limits``); over it, a 403 at once."""
        placement = self.placement
        if not isinstance(placement, HostAllocator):  # an engine's placement follows the job it was given
            raise TypeError(f"GPUPolicy.place is host placement; this hub's placement is {type(placement).__name__}")
        return await placement.place(
            user, server, count, model, timeout, report, groups=groups, exclusive=exclusive, limits=limits
        )

    def release(
        self, user: str, server: str, reason: str, since: datetime | None = None, message: str = ""
    ) -> tuple[str, ...]:
        """End the lease of ``user``/``server`` (``since``: only the one that began then); ``message``: the
        sentence its student was told, kept with the ledger rows."""
        released = self.placement.release(user, server, reason, since, message)
        if released and self.layout_waiting and self.settle_layout():
            self.placement.released()  # the GPU's new devices are free now: wake whoever waits for them
        return released

    def end_server(
        self, user: str, server: str, ending: Ending, *, since: datetime | None = None, started: datetime | None = None
    ) -> tuple[str, ...]:
        """A server ended: release its lease with why, and tell its student (blocking).

        If the workbench service announced this stop (``NoticeBook.done``: "reclaimed: GPU idle 30 min"),
        or a first caller already told this end (a stop's release and a poll both ask), that notice's
        reason and sentence stand. Otherwise the ledger keeps ``ending``'s reason and sentence, and a
        ``done`` notice shows the sentence on the spawn page and the hub's home page until the next start
        (not for a failed or cancelled start: JupyterHub shows that error itself). ``since``: only the lease
        that began then (the reconciler's); ``started``: when the server started, for a server that held
        no GPU (no lease to date its end by)."""
        lease = self.store.lease_of(user, server)
        if since is not None and lease is not None and lease.since != since:
            return ()  # a new start of the same server replaced the lease the caller read
        notices = NoticeBook(self.store)
        begun = since or (lease.since if lease is not None else started)
        told = notices.announced(user, server, begun) if begun is not None else None
        if told is not None:
            return self.release(user, server, told.reason, since, message=told.message)
        released = self.release(user, server, ending.ledger_reason, since, message=ending.message)
        if ending.message and ending.reason not in SILENT and (released or lease is None):
            notices.done(
                user, server, kind=ending.kind, message=ending.message, hint=ending.hint, reason=ending.ledger_reason
            )
        return released

    def restore(self, user: str, server: str, saved: list[str], ref: str) -> tuple[str, ...] | None:
        """After a restart: the GPUs a running server holds, by the ledger.

        A server whose lease row was lost gets the GPUs it saved back, if
        nobody else holds them now (None: they are taken, stop the server).
        """
        lease = self.store.lease_of(user, server)
        if lease is not None:
            return lease.gpu_uuids
        if not saved:
            return ()
        if self.store.adopt(user, server, saved, ref, node=self.settings.node, shares=self.shares()):
            log.info("Re-leased GPU(s) %s to running server %s/%s", ", ".join(saved), user, server or "default")
            return tuple(saved)
        return None

    def adopt_inventory(self, inventory: DeviceInventory) -> list[Lease]:
        """Use a re-read inventory from now on (a MIG layout changed, ``inventory_refresh``), GPU by GPU.

        A GPU whose new layout keeps every device a server holds adopts it at once; one whose new layout
        would take a held device away (a gone slice, its whole form, its slices) keeps its old devices,
        closed to new servers, until those servers stop (``merge_layouts``, ``settle_layout``): a layout
        change never orphans a live server, nor hands its device to another. The check and the switch
        happen inside one write transaction (``held_for_layout``), so no allocation slips in between.
        Then the settings and the waiting GPUs are stored for the workbench service, and a lease on a MIG
        slice that no inventory knows (left from before a restart) is closed with ``LAYOUT_CHANGED``.
        Returns the leases closed. Blocking (the database)."""
        with self._layout_lock:
            self.inventory_read = inventory
            before, waited = self.settings.inventory, self.layout_waiting
            with self.store.writes().begin() as session:
                merged, waits = merge_layouts(before, inventory, held_for_layout(session))
                self.settings = replace(self.settings, inventory=merged)
                self.layout_waiting = waits
                if isinstance(self.placement, HostAllocator):
                    self.placement.adopt_inventory(merged, self.settings.slots(), self.layout_held_back())
            if merged.devices != before.devices:
                stored = load_policy_settings(self.store)
                if stored is not None:
                    store_policy_settings(self.store, replace(stored[0], inventory=merged))
            if waits != waited:
                store_layout_waiting(self.store, waits)
                for wait in waits:
                    log.warning(
                        "GPU %d (%s): new layout %s not adopted yet: %s (%s)",
                        wait.index,
                        wait.gpu,
                        wait.new_layout,
                        wait.message,
                        ", ".join(wait.servers),
                    )
                done = {w.gpu for w in waited} - {w.gpu for w in waits}
                if done:
                    log.warning("The waiting layout change was adopted on GPU(s) %s", ", ".join(sorted(done)))
        known = merged.by_uuid()
        closed = [lease for lease in self.store.leases() if slices_gone(lease, known)]
        for lease in closed:
            log.warning("Closing the lease of %s/%s: %s", lease.user, lease.server or "default", LAYOUT_CHANGED)
            self.end_server(lease.user, lease.server, endings.layout_changed(), since=lease.since)
        if merged.devices != before.devices or waits != waited:
            self.reconcile_soon()  # the devices changed under the ledger: compare it with the world now
        return closed

    def settle_layout(self) -> bool:
        """Adopt the waiting layout on every GPU whose servers on removed devices have all stopped (after a
        release, and on the refresh timer's tick). True when the layout in force changed."""
        if not self.layout_waiting:
            return False
        before = self.settings.inventory.devices
        self.adopt_inventory(self.inventory_read)
        return self.settings.inventory.devices != before

    def layout_held_back(self) -> frozenset[str]:
        """The devices of GPUs whose layout change waits: in force for their servers, closed to new ones."""
        return frozenset(uuid for wait in self.layout_waiting for uuid in wait.devices)


_policies: dict[tuple, GPUPolicy] = {}
_policies_lock = threading.Lock()


def shared_policy(key: tuple, build: Callable[[], GPUPolicy]) -> GPUPolicy:
    """The process-wide policy for this configuration key, built once."""
    with _policies_lock:
        policy = _policies.get(key)
        if policy is None:
            policy = _policies[key] = build()
        return policy
