"""The spawner side every engine-placed backend (Slurm, Kubernetes) writes the same way.

``GPUSpawnerMixin`` holds the life cycle; ``EngineSpawner`` is its base for a
backend whose engine places the server. What a spawner of any engine does
around its engine is here, once: the start report it keeps, how a lease names
the engine's job (``<prefix>:<job id>``) and reads it back, the hub's
reservations as the engine's placement measures them, whether the engine's
reports teach the hub its nodes' UUIDs, the "Running on" line of the progress
page, and the engine's GPUs read once per hub process (an engine's job list,
read at most every few seconds for the reconciler's per-lease questions, is an
``engine_fleet.Recent``).
The engine keeps what differs: how it reads its nodes, submits, reads a job's
state and cancels, and its own words.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import ClassVar, Protocol

from traitlets import Instance

from workbench_devices import DeviceInventory
from workbench_spawner.ledger.store import AllocationStore, Lease
from workbench_spawner.mixin import GPUSpawnerMixin
from workbench_spawner.placement.engine_reservations import EngineReservations
from workbench_spawner.policy.clock import hub_clock, zone
from workbench_spawner.policy.settings import PolicySettings


class NodeNamed(Protocol):
    """A start report as an engine parses it: the node the server landed on is all this module reads."""

    @property
    def node(self) -> str: ...


class EngineSpawner(GPUSpawnerMixin):
    """``GPUSpawnerMixin`` for an engine-placed backend; put it first in the bases, as that mixin."""

    placement_mode = "engine"

    lease_ref_prefix: ClassVar[str] = ""
    """The engine's word before its job's id in a lease's ref (``slurm:<job id>``, ``k8s:<namespace>/<pod>``):
    the reconciler reads a lease back only where it is this engine's."""

    workbench_report = Instance(
        dict,
        allow_none=True,
        help="""
        Set by the server's start-up through this engine's start-report route
        (never configure it): the node and the GPUs the engine gave the server.
        """,
    )

    def lease_job(self, lease: Lease) -> str:
        """The engine's id of the job behind ``lease`` (what ``gpu_lease_ref`` wrote after the prefix), or ""
        for a lease this engine did not write."""
        prefix, sep, job = lease.ref.partition(":")
        return job if sep and prefix == self.lease_ref_prefix else ""

    def learns_node_uuids(self, settings: PolicySettings) -> bool:
        """Whether the engine's reports teach the hub its nodes' UUIDs: on real nodes they do; on simulated nodes
        (``simulated_gpus``) the hub knows the UUIDs itself and learns nothing."""
        return settings.inventory.source == self.workbench_backend

    def announce_running(self, lease: Lease | None, report: NodeNamed | None) -> str:
        """Say on the progress page where the server runs, and return that node: the lease's, or for a server
        without GPUs (no lease) the one its start report named."""
        node = lease.node if lease else (report.node if report else "")
        self._gpu_events.add(f"Running on {node or 'its node'} with {', '.join(self.gpu_uuids) or 'no GPU'}", 90)
        return node


def engine_reservations(
    settings: PolicySettings, store: AllocationStore, inventory: Callable[[], DeviceInventory]
) -> EngineReservations:
    """The open reservations as an engine's placement holds requests back by them, on the hub's clock and zone."""
    return EngineReservations(store, inventory, zone(settings.time_zone), hub_clock(settings.test_clock_file))


_inventories: dict[Hashable, DeviceInventory] = {}


def inventory_once(
    key: Hashable,
    read: Callable[[], DeviceInventory],
    unavailable: type[Exception] | tuple[type[Exception], ...],
    engine: str,
) -> DeviceInventory:
    """The engine's GPUs, read once per hub process for ``key`` (blocking; the key names the engine and the
    settings the reading depends on). Nodes added later are seen after a hub restart, the fleet view reads them
    live. An engine that does not answer (``unavailable``) gives no GPUs with its words ("Slurm did not answer:
    ...") and is asked again the next time."""
    if key not in _inventories:
        try:
            _inventories[key] = read()
        except unavailable as exc:
            return DeviceInventory("none", [], f"{engine} did not answer: {exc}")
    return _inventories[key]
