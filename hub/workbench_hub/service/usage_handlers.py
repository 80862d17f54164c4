"""``GET api/usage``: GPU-hours of the last 7 days per user, by why leases ended and by server, and how servers ended.

Anyone with ``custom:workbench:read`` reads every user's usage, one user's
(``?user=alice``) or one hub group's members' (``?group=ml-course``); any
other hub user reads only their own, with ``custom:workbench:self`` (every
user's through the hub's ``user`` role; a token narrowed to less is refused
with a sentence naming it). Besides each user's GPU-hours (in all
and by reason kind, ``gpu_hours_by_reason``), the answer counts the ends of
servers in the window by reason kind (``ends.ends_by_reason``), for the
same users: ``"ends_by_reason": {"out of memory": 12, "reclaimed": 7}``. A user
with several servers (JupyterHub's named servers) has their GPU-hours and held
GPUs per server too (``"servers": {"": {...}, "big": {...}}``); the splits by
reason and by server come from one read of the ledger, so both add up to the
user's total.
A user or group the hub does not know is a 404 with a sentence.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime

from workbench_hub.service.ends import ends_by_reason
from workbench_hub.service.fleet import server_usage
from workbench_hub.service.handlers import APIHandler, _check_name, unknown_user
from workbench_hub.service.scopes import READ_SCOPE
from workbench_spawner.ledger.gpu_hours import WEEK, gpu_hours_split
from workbench_spawner.ledger.store import utcnow


def usage_report(
    fleet, models: list[dict], now: datetime, user: str | None = None, names: set[str] | None = None
) -> tuple[list[dict], dict[str, int]]:
    """Each of the hub user ``models``' GPU-hours of the last 7 days (in all, by reason kind and by server),
    quota and held GPUs, and how servers ended in the window (of ``names``; None: everyone's): api/usage's
    answer, and a course's students (``course_handlers``). Blocking: call it from a worker thread. One read
    of the ledger for the hours: the total is the sum of the hours by reason, and by server."""
    split = gpu_hours_split(fleet.store, now, user=user)
    by_reason: dict[str, dict[str, float]] = {}
    for name, parts in split.items():
        kinds = by_reason.setdefault(name, {})
        for (_server, kind), value in parts.items():
            kinds[kind] = kinds.get(kind, 0.0) + value
    hours = {name: sum(parts.values()) for name, parts in split.items()}
    held = fleet.held_by_server()
    held_total = {name: sum(servers.values()) for name, servers in held.items()}
    users = fleet.user_summaries(models, hours, held_total, by_reason, server_usage(split, held))
    return users, ends_by_reason(fleet.store, now - WEEK, names)


class UsageHandler(APIHandler):
    async def get(self):
        caller = self.require_caller()
        wanted = self.get_argument("user", None)
        group = self.get_argument("group", None)
        if not self.can_read():
            if caller.get("kind") != "user":
                self.fail(403, f"this needs the {READ_SCOPE} scope")
            if group is not None:
                self.fail(403, f"reading a group's usage needs the {READ_SCOPE} scope; ask a hub admin")
            if wanted is not None and wanted != caller["name"]:
                self.fail(403, f"you may read only your own usage; everyone's needs the {READ_SCOPE} scope")
            self.require_own("reading your own GPU usage")
            wanted = caller["name"]
        if wanted is not None and group is not None:
            self.fail(400, "ask for one user (?user=) or one group (?group=), not both")
        await self.wait_for_settings()
        if wanted is not None:
            _check_name("user", wanted)
            model = await self.hub.user(wanted)
            if model is None:
                self.fail(404, unknown_user(wanted))
            models = [model]
        elif group is not None:
            _check_name("group", group)
            found = await self.hub.group(group)
            if found is None:
                self.fail(
                    404,
                    f"no group named {json.dumps(group)} on this hub; the hub's admin page lists the groups "
                    "(GET /hub/api/groups)",
                )
            members = set(found.get("users") or [])
            models = [u for u in await self.hub.users() if u["name"] in members]
        else:
            models = await self.hub.users()
        now = utcnow()
        fleet = self.fleet
        names = None if wanted is None and group is None else {m["name"] for m in models}

        users, ends = await asyncio.to_thread(usage_report, fleet, models, now, wanted, names)
        self.send(
            {
                "window_start": (now - WEEK).isoformat(),
                "window_end": now.isoformat(),
                "group": group,
                "users": users,
                "ends_by_reason": ends,
            }
        )
