"""The idle-GPU API of the workbench service: idle time per held GPU, and exempt groups.

``GET api/idle`` (read scope): the hub's rule, the exempt groups, and for
each held GPU how long it has been idle, its last reading and where the
reading came from. ``GET api/idle/exemptions`` lists the exempt groups;
``GET api/idle/exemptions/{group}`` says whether a hub group is exempt;
``PUT|DELETE api/idle/exemptions/{group}`` (admin scope) exempts it
from idle reclaim or ends the exemption (body of PUT: optional
``{"reason": "..."}``, checked against ``IdleExemptionBody`` in
``openapi.yaml``). Exempting applies from the next pass of the loop; a
warning already shown is withdrawn then.
"""

from __future__ import annotations

import asyncio
import json
import logging

from workbench_hub.service.handlers import APIHandler
from workbench_spawner.ledger.idle_book import ExemptionError, IdleBook, check_group_name
from workbench_spawner.ledger.store import utcnow
from workbench_spawner.rules.idle import IdleRule

log = logging.getLogger("workbench.service")


def idle_view(book: IdleBook, settings) -> dict:
    now = utcnow()
    rule = IdleRule(settings.gpu_idle_minutes, settings.gpu_idle_threshold, settings.gpu_idle_warn_minutes)
    gpus = []
    for t in book.tracks():
        idle = t.idle_for(now)
        gpus.append(
            {
                "node": t.node,
                "uuid": t.gpu_uuid,
                "user": t.user,
                "server": t.server,
                "idle_seconds": None if idle is None else round(idle.total_seconds(), 1),
                "idle_since": t.idle_since.isoformat() if t.idle_since else None,
                "utilization_percent": t.utilization,
                "last_reading": t.last_reading.isoformat() if t.last_reading else None,
                "reading_source": t.source or None,
            }
        )
    return {
        "default_rule": {
            "gpu_idle_minutes": rule.minutes,
            "gpu_idle_threshold": rule.threshold,
            "warn_minutes_before": rule.lead.total_seconds() / 60,
            "enabled": rule.enabled,
            "describe": rule.describe(),
        },
        "exempt_groups": list(book.exempt_groups().values()),
        "gpus": gpus,
    }


class IdleHandler(APIHandler):
    async def get(self):
        await self.require_read()
        book = IdleBook(self.fleet.store)
        settings = self.fleet.settings
        self.send(await asyncio.to_thread(idle_view, book, settings))


class ExemptionListHandler(APIHandler):
    async def get(self):
        await self.require_read()
        book = IdleBook(self.fleet.store)
        self.send({"exempt_groups": list((await asyncio.to_thread(book.exempt_groups)).values())})


class ExemptionHandler(APIHandler):
    """One hub group's exemption; like a group's quota, asking about a group the hub lacks is 404."""

    async def _group(self, name: str) -> None:
        try:
            check_group_name(name)
        except ExemptionError as exc:
            self.fail(400, f"invalid group name: {exc}")
        if await self.hub.group(name) is None:
            self.fail(404, f"no group named {json.dumps(name)} on this hub; create it on the hub's admin page first")

    async def _view(self, name: str) -> dict:
        exempt = await asyncio.to_thread(IdleBook(self.fleet.store).exempt_groups)
        return {"group": name, "exempt": name in exempt, "exemption": exempt.get(name)}

    async def get(self, name: str):
        await self.require_read()
        await self._group(name)
        self.send(await self._view(name))

    async def put(self, name: str):
        await self.require_admin()
        body = self.valid_body("IdleExemptionBody", "invalid exemption") if self.request.body else {}
        reason = body.get("reason") or ""
        await self._group(name)
        book = IdleBook(self.fleet.store)
        try:
            await asyncio.to_thread(book.exempt, name, reason, self.caller_name())
        except ExemptionError as exc:
            self.fail(400, f"not exempted: {exc}")
        log.info("%s exempted group %s from idle reclaim (%s)", self.caller_name(), name, reason or "no reason given")
        self.send(await self._view(name))

    async def delete(self, name: str):
        await self.require_admin()
        await self._group(name)
        if await asyncio.to_thread(IdleBook(self.fleet.store).unexempt, name):
            log.info("%s ended the idle exemption of group %s", self.caller_name(), name)
        self.set_status(204)
        self.finish()


def idle_routes(prefix: str) -> list[tuple]:
    name = r"([^/]+)"
    return [
        (prefix + "api/idle", IdleHandler),
        (prefix + "api/idle/exemptions", ExemptionListHandler),
        (prefix + "api/idle/exemptions/" + name, ExemptionHandler),
    ]
