"""The reconciler: the GPU ledger against the servers that really run, in a loop (a base of ``GPUPolicy``).

A lease whose server is gone is closed with the reason the backend gives; a server that runs without a
lease is adopted if its devices are free, else stopped (the backend's orphan rule); spawns and stops in
flight are left alone. The first pass runs once per hub process, before spawns may go on; then a worker
thread runs a pass every ``settings.reconcile_seconds`` and whenever ``reconcile_soon`` asks. Every fix is
one log line and a count in ``reconcile_book`` (docs/architecture.md, "The reconciler").

``Reconciler`` reads what ``GPUPolicy`` holds: ``settings``, ``store``, ``inventory``, ``starting``,
``stopping`` and ``end_server``; its own state is made by ``_init_reconciler``.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from workbench_spawner.ledger import endings, reasons
from workbench_spawner.ledger.endings import Ending, as_ending
from workbench_spawner.ledger.reconcile_book import LEASE_CLOSED, ReconcileBook
from workbench_spawner.ledger.store import Lease, utcnow

if TYPE_CHECKING:
    from workbench_devices import DeviceInventory
    from workbench_spawner.ledger.store import AllocationStore
    from workbench_spawner.policy.settings import PolicySettings

log = logging.getLogger("workbench.policy")


class Reconciler:
    """The reconciler's half of ``GPUPolicy``."""

    if TYPE_CHECKING:  # what GPUPolicy holds, which the reconciler reads (GPUPolicy derives from this class)
        settings: PolicySettings
        store: AllocationStore
        starting: set[tuple[str, str]]
        stopping: set[tuple[str, str]]

        @property
        def inventory(self) -> DeviceInventory: ...

        def end_server(
            self,
            user: str,
            server: str,
            ending: Ending,
            *,
            since: datetime | None = None,
            started: datetime | None = None,
        ) -> tuple[str, ...]: ...

    def _init_reconciler(self) -> None:
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

    def reconcile(
        self,
        is_alive: Callable[[Lease], bool | None],
        orphans: Callable[[], None] = lambda: None,
        gone_reason: Callable[[Lease], Ending | str | None] | None = None,
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
                        if self._close(lease, endings.layout_changed()):
                            closed.append(lease)
                        continue
                if hooks.is_alive(lease) is False:
                    if (lease.user, lease.server) in self.starting or (lease.user, lease.server) in self.stopping:
                        continue  # a new start, or a stop, of the same server began meanwhile
                    if self._close(lease, as_ending(hooks.gone_reason(lease), endings.server_gone())):
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

    def _close(self, lease: Lease, ending: Ending) -> bool:
        """Close ``lease`` with ``reason`` if it is still the one the ledger holds (a new start of the same
        server may have replaced it since it was read): counted and logged as a fix."""
        released = self.end_server(lease.user, lease.server, ending, since=lease.since)
        if released:
            self.record_fix(
                LEASE_CLOSED,
                f"reconcile: closed the lease of {lease.user}/{lease.server} on {', '.join(released)}: "
                f"{ending.ledger_reason}",
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
    gone_reason: Callable[[Lease], Ending | str | None]


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
