"""Stop servers that ran longer than the session length their quota had when they started.

A quota's ``max_session_hours`` is recorded with each server when the spawner
admits it (``gpu_session_limits``), so lowering a quota later never cuts a
running session. Every ``--session-check-seconds`` (``WORKBENCH_SESSION_CHECK_SECONDS``,
60; 0 turns it off) the service lists the hub's servers and stops, through the
hub API, every ready one whose recorded limit is past. A server still starting
is left alone: its start is not its session. Each stop is one log line.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta

from workbench_spawner.ledger.store import utcnow
from workbench_spawner.rules.quota import QuotaBook

from .hub_client import HubClient

log = logging.getLogger("workbench.service")


async def stop_overlong_servers(book: QuotaBook, hub: HubClient) -> list[tuple[str, str]]:
    """Stop the servers past their recorded session limit; returns (user, server) of each stopped."""
    limits = await asyncio.to_thread(book.session_limits)
    if not limits:
        return []
    stopped = []
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
            try:
                await hub.stop_server(user["name"], server_name)
                stopped.append((user["name"], server_name))
            except Exception as exc:
                log.warning("Could not stop %s/%s: %s", user["name"], server_name, exc)
    return stopped
