"""Re-reading the GPU inventory while the hub runs, so a changed MIG layout is used without a restart.

An admin drains a GPU (``workbench drain``), changes its layout with
``nvidia-smi mig`` or mig-parted, and undrains it. The hub's own placement
(local and docker backends) asks NVML again at most every
``inventory_refresh_seconds`` when a spawn, a form or a poll needs the
policy; a changed answer is adopted in place (``GPUPolicy.adopt_inventory``):

* the host allocator places on the new devices from its next try on, so a
  request already waiting in line gets a new slice rather than a gone one;
* the settings the workbench service reads are stored again with the new
  inventory (its fleet view, ``api/gpus`` and metrics follow within seconds);
* a lease whose devices were all MIG slices that are gone is closed with the
  reason "MIG layout changed: its slice(s) no longer exist" (the same rule
  the reconcile after a restart applies).

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
from collections.abc import Callable
from typing import TYPE_CHECKING

from workbench_devices import DeviceInventory, DeviceSpecError, simulated_spec_text
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
    ``every`` seconds and hands a changed inventory to ``adopt``. ``every`` 0 turns it off."""

    def __init__(
        self,
        current: Callable[[], DeviceInventory],
        discover: Callable[[], DeviceInventory],
        adopt: Callable[[DeviceInventory], None],
        every: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.current = current
        self.discover = discover
        self.adopt = adopt
        self.every = every
        self.clock = clock
        self._lock = threading.Lock()
        self._last = clock()  # the inventory in use was just read (at hub start)
        self._refused: str | None = None  # the last refusal logged, so it is logged once

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
            return False
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


def policy_key(settings: PolicySettings, host: bool, static_gpus: list[dict], simulated_gpus: str) -> str:
    """The settings as the process-wide policy cache (``shared_policy``) tells configurations apart. On a host
    the inventory counts by what it is read *from*, not the devices found then: a spawner made after a
    re-read finds the same policy, its wait line and its refresh, not a second one for the new layout."""
    data = settings.to_json()
    if host:
        data["inventory"] = {"static_gpus": static_gpus, "simulated_gpus": simulated_gpus}
    return json.dumps(data, sort_keys=True, default=str)


def watch(policy: GPUPolicy, static_gpus: list[dict], simulated_gpus: str, every: float) -> None:
    """Let a host's ``policy`` re-read its inventory at most every ``every`` seconds: when the policy is asked
    for (``refresh_inventory``) and on every try of a request waiting in line (its host allocator's)."""
    policy.refresh_inventory = policy.placement.refresh_inventory = InventoryRefresh(
        lambda: policy.inventory,
        lambda: discover_inventory(static_gpus, simulated_gpus, fresh=True),
        policy.adopt_inventory,
        every,
    )


def spec_in_force(simulated_gpus: str) -> str:
    """The simulated spec a server is told (``WORKBENCH_SIMULATED_GPUS``): a ``@FILE``'s spec as written now, so a
    container that cannot read the hub's file still simulates the layout; the setting as it is if unreadable."""
    try:
        return simulated_spec_text(simulated_gpus)
    except DeviceSpecError:
        return simulated_gpus
