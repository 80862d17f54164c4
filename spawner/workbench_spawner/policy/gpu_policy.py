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
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from workbench_devices import DeviceInventory, GPUDevice
from workbench_spawner.form.options import device_matches
from workbench_spawner.ledger import reasons
from workbench_spawner.ledger.drain_book import DrainBook, is_drained
from workbench_spawner.ledger.notices import NoticeBook
from workbench_spawner.ledger.reconcile_book import LEASE_CLOSED, ReconcileBook
from workbench_spawner.ledger.reservation_book import ReservationBook
from workbench_spawner.ledger.store import AllocationStore, Lease, utcnow
from workbench_spawner.placement.engine import EnginePlacement
from workbench_spawner.placement.host import HostAllocator, NoGPUAvailable, Placement, Report, holdings
from workbench_spawner.placement.start_line import StartLine
from workbench_spawner.policy.clock import hub_clock, zone
from workbench_spawner.policy.inventory_refresh import (
    LayoutWait,
    held_for_layout,
    merge_layouts,
    store_layout_waiting,
)
from workbench_spawner.policy.settings import PolicySettings, load_policy_settings, store_policy_settings
from workbench_spawner.rules.admission import AdmissionContext
from workbench_spawner.rules.gpu_hours import gpu_hours_used
from workbench_spawner.rules.quota import QuotaBook
from workbench_spawner.rules.reservations import reserved_now

log = logging.getLogger("workbench.policy")

__all__ = ["GPUPolicy", "GPUStatus", "NoGPUAvailable", "shared_policy"]


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


class GPUPolicy:
    def __init__(
        self,
        settings: PolicySettings,
        store: AllocationStore,
        placement: Placement | None = None,
        recheck_interval: float = 2.0,
    ):
        self.settings = settings
        self.store = store
        self.quotas = QuotaBook(store)
        self.tz = zone(settings.time_zone)
        self.clock = hub_clock(settings.test_clock_file)
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
        self._reconciled = False
        self._reconciling = False
        self._reconcile_lock = threading.RLock()
        # The reconciler's loop (``reconcile``): the backend's hooks, one pass at a time, woken by the timer or
        # by ``reconcile_soon``. A lease younger than the grace is left for the next pass: a backend's view of
        # its engine may be cached from before the server ran (Slurm's job list, the pod list).
        self.reconcile_grace_seconds = RECONCILE_GRACE_SECONDS
        self._backend_hooks: BackendHooks | None = None
        self._pass_lock = threading.Lock()
        self._reconcile_wake = threading.Event()
        self._reconcile_stop = threading.Event()
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
        unusable = self.placement.unusable(devices) if engine else {}
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
        **rules,
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
        held_elsewhere = sum(len(l.gpu_uuids) for l in leases if l.user == user and l.server != server)  # noqa: E741
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
            held_elsewhere=held_elsewhere,
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
    ) -> Lease:
        """Host placement; ``exclusive``: only devices a server holds alone (admission's ``shared_gpus``,
        which only host placement honours: an engine placement is never asked)."""
        only = {"exclusive": True} if exclusive else {}
        return await self.placement.place(user, server, count, model, timeout, report, groups=groups, **only)

    def release(self, user: str, server: str, reason: str, since: datetime | None = None) -> tuple[str, ...]:
        """End the lease of ``user``/``server`` (``since``: only the one that began then)."""
        released = self.placement.release(user, server, reason, since)
        if released and self.layout_waiting and self.settle_layout():
            self.placement.released()  # the GPU's new devices are free now: wake whoever waits for them
        return released

    def release_on_stop(self, user: str, server: str, otherwise: str = "stopped") -> tuple[str, ...]:
        """Release with the reason the workbench service announced for this stop ("reclaimed: ..."), if any,
        else ``otherwise``: the ledger says why a server the service stopped ended."""
        lease = self.store.lease_of(user, server)
        reason = NoticeBook(self.store).stop_reason(user, server, lease.since) if lease is not None else None
        return self.release(user, server, reason or otherwise)

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
            self.release(lease.user, lease.server, LAYOUT_CHANGED)
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

    # -- the reconciler: the ledger against the world, in a loop -------------------------------------

    def reconcile(
        self,
        is_alive: Callable[[Lease], bool | None],
        orphans: Callable[[], None] = lambda: None,
        gone_reason: Callable[[Lease], str | None] | None = None,
    ) -> list[Lease]:
        """The reconciler's first pass, then its loop: once per hub process (later calls return [] at once).

        The backend's hooks: ``is_alive`` answers for one lease (True keep, False close, None unknown: kept,
        the spawner's poll or a later pass settles it); ``orphans`` adopts or stops the backend's servers
        that run without a lease; ``gone_reason`` says why a server is gone, in the ledger's words (None:
        ``reasons.SERVER_GONE``). Left out, it is the ``gpu_lease_gone_reason`` of the backend that
        ``is_alive`` is bound to (the mixin passes one spawner's bound hooks). Spawns that arrive during
        the first pass wait for it, so their new servers are never taken for orphans of an earlier hub.
        After it, a worker thread runs a pass every ``settings.reconcile_seconds`` and whenever
        ``reconcile_soon`` asks: a server that dies or appears while the hub runs is put right too, and
        the event loop never waits for it. Returns the leases the first pass closed.
        """
        if self._reconciled:  # the loop runs every later pass; a spawn never waits for one
            return []
        # Reentrant: a backend hook that asks for the policy during the first pass returns at once.
        with self._reconcile_lock:
            if self._reconciled or self._reconciling:
                return []
            self._reconciling = True
            if gone_reason is None:
                gone_reason = getattr(getattr(is_alive, "__self__", None), "gpu_lease_gone_reason", None)
            self._backend_hooks = BackendHooks(is_alive, orphans, gone_reason or (lambda lease: None))
            try:
                return self.reconcile_now(first=True)
            finally:
                self._reconciling = False
                self._reconciled = True
                self._start_reconciler()

    def reconcile_soon(self) -> None:
        """Make the reconciler run its next pass now rather than at its timer: after an inventory change or
        an engine's watch reconnecting, the ledger and the world may disagree. Thread-safe and cheap (it only
        wakes the loop's thread); calls while a pass runs make one more pass after it, never two at once."""
        self._reconcile_wake.set()

    def stop_reconciler(self) -> None:
        """End the loop's thread after the pass it may be running (tests; a policy no longer used)."""
        _stop_loop(self._reconcile_wake, self._reconcile_stop)

    def reconcile_now(self, first: bool = False) -> list[Lease]:
        """One pass of the reconciler, blocking (the loop's thread; tests). Returns the leases it closed.

        A lease whose server is gone is closed with the backend's reason; then the backend's orphan rule
        adopts servers without a lease whose devices are free and stops the others (a device a live server
        still uses is never handed out). Spawns in flight (``starting``) are left alone, and so are leases
        younger than ``reconcile_grace_seconds`` after the first pass. ``first``: the pass at the hub's
        start, which also closes leases on MIG slices that vanished while the hub was down and logs every
        lease it keeps. Passes never overlap (one lock); nothing happens before ``reconcile`` gave the hooks.
        """
        hooks = self._backend_hooks
        if hooks is None:
            return []
        with self._pass_lock:
            closed = []
            known = self.inventory.by_uuid()
            now = utcnow()
            for lease in self.store.leases():
                if (lease.user, lease.server) in self.starting or (lease.user, lease.server) in self.stopping:
                    continue  # its spawn is in flight (the lease may not name its server yet), or its stop is
                if not first and (now - lease.since).total_seconds() < self.reconcile_grace_seconds:
                    continue
                if first:
                    missing = [u for u in lease.gpu_uuids if u not in known]
                    if missing:
                        log.warning(
                            "%s/%s holds GPU(s) no longer in the inventory: %s", lease.user, lease.server, missing
                        )
                    if slices_gone(lease, known) and not self.settings.inventory.unread:
                        # Its slices are gone: the GPU's MIG layout changed while the hub was down (not when
                        # NVML could not read some GPU now: its slices may be this lease's, still running).
                        if self._close(lease, LAYOUT_CHANGED):
                            closed.append(lease)
                        continue
                if hooks.is_alive(lease) is False:
                    if (lease.user, lease.server) in self.starting or (lease.user, lease.server) in self.stopping:
                        continue  # a new start, or a stop, of the same server began meanwhile
                    if self._close(lease, hooks.gone_reason(lease) or reasons.SERVER_GONE):
                        closed.append(lease)
                elif first:
                    log.info(
                        "Kept lease of %s/%s on %s after restart",
                        lease.user,
                        lease.server or "default",
                        ", ".join(lease.gpu_uuids),
                    )
            hooks.orphans()
            return closed

    def _close(self, lease: Lease, reason: str) -> bool:
        """Close ``lease`` with ``reason`` if it is still the one the ledger holds (a new start of the same
        server may have replaced it since it was read): counted and logged as a fix."""
        released = self.release(lease.user, lease.server, reason, lease.since)
        if released:
            self.record_fix(
                LEASE_CLOSED,
                f"reconcile: closed the lease of {lease.user}/{lease.server} on {', '.join(released)}: {reason}",
            )
        return bool(released)

    def orphan_now(self, user: str, server: str) -> bool:
        """Whether a backend's orphan rule may adopt or stop the server of ``user``/``server`` now: it holds
        no lease (read now, not from a list read before) and no spawn of it is in flight. A server whose
        lease is being written, or whose start has not returned, is never an orphan, nor one being stopped
        (blocking)."""
        key = (user, server)
        return key not in self.starting and key not in self.stopping and self.store.lease_of(user, server) is None

    def record_fix(self, kind: str, line: str | None = None) -> None:
        """Count one fix of the reconciler (``reconcile_book``: ``workbench_reconcile_fixes_total{kind}`` on the
        service's /metrics) and log it in one ``line`` (None: the backend logged it already). Blocking."""
        if line:
            log.warning(line)
        ReconcileBook(self.store).count(kind)

    def count_fixes(self, whats: Iterable[str], kinds: Mapping[str, str]) -> None:
        """Count the fixes among what a backend's orphan rule did (``kinds``: its word for an action, such as
        "adopted" or "cancelled", -> the fix's kind); the rule logged each action in its own line."""
        for what in whats:
            if what in kinds:
                self.record_fix(kinds[what])

    def _start_reconciler(self) -> None:
        """Start the loop's thread (once). It holds the policy weakly: a policy nobody uses ends its loop."""
        every = float(self.settings.reconcile_seconds)
        weakref.finalize(self, _stop_loop, self._reconcile_wake, self._reconcile_stop)
        # Kept so that its log lines can be told from another policy's (several hubs' policies in one process).
        self.reconcile_thread = threading.Thread(
            target=_reconcile_loop,
            args=(weakref.ref(self), self._reconcile_wake, self._reconcile_stop, every),
            name="workbench-reconcile",
            daemon=True,
        )
        self.reconcile_thread.start()
        timer = f"every {every:g} s and" if every > 0 else "(WORKBENCH_RECONCILE_SECONDS=0: no timer)"
        log.info("reconcile: the reconciler runs %s after every inventory change or engine reconnect", timer)


@dataclass(frozen=True)
class BackendHooks:
    """The backend's side of the reconciler (the contract's ``gpu_lease_alive``, ``gpu_reconcile_orphans``,
    ``gpu_lease_gone_reason``), kept by the policy so its loop can ask them on every pass."""

    is_alive: Callable[[Lease], bool | None]
    orphans: Callable[[], None]
    gone_reason: Callable[[Lease], str | None]


# Leases younger than this are left to the next pass (``reconcile_now``).
RECONCILE_GRACE_SECONDS = 10.0


def _stop_loop(wake: threading.Event, stop: threading.Event) -> None:
    stop.set()
    wake.set()


def _reconcile_loop(ref: weakref.ref, wake: threading.Event, stop: threading.Event, every: float) -> None:
    """The reconciler's thread: a pass every ``every`` s (0: only when woken), or at once when woken. A pass
    that raises is logged and the loop goes on; the policy is held only during a pass."""
    while not stop.is_set():
        wake.wait(every if every > 0 else None)
        wake.clear()
        if stop.is_set():
            return
        policy = ref()
        if policy is None:
            return
        try:
            policy.reconcile_now()
        except Exception:
            log.exception("reconcile: a pass failed; the loop goes on")
        del policy


# The ledger's reason for a lease whose slices really are gone (``ledger.reasons``).
LAYOUT_CHANGED = reasons.LAYOUT_CHANGED


def slices_gone(lease: Lease, known: dict) -> bool:
    """Whether every device of ``lease`` is a MIG slice the inventory (``known``, by UUID) no longer has: its
    GPU's layout changed. A whole GPU that is missing is only logged (it may be back after a driver reload)."""
    missing = [u for u in lease.gpu_uuids if u not in known]
    return bool(missing) and len(missing) == len(lease.gpu_uuids) and all(u.startswith("MIG-") for u in missing)


_policies: dict[tuple, GPUPolicy] = {}
_policies_lock = threading.Lock()


def shared_policy(key: tuple, build: Callable[[], GPUPolicy]) -> GPUPolicy:
    """The process-wide policy for this configuration key, built once."""
    with _policies_lock:
        policy = _policies.get(key)
        if policy is None:
            policy = _policies[key] = build()
        return policy
