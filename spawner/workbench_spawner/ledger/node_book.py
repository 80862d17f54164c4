"""What the hub learned of each engine node's GPUs: one JSON document per engine in ``workbench_settings``.

An engine names GPUs by node and index (Slurm) or only counts them
(Kubernetes); leases speak UUIDs. The first job on a node reports them, the
placement checks the report against the engine's record, and the backend's
book (``NodeGPUMap``, ``NodeUUIDs``) accepts it here. The book is read by the
hub, the workbench service's fleet view and reconcile alike. An engine
supplies how an entry looks (``accept``) and how it names an inventory's
devices (``resolve_with``); reading, writing and forgetting a node are shared.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from workbench_devices import DeviceInventory
from workbench_spawner.ledger.settings_table import SettingsRow
from workbench_spawner.ledger.store import AllocationStore, utcnow


class NodeBook(ABC):
    """Per node key, what the engine's jobs reported there (``key``: the settings row; a node's sub-keys are
    ``<node>/<part>``, a node name has no "/")."""

    key: str

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

    @staticmethod
    @abstractmethod
    def resolve_with(inventory: DeviceInventory, known: dict[str, Any]) -> DeviceInventory:
        """``inventory`` named by ``known`` (no database)."""
