"""Re-reading the GPU inventory while the hub runs, so a changed MIG layout is used without a restart.

An admin drains a GPU (``workbench drain``), changes its layout with
``nvidia-smi mig`` or mig-parted, and undrains it. The hub's own placement
(local and docker backends) asks NVML again every ``inventory_refresh_seconds``
on a timer of its own (``InventoryRefresh.start``: a thread started when the
policy is built, so a change is seen also when nobody spawns), and at most as
often when a spawn, a form or a request waiting in line needs the policy. A
changed answer is adopted GPU by GPU (``merge_layouts``, ``GPUPolicy.adopt_inventory``):

* a physical GPU whose new layout takes away no device a server holds (a
  lease in the ledger: a vanished slice; the whole GPU, cut into slices; its
  slices, when it becomes whole or is cut again) adopts it at once: the host
  allocator places on its new devices from its next try on, so a request
  already waiting in line gets a new slice rather than a gone one;
* a GPU whose new layout would take a device from a live server keeps its old
  devices (the servers keep their leases and are counted) and is closed to new
  servers; the fleet page and ``api/gpus`` say "layout change waiting: 3
  servers still on slices the new layout removes" (``LayoutWait``, stored in
  the ``workbench_settings`` row ``layout_waiting`` for the workbench service).
  It adopts its new layout as soon as the last of those leases ends: checked
  right after every release through the policy, and on every timer tick;
* the settings the workbench service reads are stored again with the layout
  in force (its fleet view, ``api/gpus`` and metrics follow within seconds).

So no device is ever handed out twice: never two servers on one slice,
never a whole GPU over live slices, never slices over a live whole GPU. A
lease on a MIG slice that neither the old nor the new inventory knows (left
from before a restart) is closed with the reason "MIG layout changed".

A read that fails, that could not read every GPU (a MIG GPU whose slices
NVML did not give this time), or that finds a different *kind* of inventory
(NVML answering nothing after it found GPUs: a driver reload, a library
hiccup), is logged and not adopted: losing a GPU for a minute must not close the
leases of everyone on it. Engines (Slurm, Kubernetes) know their nodes'
GPUs from the engine; nothing here applies to them.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session

from workbench_devices import DeviceInventory, DeviceSpecError, GPUDevice, simulated_spec_text
from workbench_spawner.ledger.settings_table import SettingsRow
from workbench_spawner.ledger.store import AllocationStore, LeaseRow, lock_leases, utcnow
from workbench_spawner.policy.settings import PolicySettings, discover_inventory

if TYPE_CHECKING:
    from workbench_spawner.policy.gpu_policy import GPUPolicy

log = logging.getLogger("workbench.policy")


def changes(old: DeviceInventory, new: DeviceInventory) -> tuple[list[str], list[str]]:
    """The UUIDs that are gone and those that are new, each in inventory order."""
    before, after = old.by_uuid(), new.by_uuid()
    return [u for u in before if u not in after], [u for u in after if u not in before]


class InventoryRefresh:
    """Asks ``discover`` (blocking: NVML, the simulated spec file, or ``static_gpus``) again at most every
    ``every`` seconds and hands a changed inventory to ``adopt``. ``every`` 0 turns it off.

    ``current`` is the inventory last *read* (what ``adopt`` was last given), not the one in force: a GPU
    whose change waits for its servers keeps its old layout in force, and comparing against that would
    log the same change on every read. When the read is unchanged, ``settle`` is asked instead (a GPU
    waiting for its servers to stop may adopt now); it answers True when something was adopted."""

    def __init__(
        self,
        current: Callable[[], DeviceInventory],
        discover: Callable[[], DeviceInventory],
        adopt: Callable[[DeviceInventory], object],
        every: float,
        clock: Callable[[], float] = time.monotonic,
        settle: Callable[[], bool] = lambda: False,
    ):
        self.current = current
        self.discover = discover
        self.adopt = adopt
        self.every = every
        self.clock = clock
        self.settle = settle
        self._lock = threading.Lock()
        self._last = clock()  # the inventory in use was just read (at hub start)
        self._refused: str | None = None  # the last refusal logged, so it is logged once
        self._stop = threading.Event()

    def __call__(self) -> bool:
        """Re-read if it is time; True when a changed inventory was adopted."""
        if self.every <= 0 or self.clock() - self._last < self.every:
            return False
        if not self._lock.acquire(blocking=False):
            return False  # another thread is reading it now
        try:
            self._last = self.clock()
            return self._refresh()
        finally:
            self._lock.release()

    def _refresh(self) -> bool:
        old = self.current()
        try:
            new = self.discover()
        except ValueError as exc:
            self._refuse(f"Re-reading the GPU inventory failed, keeping the last one: {exc}")
            return False
        if new.unread:  # a GPU NVML could not read now is not a GPU whose slices are gone
            self._refuse(
                f"Re-reading the GPU inventory could not read every GPU ({'; '.join(new.unread)}); "
                "keeping the last one until it can"
            )
            return False
        if new.source != old.source:
            self._refuse(
                f"Re-reading the GPU inventory found {new.source} ({new.message}) where it had {old.source}; "
                "keeping the last one until the same source answers again"
            )
            return False
        self._refused = None
        if new.devices == old.devices:
            return self.settle()
        gone, added = changes(old, new)
        log.warning(
            "The GPU inventory changed (%s); gone: %s; new: %s",
            new.message,
            ", ".join(gone) or "none",
            ", ".join(added) or "none",
        )
        self.adopt(new)
        return True

    def _refuse(self, message: str) -> None:
        if message != self._refused:
            log.warning("%s", message)
            self._refused = message

    def due_in(self) -> float:
        """Seconds until the next read is due (0: now)."""
        return max(0.0, self._last + self.every - self.clock())

    def start(self) -> threading.Thread | None:
        """Re-read on a timer as well, every ``every`` seconds, in a daemon thread: a layout change is seen
        (and a GPU whose servers have all stopped adopts its waiting layout) also when nobody spawns. The
        thread holds this object only weakly, so it ends with the policy; ``stop`` ends it at once."""
        if self.every <= 0:
            return None
        ref = weakref.ref(self)
        stop = self._stop

        def run() -> None:
            wait = self.every
            while not stop.wait(max(0.05, wait)):
                refresh = ref()
                if refresh is None:
                    return
                try:
                    refresh()
                except Exception:  # the timer must outlive a failed read or a busy database
                    log.exception("Re-reading the GPU inventory on the timer failed; trying again later")
                wait = refresh.due_in() or refresh.every
                del refresh

        thread = threading.Thread(target=run, name="workbench-inventory-refresh", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        """End the timer thread (``start``)."""
        self._stop.set()


# -- a layout change, GPU by GPU ------------------------------------------------------------------------------

LAYOUT_WAITING_KEY = "layout_waiting"  # the workbench_settings row the service reads (``load_layout_waiting``)


def gpu_key(device: GPUDevice, by_index: bool = False) -> str:
    """The physical GPU a device is (a whole GPU) or belongs to (a slice: its ``parent_uuid``). ``by_index``:
    some slice does not name its GPU (a static list without ``parent_uuid``): GPUs are told apart by node
    and index instead, so a whole GPU and its slices still count as one GPU."""
    if by_index:
        return f"{device.node}#{device.index}"
    return device.parent_uuid if device.mig and device.parent_uuid else device.uuid


@dataclass(frozen=True)
class LayoutWait:
    """A GPU whose new layout waits: it would take away devices that servers hold.

    ``gpu`` names it (its UUID); ``servers`` are the ``user/server`` names on devices the new layout
    removes; ``removes`` what they are on: ``"slices"`` (the new layout has other slices, or makes the GPU
    whole), ``"whole"`` (the whole GPU, which the new layout cuts into slices) or ``"gpu"`` (the new read
    does not list the GPU at all); ``devices`` the GPU's devices kept in force (its old layout), closed to
    new servers; ``new_layout`` the layout read, in words."""

    gpu: str
    index: int
    servers: tuple[str, ...]
    removes: str
    devices: tuple[str, ...]
    new_layout: str

    @property
    def message(self) -> str:
        """The sentence the fleet page and ``api/gpus`` show."""
        n = len(self.servers)
        who = f"{n} server{'' if n == 1 else 's'} still on"
        if self.removes == "whole":
            return f"layout change waiting: {who} the whole GPU, which the new layout cuts into slices"
        if self.removes == "gpu":
            return f"layout change waiting: {who} this GPU, which the new inventory no longer lists"
        return f"layout change waiting: {who} slices the new layout removes"

    def to_json(self) -> dict:
        return {
            "gpu_uuid": self.gpu,
            "index": self.index,
            "servers": list(self.servers),
            "removes": self.removes,
            "devices": list(self.devices),
            "new_layout": self.new_layout,
            "message": self.message,
        }


def layout_words(devices: Sequence[GPUDevice]) -> str:
    """One GPU's layout in words: ``2x3g.71gb``, ``1x2g.35gb+5x1g.18gb``, ``whole`` or ``not listed``."""
    if not devices:
        return "not listed"
    profiles = [d.profile for d in devices if d.mig]
    if not profiles:
        return "whole"
    counts = {p: profiles.count(p) for p in dict.fromkeys(profiles)}
    return "+".join(f"{n}x{p}" for p, n in counts.items())


def merge_layouts(
    old: DeviceInventory, new: DeviceInventory, held: Mapping[str, Sequence[tuple[str, str]]]
) -> tuple[DeviceInventory, list[LayoutWait]]:
    """The inventory to put in force after reading ``new`` while ``old`` is in force, and the GPUs that wait.

    Per physical GPU (``gpu_key``): the new devices where every device of it that a server holds
    (``held``: UUID -> [(user, server)], the ledger) is still there under the same UUID; otherwise its old
    devices, and a ``LayoutWait``. A held UUID counts for the GPU it names in either inventory, and a whole
    GPU's own UUID for that GPU even where the GPU is cut now: a lease on the whole GPU keeps its slices
    from being handed out, and the other way round. Where nothing waits the result's devices are exactly
    ``new``'s, in its order; a GPU that waits keeps its place by index."""
    by_index = any(d.mig and not d.parent_uuid for d in (*old.devices, *new.devices))
    before: dict[str, list[GPUDevice]] = {}
    after: dict[str, list[GPUDevice]] = {}
    for listed, groups in ((old.devices, before), (new.devices, after)):
        for device in listed:
            groups.setdefault(gpu_key(device, by_index), []).append(device)
    owner = {d.uuid: gpu_key(d, by_index) for d in (*old.devices, *new.devices)}
    for device in (*old.devices, *new.devices):
        if not by_index:
            owner.setdefault(gpu_key(device), gpu_key(device))  # a GPU's own UUID, also where it is cut now
    whole = {d.uuid for d in (*old.devices, *new.devices) if not d.mig} | {
        d.parent_uuid for d in (*old.devices, *new.devices) if d.mig and d.parent_uuid
    }
    devices: list[GPUDevice] = []
    waits: list[LayoutWait] = []
    for gpu in dict.fromkeys([*after, *before]):
        now, was = after.get(gpu, []), before.get(gpu, [])
        keep = {d.uuid for d in now}
        removed = {uuid: holders for uuid, holders in held.items() if owner.get(uuid) == gpu and uuid not in keep}
        if not removed:
            devices.extend(now)
            continue
        servers = sorted({f"{user}/{server}" if server else user for hs in removed.values() for user, server in hs})
        if not now:
            removes = "gpu"
        elif any(uuid in whole for uuid in removed):
            removes = "whole"
        else:
            removes = "slices"
        first = (was or now)[0]
        waits.append(
            LayoutWait(gpu, first.index, tuple(servers), removes, tuple(d.uuid for d in was), layout_words(now))
        )
        devices.extend(was)
    if waits:
        devices.sort(key=lambda d: (d.node, d.index))  # stable: each GPU's devices stay in their order
    return DeviceInventory(new.source, devices, new.message, unread=new.unread), waits


def held_for_layout(session: Session) -> dict[str, list[tuple[str, str]]]:
    """Every held device (UUID -> [(user, server)]), read inside ``session``, a write transaction, so that
    no allocation commits between this read and the layout put in force with it: on SQLite the
    transaction's BEGIN IMMEDIATE queues every other writer; on PostgreSQL the lease table is locked
    against inserts for as long (allocations wait, reads do not)."""
    lock_leases(session)
    held: dict[str, list[tuple[str, str]]] = {}
    for row in session.scalars(select(LeaseRow)):
        held.setdefault(row.gpu_uuid, []).append((row.user, row.server))
    return held


def store_layout_waiting(store: AllocationStore, waits: Sequence[LayoutWait]) -> None:
    """Publish the GPUs whose layout change waits (none: an empty list), for the workbench service."""
    with store.writes().begin() as session:
        row = session.get(SettingsRow, LAYOUT_WAITING_KEY)
        if row is None:
            row = SettingsRow(key=LAYOUT_WAITING_KEY)
            session.add(row)
        row.value = json.dumps([w.to_json() for w in waits])
        row.updated = utcnow()


def load_layout_waiting(store: AllocationStore) -> list[dict]:
    """What ``store_layout_waiting`` published last (``LayoutWait.to_json`` each); empty when nothing waits."""
    with store.reads()() as session:
        value = session.scalar(select(SettingsRow.value).where(SettingsRow.key == LAYOUT_WAITING_KEY))
    try:
        waits = json.loads(value) if value else []
    except ValueError:
        return []
    return waits if isinstance(waits, list) else []


def policy_key(settings: PolicySettings, host: bool, static_gpus: list[dict], simulated_gpus: str) -> str:
    """The settings as the process-wide policy cache (``shared_policy``) tells configurations apart. On a host
    the inventory counts by what it is read *from*, not the devices found then: a spawner made after a
    re-read finds the same policy, its wait line and its refresh, not a second one for the new layout."""
    data = settings.to_json()
    if host:
        data["inventory"] = {"static_gpus": static_gpus, "simulated_gpus": simulated_gpus}
    return json.dumps(data, sort_keys=True, default=str)


def watch(policy: GPUPolicy, static_gpus: list[dict], simulated_gpus: str, every: float) -> InventoryRefresh:
    """Let a host's ``policy`` re-read its inventory every ``every`` seconds: on a timer (a thread: also
    when nobody spawns), and at most as often when the policy is asked for (``refresh_inventory``) and on
    every try of a request waiting in line (its host allocator's). A layout change left waiting by an
    earlier hub process is cleared: this one starts from the inventory it just read."""
    from workbench_spawner.placement.host import HostAllocator

    refresh = InventoryRefresh(
        lambda: policy.inventory_read,
        lambda: discover_inventory(static_gpus, simulated_gpus, fresh=True),
        policy.adopt_inventory,
        every,
        settle=policy.settle_layout,
    )
    policy.refresh_inventory = refresh
    if isinstance(policy.placement, HostAllocator):  # a request waiting in line re-reads on each try
        policy.placement.refresh_inventory = refresh
    store_layout_waiting(policy.store, [])
    refresh.start()
    return refresh


def spec_in_force(simulated_gpus: str) -> str:
    """The simulated spec a server is told (``WORKBENCH_SIMULATED_GPUS``): a ``@FILE``'s spec as written now, so a
    container that cannot read the hub's file still simulates the layout; the setting as it is if unreadable."""
    try:
        return simulated_spec_text(simulated_gpus)
    except DeviceSpecError:
        return simulated_gpus
