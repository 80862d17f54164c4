"""My GPUs: one hub user's own GPU quota, GPU-hours this week, servers with their GPUs, and past stops.

A student asks "why can I not start a second GPU server", "how much of my
week is left", "why was my server stopped on Tuesday". The answer is theirs
alone, so it needs only ``custom:workbench:self``, which the hub's ``user``
role grants every user (``scopes.py``); the fleet page stays for readers.
``GET api/me`` answers it as JSON and the My GPUs page (``me``, and the
service's front page for a user who may not read the fleet) shows the same:

* the effective quota and where it comes from ("own quota", "from group
  ml-course", "default");
* the GPU-hours of the rolling last 7 days (the same ledger read as
  ``api/usage``) against the weekly budget, with what is left;
* each server of theirs the hub runs or whose lease the ledger holds, with
  its state and the GPUs or MIG slices it holds, in the home page's words
  ("1g.18gb slice of H200-141GB (GPU 0)"), simulated or not;
* their newest ended leases (``ends.recent_stops`` for them), each with the
  sentence they were told, and the week's ends by reason.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from workbench_hub.home_page import gpu_words
from workbench_hub.service.ends import ends_by_reason, recent_stops
from workbench_hub.service.fleet import Fleet, server_usage
from workbench_hub.service.handlers import APIHandler, WorkbenchHandler, unknown_user
from workbench_spawner.form.servers import server_label
from workbench_spawner.ledger.gpu_hours import WEEK, gpu_hours_split
from workbench_spawner.ledger.store import Lease, utcnow


def server_state(server: Mapping | None) -> str:
    """How the hub's user model says a server is: running, starting, stopping, or not running."""
    if not server:
        return "not running"
    if server.get("pending") == "spawn":
        return "starting"
    if server.get("pending") == "stop":
        return "stopping"
    return "running" if server.get("ready") else "not running"


def _gpu(fleet: Fleet, uuid: str, lease: Lease, devices: Mapping[str, Any]) -> dict:
    device = devices.get(uuid)
    # A device the inventory does not list (any more): its UUID is all there is.
    entry = {
        "uuid": uuid,
        "label": uuid,
        "model": None,
        "index": None,
        "node": lease.node or fleet.settings.node,
        "mig": False,
        "profile": None,
        "simulated": fleet.simulated,
        "time_sliced": False,
        "since": lease.since.isoformat(),
    }
    if device is not None:
        entry.update(
            label=gpu_words(device),
            model=device.model or device.name,
            index=device.index,
            mig=device.mig,
            profile=device.profile or None,
            simulated=device.simulated,
            # More than one server may hold it at once (WORKBENCH_SERVERS_PER_GPU): its memory is shared.
            time_sliced=fleet.settings.slots_for(device) > 1,
        )
    return entry


def my_gpus(fleet: Fleet, model: Mapping, now: datetime) -> dict:
    """api/me's answer for the hub user ``model`` (the hub's user model: name, groups, servers). Reads the
    GPU database: call it in a worker thread."""
    name = model["name"]
    groups = list(model.get("groups") or [])
    quota = fleet.book.effective(name, groups, fleet.default).to_json()
    split = gpu_hours_split(fleet.store, now, user=name)
    leases = fleet.store.leases_of(name)
    held: dict[str, int] = {}
    for lease in leases:
        held[lease.server] = held.get(lease.server, 0) + len(lease.gpu_uuids)
    per_server = server_usage(split, {name: held}).get(name, {})
    hours = round(sum((split.get(name) or {}).values()), 4)
    budget = quota.get("gpu_hours_per_week")
    devices = {d.uuid: d for d in fleet.inventory.devices}
    by_server = {lease.server: lease for lease in leases}
    hub_servers: Mapping[str, Mapping] = model.get("servers") or {}
    servers = []
    for server in sorted(set(hub_servers) | set(by_server), key=lambda s: (s != "", s)):
        holding = by_server.get(server)
        running = hub_servers.get(server)
        servers.append(
            {
                "name": server,
                "label": server_label(server),
                "state": server_state(running),
                "url": running.get("url") if running and running.get("ready") else None,
                "held_gpus": held.get(server, 0),
                "gpu_hours_week": (per_server.get(server) or {}).get("gpu_hours_week", 0.0),
                "gpus": [_gpu(fleet, uuid, holding, devices) for uuid in holding.gpu_uuids] if holding else [],
            }
        )
    return {
        "name": name,
        "groups": groups,
        "simulated": fleet.simulated,
        "quota": quota,
        "window_start": (now - WEEK).isoformat(),
        "window_end": now.isoformat(),
        "gpu_hours_week": hours,
        "gpu_hours_left": None if budget is None else round(max(0.0, budget - hours), 4),
        "held_gpus": sum(held.values()),
        "servers": servers,
        "stops": recent_stops(fleet.store, users=[name]),
        "ends_by_reason": ends_by_reason(fleet.store, now - WEEK, {name}),
    }


async def my_gpus_of(handler: WorkbenchHandler, name: str) -> dict:
    """``my_gpus`` for the hub user ``name``, their model read from the hub (groups and servers: the caller's
    own token may be narrowed to less); a user the hub no longer knows is a 404."""
    await handler.wait_for_settings()
    model = await handler.hub.user(name)
    if model is None:
        raise LookupError(unknown_user(name))
    return await asyncio.to_thread(my_gpus, handler.fleet, model, utcnow())


class MyGPUsHandler(APIHandler):
    """``GET api/me``: the caller's own GPUs (custom:workbench:self, or a scope that reads everyone's)."""

    async def get(self):
        caller = self.require_own("reading your own GPUs (api/me)")
        try:
            self.send(await my_gpus_of(self, caller["name"]))
        except LookupError as exc:
            self.fail(404, str(exc))
