"""The GPU policy of an engine backend: its inventory names every GPU by the UUID the engine's jobs reported.

An engine (Slurm, Kubernetes) lists its GPUs by node and index and learns
their UUIDs from start reports, kept in the backend's node-UUID book. The
policy's inventory is the published one resolved through the backend's own
resolver (``BackendExtension.resolve_inventory``), so the spawn form,
admission, the fleet view and reconcile name a GPU the same way.
"""

from __future__ import annotations

from workbench_devices import DeviceInventory
from workbench_spawner.backend import extension_of
from workbench_spawner.policy.gpu_policy import GPUPolicy


class EnginePolicy(GPUPolicy):
    """``GPUPolicy`` whose inventory is resolved by the backend the settings name (reads the database)."""

    @property
    def inventory(self) -> DeviceInventory:
        extension = extension_of(self.settings.backend)
        if extension is None:  # a policy of an unregistered backend: the published list as it is
            return self.settings.inventory
        return extension.resolve_inventory(self.store, self.settings.inventory)
