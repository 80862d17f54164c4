"""The drain API under /services/workbench/api/drains: close a GPU to new servers, e.g. to change its MIG layout.

* ``GET api/drains`` (``custom:workbench:read``): every drained GPU or
  slice, with the inventory devices it closes and the servers still on
  them. Once a drain lists no holders, nothing runs there and its layout
  may change.
* ``PUT api/drains/{gpu}`` (``custom:workbench:admin``): drain a GPU named
  by its UUID (``GPU-...``; a GPU in MIG mode with all its slices), one
  slice's ``MIG-...`` UUID, or its index on this hub. Body optional:
  ``{"reason": "...", "stop_servers_in_minutes": N}`` (``DrainBody`` in
  ``openapi.yaml``). 200 with the drain, the device UUIDs it closes and
  their holders; draining again keeps the first ``since``. 404 for a name
  that is no GPU of this hub, 400 for an index that is on several nodes or
  a bad body (nothing stored), 409 where an engine places (below).
* ``DELETE api/drains/{gpu}``: open it to new servers again (204), and
  withdraw the stop warnings of servers left on no drained device. 404
  when nothing by that name is drained; 409 for a slice whose whole GPU is
  drained (undrain the GPU).

Servers already on a drained GPU keep running until they stop: draining
only stops new leases (``HostAllocator.candidates`` reads the drains on
every try, so requests already waiting in line are not given it either).
With ``stop_servers_in_minutes`` (a number above 0; absent or null: leave
them running) each server on it is warned now and stopped at that time
(``drain_stops.py``: the countdown lives in their pending ``drain``
notices, so a restarted service keeps it); each holder then shows its
``stop_at``.

Only the hub's own placement (``placement`` "host" in the published
settings: local, docker) reads drains. An engine (Slurm, Kubernetes) places
by itself, so there PUT answers 409 with the engine's own command
(``NodeDrain`` of the backend's extension) and stores nothing; GET and DELETE still work, so
a drain stored before the hub moved to an engine can be removed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime

from workbench_devices import GPUDevice
from workbench_hub.service.drain_stops import KIND as DRAIN_KIND
from workbench_hub.service.drain_stops import clear_moot, warn_holders
from workbench_hub.service.handlers import APIHandler
from workbench_hub.service.stopping import zone_of
from workbench_spawner.backend import node_drain_of
from workbench_spawner.ledger.drain_book import (
    AmbiguousGPUError,
    Drain,
    DrainBook,
    DrainTarget,
    UnknownGPUError,
    covered,
    resolve_gpu,
)
from workbench_spawner.ledger.notices import NoticeBook

log = logging.getLogger("workbench.service")


def drain_json(
    drain: Drain,
    devices: Sequence[GPUDevice],
    holders: Mapping[str, list[tuple[str, str]]],
    stops: Mapping[tuple[str, str], datetime] | None = None,
) -> dict:
    """A stored drain with what it closes now: the inventory's device UUIDs (empty: none on this hub any
    more) and the servers still on them, which the admin waits for before changing the layout, each with
    the time it will be stopped (``stops``: its pending ``drain`` notice's ``stop_at``; None: not asked)."""
    closes = [d.uuid for d in covered(drain.gpu_uuid, devices)]
    held = list(dict.fromkeys([drain.gpu_uuid, *closes]))
    stops = stops or {}
    return {
        **drain.to_json(),
        "devices": closes,
        "holders": [
            {"uuid": uuid, "user": user, "server": server, "stop_at": _iso(stops.get((user, server)))}
            for uuid in held
            for user, server in holders.get(uuid, [])
        ],
    }


def _iso(when: datetime | None) -> str | None:
    return when.isoformat() if when is not None else None


def stop_times(store) -> dict[tuple[str, str], datetime]:
    """(user, server) -> when its drain warning says it will be stopped (blocking)."""
    return {(n.user, n.server): n.stop_at for n in NoticeBook(store).pending() if n.kind == DRAIN_KIND and n.stop_at}


class DrainListHandler(APIHandler):
    async def get(self):
        await self.require_read()
        store, devices = self.fleet.store, self.fleet.inventory.devices

        def view() -> list[dict]:
            holders, stops = store.holders(), stop_times(store)
            return [drain_json(d, devices, holders, stops) for d in DrainBook(store).rows()]

        self.send({"drains": await asyncio.to_thread(view)})


class DrainHandler(APIHandler):
    """One GPU or slice, named as ``resolve_gpu`` reads a name; unknown names are 404 with where to look."""

    def _target(self, name: str) -> DrainTarget:
        try:
            return resolve_gpu(name, self.fleet.inventory.devices)
        except UnknownGPUError as exc:
            self.fail(
                404,
                f"{exc}; the fleet page ({self.settings['prefix']}) or GET api/gpus lists each GPU's index and UUID",
            )
        except AmbiguousGPUError as exc:
            self.fail(400, str(exc))

    def _node_of(self, name: str) -> str:
        """The one node a name's devices are on, or "" (unknown name, several nodes, a node-less inventory)."""
        devices = self.fleet.inventory.devices
        try:
            target = resolve_gpu(name, devices)
        except (UnknownGPUError, AmbiguousGPUError):
            return ""
        nodes = {d.node for d in devices if d.uuid == target.gpu_uuid or d.uuid in target.devices}
        return nodes.pop() if len(nodes) == 1 else ""

    async def put(self, name: str):
        await self.require_admin("drain GPUs")
        settings = self.fleet.settings
        if settings.placement == "engine":  # nothing here would read the drain: say so, store nothing
            self.fail(409, node_drain_of(settings.backend).refusal(self._node_of(name)))
        body = self.valid_body("DrainBody", "invalid drain") if self.request.body else {}
        reason = body.get("reason") or ""
        minutes = body.get("stop_servers_in_minutes")  # the schema checked it: None, or a number in (0, a week]
        target = self._target(name)
        store, devices, by = self.fleet.store, self.fleet.inventory.devices, self.caller_name()
        zone = zone_of(settings.time_zone)

        def drain() -> tuple[dict, int]:
            (stored,) = DrainBook(store).drain([target.gpu_uuid], reason, by)
            warned = warn_holders(store, devices, [target.gpu_uuid, *target.devices], minutes, zone) if minutes else []
            return drain_json(stored, devices, store.holders(), stop_times(store)), len(warned)

        view, warned = await asyncio.to_thread(drain)
        log.info(
            "%s drained %s (%d device(s); %d server(s) still on it%s): %s",
            by,
            target.gpu_uuid,
            len(view["devices"]),
            len(view["holders"]),
            f"; {warned} warned, to be stopped in {minutes:g} min" if minutes else "",
            reason or "no reason given",
        )
        self.send(view)

    async def delete(self, name: str):
        await self.require_admin("undrain GPUs")
        book = DrainBook(self.fleet.store)
        drained = await asyncio.to_thread(book.drained)
        devices = self.fleet.inventory.devices
        if name.strip() in drained and not covered(name.strip(), devices):
            target = DrainTarget(name.strip(), ())  # a device no longer on this hub: its drain may go
        else:
            target = self._target(name)
        parent = next((d.parent_uuid for d in devices if d.uuid == target.gpu_uuid), "")
        if parent and parent in drained:
            self.fail(
                409,
                f"{target.gpu_uuid} is a slice of {parent}, which is drained as a whole; "
                f"undrain that GPU to open all its slices",
            )
        removed = await asyncio.to_thread(book.undrain, [target.gpu_uuid, *target.devices])
        if not removed:
            self.fail(404, f"{target.gpu_uuid} is not drained; GET api/drains lists what is")
        # Servers on no drained device any more will not be stopped: their warnings go now.
        withdrawn = await asyncio.to_thread(clear_moot, self.fleet.store, devices)
        log.info(
            "%s undrained %s%s",
            self.caller_name(),
            ", ".join(removed),
            f"; stop warnings withdrawn for {len(withdrawn)} server(s)" if withdrawn else "",
        )
        self.set_status(204)
        self.finish()


def drain_routes(prefix: str) -> list[tuple]:
    name = r"([^/]+)"
    return [
        (prefix + "api/drains", DrainListHandler),
        (prefix + "api/drains/" + name, DrainHandler),
    ]
