"""Where a held GPU's utilization comes from, per lease: the hub's host, or the user server's own monitor.

Each backend has one place where the number is true:

* **host** (local and docker backends; the GPUs are on the hub's machine):
  the fleet's readings, from NVML or the simulated source (``Fleet.readings``);
* **server** (the hub cannot see the node's GPUs: Slurm nodes, static GPU
  lists): the user server's GPU monitor, ``GET {server}api/gpu/metrics``,
  read through the proxy with the service's token (``user_servers.py``).

A MIG slice has neither: NVML has no utilization per slice. Its one honest
reading is DCGM's per-instance ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``, from the
dcgm-exporters the hub names (``dcgm_exporter_urls``; ``dcgm.py``).

``SourceChooser`` picks one per lease: a lease holding a slice reads from the
exporters when the hub names any (its whole GPUs, if any, as below); else a
source registered for the lease's node wins (a backend plugs its own in with
``register``), else the host's readings when the lease is on the hub's node
and the hub can read its GPUs, else the server's monitor. A source answers
``{uuid: percent or None}``; None means "no reading", which the idle rules
never count as idle.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from workbench_spawner.ledger.store import Lease

from .dcgm import DcgmReadings
from .user_servers import ServerUnreachableError, UserServers

Readings = dict[str, "float | None"]


class UtilizationSource(Protocol):
    name: str

    async def read(self, lease: Lease, server_path: str | None) -> Readings:
        """Utilization per GPU of ``lease`` (None where there is no reading); never raises."""


def _percent(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def lease_readings(lease: Lease, by_uuid: dict) -> Readings:
    """Each of the lease's GPUs: its utilization, or None where the reading is missing or not "ok".

    None never counts as idle (``idle.advance`` resets the clock on it), so a GPU the source does
    not list, or lists in an error state, can never get a server reclaimed."""
    out: Readings = {}
    for uuid in lease.gpu_uuids:
        reading = by_uuid.get(uuid) or {}
        ok = reading.get("state", "ok") == "ok"
        out[uuid] = _percent(reading.get("utilization_percent")) if ok else None
    return out


class HostReadings:
    """The hub's own view of its GPUs (NVML or simulated), shared with the fleet page."""

    name = "host"

    def __init__(self, fleet):
        self.fleet = fleet

    def can_read(self) -> bool:
        return self.fleet.inventory.source in ("nvml", "simulated") and bool(self.fleet.inventory.devices)

    async def read(self, lease: Lease, server_path: str | None) -> Readings:
        return lease_readings(lease, await asyncio.to_thread(self.fleet.readings))


class ServerMonitorReadings:
    """The user server's GPU monitor, where the hub cannot see the node's GPUs."""

    name = "server"

    def __init__(self, servers: UserServers):
        self.servers = servers
        self.last_error: dict[tuple[str, str], str] = {}

    async def read(self, lease: Lease, server_path: str | None) -> Readings:
        key = (lease.user, lease.server)
        if not server_path:
            self.last_error[key] = "the hub does not list the server as running"
            return {uuid: None for uuid in lease.gpu_uuids}
        try:
            snapshot = await self.servers.metrics(server_path)
        except ServerUnreachableError as exc:
            self.last_error[key] = str(exc)
            return {uuid: None for uuid in lease.gpu_uuids}
        self.last_error.pop(key, None)
        seen = {g.get("uuid"): g for g in snapshot.get("gpus") or [] if isinstance(g, dict)}
        return lease_readings(lease, seen)


class SourceChooser:
    def __init__(
        self,
        host: HostReadings,
        server: ServerMonitorReadings,
        host_node: str | None = None,
        dcgm: DcgmReadings | None = None,
    ):
        self.host = host
        self.server = server
        self.dcgm = dcgm  # None: slices read like whole GPUs (no reading: no idle rule)
        self._host_node = host_node  # None: the node in the hub's stored settings, read each time
        self._by_node: dict[str, UtilizationSource] = {}

    def host_node(self) -> str:
        return self._host_node if self._host_node is not None else self.host.fleet.settings.node

    def register(self, node: str, source: UtilizationSource) -> None:
        """Read the leases on ``node`` from ``source`` (a backend that knows better, e.g. a Slurm node's agent)."""
        self._by_node[node] = source

    def for_lease(self, lease: Lease) -> UtilizationSource:
        base = self._base(lease)
        if self.dcgm is not None and self.dcgm.covers(lease):
            return self.dcgm.over(base)
        return base

    def _base(self, lease: Lease) -> UtilizationSource:
        if lease.node in self._by_node:
            return self._by_node[lease.node]
        if lease.node in ("", self.host_node()) and self.host.can_read():
            return self.host
        return self.server
