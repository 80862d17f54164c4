"""The drain API under /services/workbench/api/drains: close a GPU to new servers, e.g. to change its MIG layout.

* ``GET api/drains`` (``custom:workbench:read``): every drained GPU or
  slice, with the inventory devices it closes and the servers still on
  them. Once a drain lists no holders, nothing runs there and its layout
  may change.
* ``PUT api/drains/{gpu}`` (``custom:workbench:admin``): drain a GPU named
  by its UUID (``GPU-...``; a GPU in MIG mode with all its slices), one
  slice's ``MIG-...`` UUID, or its index on this hub. Body optional:
  ``{"reason": "..."}`` (``DrainBody`` in ``openapi.yaml``). 200 with the
  drain, the device UUIDs it closes and their holders; draining again keeps
  the first ``since``. 404 for a name that is no GPU of this hub, 400 for
  an index that is on several nodes, 409 where an engine places (below).
* ``DELETE api/drains/{gpu}``: open it to new servers again (204). 404
  when nothing by that name is drained; 409 for a slice whose whole GPU is
  drained (undrain the GPU).

Servers already on a drained GPU keep running until they stop: draining
only stops new leases (``HostAllocator.candidates`` reads the drains on
every try, so requests already waiting in line are not given it either).

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

from workbench_devices import GPUDevice
from workbench_hub.service.handlers import APIHandler
from workbench_spawner.backend import node_drain_of
from workbench_spawner.ledger.drain_book import (
    AmbiguousGPU,
    Drain,
    DrainBook,
    DrainTarget,
    UnknownGPU,
    covered,
    resolve_gpu,
)

log = logging.getLogger("workbench.service")


def drain_json(drain: Drain, devices: Sequence[GPUDevice], holders: Mapping[str, list[tuple[str, str]]]) -> dict:
    """A stored drain with what it closes now: the inventory's device UUIDs (empty: none on this hub any
    more) and the servers still on them, which the admin waits for before changing the layout."""
    closes = [d.uuid for d in covered(drain.gpu_uuid, devices)]
    held = list(dict.fromkeys([drain.gpu_uuid, *closes]))
    return {
        **drain.to_json(),
        "devices": closes,
        "holders": [
            {"uuid": uuid, "user": user, "server": server} for uuid in held for user, server in holders.get(uuid, [])
        ],
    }


class DrainListHandler(APIHandler):
    async def get(self):
        await self.require_read()
        store, devices = self.fleet.store, self.fleet.inventory.devices

        def view() -> list[dict]:
            holders = store.holders()
            return [drain_json(d, devices, holders) for d in DrainBook(store).rows()]

        self.send({"drains": await asyncio.to_thread(view)})


class DrainHandler(APIHandler):
    """One GPU or slice, named as ``resolve_gpu`` reads a name; unknown names are 404 with where to look."""

    def _target(self, name: str) -> DrainTarget:
        try:
            return resolve_gpu(name, self.fleet.inventory.devices)
        except UnknownGPU as exc:
            self.fail(
                404,
                f"{exc}; the fleet page ({self.settings['prefix']}) or GET api/gpus lists each GPU's index and UUID",
            )
        except AmbiguousGPU as exc:
            self.fail(400, str(exc))

    def _node_of(self, name: str) -> str:
        """The one node a name's devices are on, or "" (unknown name, several nodes, a node-less inventory)."""
        devices = self.fleet.inventory.devices
        try:
            target = resolve_gpu(name, devices)
        except (UnknownGPU, AmbiguousGPU):
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
        target = self._target(name)
        store, devices, by = self.fleet.store, self.fleet.inventory.devices, self.caller_name()

        def drain() -> dict:
            (stored,) = DrainBook(store).drain([target.gpu_uuid], reason, by)
            return drain_json(stored, devices, store.holders())

        view = await asyncio.to_thread(drain)
        log.info(
            "%s drained %s (%d device(s); %d server(s) still on it): %s",
            by,
            target.gpu_uuid,
            len(view["devices"]),
            len(view["holders"]),
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
        log.info("%s undrained %s", self.caller_name(), ", ".join(removed))
        self.set_status(204)
        self.finish()


def drain_routes(prefix: str) -> list[tuple]:
    name = r"([^/]+)"
    return [
        (prefix + "api/drains", DrainListHandler),
        (prefix + "api/drains/" + name, DrainHandler),
    ]
