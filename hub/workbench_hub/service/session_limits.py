"""Stop servers that ran longer than the session length their quota had when they started.

A quota's ``max_session_hours`` is recorded with each server when the spawner
admits it (``gpu_session_limits``), so lowering a quota later never cuts a
running session. Every ``--session-check-seconds`` (``WORKBENCH_SESSION_CHECK_SECONDS``,
60; 0 turns it off) the service lists the hub's servers and stops, through the
hub API, every ready one whose recorded limit is past. A server still starting
is left alone: its start is not its session. Each stop goes through
``stopping.Stopper.stop_for``: the user's open notebooks are saved first,
and the spawn page and home page say "Your server was stopped at 14:00:
session limit of 4 hours reached." (ledger reason "session limit: 4 h").
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta

from workbench_spawner.ledger.store import utcnow
from workbench_spawner.rules.quota import QuotaBook

from .hub_client import HubClient
from .stopping import Stopper

log = logging.getLogger("workbench.service")
KIND = "session"
AFTER_LIMIT = "Start again for a new session; your quota sets how long one may run."


def session_cause(hours: float) -> str:
    """The stop box's words: 'session limit of 4 hours reached'."""
    return f"session limit of {hours:g} hour{'' if hours == 1 else 's'} reached"


def session_reason(hours: float) -> str:
    """The usage ledger's reason: 'session limit: 4 h' (``reasons.reason_kind``: 'session limit')."""
    return f"session limit: {hours:g} h"


async def stop_overlong_servers(book: QuotaBook, hub: HubClient, stopper: Stopper) -> list[tuple[str, str]]:
    """Stop the servers past their recorded session limit (``stopper.stop_for``: open notebooks saved first,
    the sentence recorded, all at once); returns (user, server) of each stopped."""
    limits = await asyncio.to_thread(book.session_limits)
    if not limits:
        return []
    due = []
    now = utcnow()
    for user in await hub.users():
        for server_name, server in (user.get("servers") or {}).items():
            hours = limits.get((user["name"], server_name))
            started = server.get("started")
            if hours is None or not started or server.get("pending") or not server.get("ready"):
                continue
            began = datetime.fromisoformat(started.replace("Z", "+00:00"))
            if now - began <= timedelta(hours=hours):
                continue
            log.info(
                "Stopping %s/%s: it ran longer than its %g-hour session limit",
                user["name"],
                server_name or "default",
                hours,
            )
            due.append(
                stopper.stop_for(
                    user["name"],
                    server_name,
                    kind=KIND,
                    cause=session_cause(hours),
                    reason=session_reason(hours),
                    hint=AFTER_LIMIT,
                    path=server.get("url") or None,
                )
            )
    return [(done.user, done.server) for done in await asyncio.gather(*due) if done.stopped]
