"""Stop servers that ran longer than the session length their quota had when they started.

A quota's ``max_session_hours`` is recorded with each server when the spawner
admits it (``gpu_session_limits``), so lowering a quota later never cuts a
running session. Every ``--session-check-seconds`` (``WORKBENCH_SESSION_CHECK_SECONDS``,
60; 0 turns it off) the service lists the hub's servers and stops, through the
hub API, every ready one whose recorded limit is past. A server still starting
is left alone: its start is not its session.

A ``lead`` before its limit (the idle rule's warning lead,
``WORKBENCH_GPU_IDLE_WARN_MINUTES``, 10 minutes; at most the session's
length) a server is warned (``NoticeBook.warn``, kind ``session``): "Your
server will be stopped at 16:00: session limit of 4 hours." JupyterLab
shows the countdown, saves open documents when it ends, and kernels that
asked with ``workbench_gpu_monitor.on_stop(lead=...)`` are told. The
warning goes when the server stops first. At the limit the stop goes
through ``stopping.Stopper.stop_for``: the user's open notebooks are saved
first, and the spawn page and home page say "Your server was stopped at
14:00: session limit of 4 hours reached." (ledger reason "session limit:
4 h"). A server found past its limit is stopped then, warned or not: the
limit is the quota's, not a guess.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta

from workbench_spawner.ledger.quota_book import QuotaBook
from workbench_spawner.ledger.store import utcnow

from .hub_client import HubClient
from .stopping import Stopper

log = logging.getLogger("workbench.service")
KIND = "session"
AFTER_LIMIT = "Start again for a new session; your quota sets how long one may run."
WARN_HINT = "Save your work now. Your files stay; start again afterwards for a new session."
DEFAULT_LEAD = timedelta(minutes=10)


def session_length(hours: float) -> str:
    """'4 hours', '1 hour', '0.5 hours'."""
    return f"{hours:g} hour{'' if hours == 1 else 's'}"


def session_cause(hours: float) -> str:
    """The stop box's words: 'session limit of 4 hours reached'."""
    return f"session limit of {session_length(hours)} reached"


def session_warning(at_text: str, hours: float) -> str:
    """The countdown's words: 'Your server will be stopped at 16:00: session limit of 4 hours.'"""
    return f"Your server will be stopped at {at_text}: session limit of {session_length(hours)}."


def warn_lead(lead: timedelta, hours: float) -> timedelta:
    """How long before the limit the warning comes: ``lead``, at most the session itself (never negative)."""
    return max(timedelta(0), min(lead, timedelta(hours=hours)))


def session_reason(hours: float) -> str:
    """The usage ledger's reason: 'session limit: 4 h' (``reasons.reason_kind``: 'session limit')."""
    return f"session limit: {hours:g} h"


async def stop_overlong_servers(
    book: QuotaBook, hub: HubClient, stopper: Stopper, lead: timedelta = DEFAULT_LEAD
) -> list[tuple[str, str]]:
    """Warn the servers within ``lead`` of their recorded session limit, and stop the ones past it
    (``stopper.stop_for``: open notebooks saved first, the sentence recorded, all at once); withdraw the
    warnings of servers that stopped first. Returns (user, server) of each stopped."""
    notices = stopper.notices
    limits = await asyncio.to_thread(book.session_limits)
    pending = {(n.user, n.server): n for n in await asyncio.to_thread(notices.pending) if n.kind == KIND}
    if not limits and not pending:
        return []
    due = []
    kept: set[tuple[str, str]] = set()
    now = utcnow()
    zone = stopper.zone()
    for user in await hub.users():
        for server_name, server in (user.get("servers") or {}).items():
            key = (user["name"], server_name)
            hours = limits.get(key)
            started = server.get("started")
            if hours is None or not started or server.get("pending") or not server.get("ready"):
                continue
            began = datetime.fromisoformat(started.replace("Z", "+00:00"))
            end = began + timedelta(hours=hours)
            if now - began <= timedelta(hours=hours):
                if now >= end - warn_lead(lead, hours):
                    kept.add(key)
                    message = session_warning(f"{end.astimezone(zone):%H:%M}", hours)
                    notice = pending.get(key)
                    if notice is None or notice.stop_at != end or notice.message != message:
                        await asyncio.to_thread(
                            notices.warn, *key, kind=KIND, message=message, hint=WARN_HINT, stop_at=end
                        )
                        if notice is None:
                            log.info(
                                "Warned %s/%s: its %g-hour session limit ends at %s",
                                user["name"],
                                server_name or "default",
                                hours,
                                end.isoformat(),
                            )
                continue
            kept.add(key)
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
    # The server stopped (or restarted, a new session) before its limit: the warning is moot.
    for key in pending.keys() - kept:
        await asyncio.to_thread(notices.clear, *key, kind=KIND)
    return [(done.user, done.server) for done in await asyncio.gather(*due) if done.stopped]
