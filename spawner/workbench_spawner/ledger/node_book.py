"""What the hub learned of each engine node's GPUs: one JSON document per engine in ``workbench_settings``.

An engine names GPUs by node and index (Slurm) or only counts them
(Kubernetes); leases speak UUIDs. The first job on a node reports them, the
placement checks the report against the engine's record, and the backend's
book (``NodeGPUMap``, ``NodeUUIDs``) accepts it here. The book is read by the
hub, the workbench service's fleet view and reconcile alike. An engine
supplies how it learns a report (``accept``) and where its entries name GPUs
(``places``); reading, writing and forgetting a node, where a UUID already is,
and naming an inventory's devices by what was learned are shared.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from workbench_devices import DeviceInventory, GPUDevice
from workbench_spawner.ledger.settings_table import SettingsRow
from workbench_spawner.ledger.store import AllocationStore, utcnow


class NodeBook(ABC):
    """Per node key, what the engine's jobs reported there (``key``: the settings row; a node's sub-keys are
    ``<node>/<part>``, a node name has no "/")."""

    key: str
    engine: str  # the inventory source whose placeholders the book names ("slurm")

    def __init__(self, store: AllocationStore):
        self.store = store

    def known(self) -> dict[str, Any]:
        with self.store.reads()() as session:
            row = session.get(SettingsRow, self.key)
            return json.loads(row.value) if row is not None else {}

    def update(self, change: Callable[[dict[str, Any]], bool]) -> bool:
        """Apply ``change`` to the document in one write transaction; it returns whether to write (it may
        raise, writing nothing). Returns what ``change`` returned."""
        with self.store.writes().begin() as session:
            row = session.get(SettingsRow, self.key)
            known: dict[str, Any] = json.loads(row.value) if row is not None else {}
            if not change(known):
                return False
            if row is None:
                row = SettingsRow(key=self.key)
                session.add(row)
            row.value = json.dumps(known, sort_keys=True)
            row.updated = utcnow()
            return True

    def forget(self, node: str) -> bool:
        """Drop what is known about ``node`` and its sub-keys (its GPUs were replaced); True if there was any."""

        def drop(known: dict[str, Any]) -> bool:
            keys = [k for k in known if k == node or k.startswith(f"{node}/")]
            for key in keys:
                del known[key]
            return bool(keys)

        return self.update(drop)

    def resolve(self, inventory: DeviceInventory) -> DeviceInventory:
        """``inventory`` with every reported GPU under its real UUID (reads the database)."""
        return self.resolve_with(inventory, self.known())

    @classmethod
    def resolve_with(cls, inventory: DeviceInventory, known: dict[str, Any]) -> DeviceInventory:
        """``inventory`` named by ``known`` (no database): a device at a place a report named takes what the
        report said. Only the engine's own inventory has placeholders; a simulated one is as it is."""
        places = cls.places(known)
        if inventory.source != cls.engine or not places:
            return inventory
        devices = [_named(d, places.get((cls.place_key(d), d.index))) for d in inventory.devices]
        return replace(inventory, devices=devices)

    @classmethod
    def owners(cls, known: dict[str, Any]) -> dict[str, tuple[str, int]]:
        """Where each UUID in ``known`` is, as its place (key, index): a UUID belongs to one place."""
        return {entry["uuid"]: place for place, entry in cls.places(known).items()}

    @staticmethod
    def place_key(device: GPUDevice) -> str:
        """The key ``device``'s reports are kept under: its node (an engine may keep slices apart)."""
        return device.node

    @staticmethod
    @abstractmethod
    def places(known: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
        """The GPUs ``known`` names by place (key, index), each an entry with its ``uuid`` and whatever else
        the engine learns (``name``, ``memory_total_bytes``; a slice's ``profile``, ``parent_uuid``, ``model``)."""


def _named(device: GPUDevice, entry: dict[str, Any] | None) -> GPUDevice:
    """``device`` under what a report said of its place; as it is where no report did."""
    if entry is None:
        return device
    named = replace(
        device,
        uuid=entry["uuid"],
        name=entry.get("name") or device.name,
        memory_total_bytes=int(entry.get("memory_total_bytes") or device.memory_total_bytes),
    )
    if device.mig and entry.get("profile") == device.profile:  # the slice's GPU, as the job saw it
        named = replace(named, parent_uuid=entry.get("parent_uuid", ""), model=entry.get("model", ""))
    return named
