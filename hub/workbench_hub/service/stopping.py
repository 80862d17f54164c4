"""Stopping a user server for the hub's own reasons, one way for every rule: save first, then say why.

Idle reclaim (``gpu_reclaim.py``), the session limit (``session_limits.py``)
and a reservation's preemption (``reservation_enforcer.py``) all stop a
server through ``Stopper.stop_for``, which:

1. posts the rule's notice once more as "stopping now"
   (``NoticeBook.warn``: the pending warning of that kind, or a new one when
   the rule never warned) and puts the server's pending notices on its GPU
   monitor with ``"stopping": true`` on that one (``PUT api/gpu/notices``,
   through the proxy). The user's JupyterLab saves every open document with
   unsaved changes as soon as it sees it; kernels that asked with
   ``workbench_gpu_monitor.on_stop`` are told too;
2. asks the server how that save round went (``GET api/gpu/saves?notice_id=``)
   every half second until every browser tab that was open has reported, or
   ``--save-wait-seconds`` (``WORKBENCH_SAVE_WAIT_SECONDS``, 20) have passed.
   A server that does not answer is stopped anyway, and the sentence says so;
3. records the stop (``NoticeBook.done``) with the rule's sentence and what
   happened to open work: "Your server was stopped at 10:30: idle GPU
   reclaimed after 30 minutes below 5 % use. We saved 3 notebooks first.
   Your files are kept." The spawn page and the hub's home page show it
   until the next start; the spawner's stop writes its reason (and the
   sentence) into the usage ledger;
4. stops the server through the hub's API (the spawner releases the GPUs).

Several servers are stopped at once with ``asyncio.gather`` of their
``stop_for``: each waits for its own save round, never for the others'.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from workbench_spawner.ledger.notices import NoticeBook
from workbench_spawner.ledger.store import utcnow

from .hub_client import HubClient, HubUnavailableError
from .notice_delivery import Sharing
from .user_servers import ServerUnreachableError, UserServers

log = logging.getLogger("workbench.service")

DEFAULT_SAVE_WAIT = 20.0
POLL_SECONDS = 0.5
KEPT = "Your files are kept."
NOTHING_TO_SAVE = "Open notebooks were saved first."
UNREACHABLE = (
    "Your server could not be reached in time to save open notebooks first; "
    "JupyterLab's autosave keeps changes up to 2 minutes old."
)

# How a save round ended (``SaveRound.outcome``).
SAVED, NOTHING, NOT_REACHED, TIMED_OUT = "saved", "nothing to save", "unreachable", "timed out"


@dataclass(frozen=True)
class SaveRound:
    """What the server's open tabs did before the stop: ``outcome`` one of ``SAVED``, ``NOTHING``,
    ``NOT_REACHED``, ``TIMED_OUT``; ``saved``/``failed`` the documents reported so far."""

    outcome: str
    saved: int = 0
    failed: int = 0
    detail: str = ""

    def sentence(self) -> str:
        """What the stop box says about open work."""
        notebooks = f"{self.saved} notebook" + ("" if self.saved == 1 else "s")
        if self.outcome in (SAVED, NOTHING) and self.failed:
            return (
                f"We saved {notebooks} first; {self.failed} could not be saved, and JupyterLab's autosave keeps "
                "their changes up to 2 minutes old."
            )
        if self.outcome == SAVED:
            return f"We saved {notebooks} first."
        if self.outcome == NOTHING:
            return NOTHING_TO_SAVE
        if self.saved:  # timed out after some tabs reported
            return (
                f"We saved {notebooks} first; another open tab could not be reached in time, and JupyterLab's "
                "autosave keeps its changes up to 2 minutes old."
            )
        return UNREACHABLE


def stopped_sentence(at: datetime, zone: tzinfo, cause: str) -> str:
    """'Your server was stopped at 10:30: <cause>.' with the hub's clock time."""
    return f"Your server was stopped at {at.astimezone(zone):%H:%M}: {cause}."


def zone_of(name: str) -> tzinfo:
    try:
        return ZoneInfo(name or "UTC")
    except (ZoneInfoNotFoundError, ValueError, OSError):  # unknown, malformed or unreadable: the hub's clock in UTC
        return UTC


@dataclass(frozen=True)
class Stopped:
    """One ``stop_for``: the save round, the sentence recorded, and whether the hub took the stop."""

    user: str
    server: str
    save: SaveRound
    message: str
    stopped: bool


class Stopper:
    """``stop_for`` as every rule of the service calls it.

    ``servers`` None (tests without user servers) skips the save round, which
    then counts as not reached. ``zone`` gives the hub's time zone (the
    settings may change); ``clock`` the time a stop is said to happen;
    ``sharing`` (blocking) the time-sliced GPUs sent with the notices, as
    ``notice_delivery`` sends them, so the status bar keeps them."""

    def __init__(
        self,
        notices: NoticeBook,
        hub: HubClient,
        servers: UserServers | None,
        save_wait: float = DEFAULT_SAVE_WAIT,
        zone: Callable[[], tzinfo] = lambda: UTC,
        clock: Callable[[], datetime] = utcnow,
        sharing: Callable[[], Sharing] | None = None,
        poll: float = POLL_SECONDS,
    ):
        self.notices = notices
        self.hub = hub
        self.servers = servers
        self.save_wait = save_wait
        self.zone = zone
        self.clock = clock
        self.sharing = sharing
        self.poll = poll

    async def stop_for(
        self,
        user: str,
        server: str,
        *,
        kind: str,
        cause: str,
        reason: str,
        hint: str = "",
        path: str | None = None,
        at: datetime | None = None,
    ) -> Stopped:
        """Save open work, say why, stop. ``cause``: the rule's words after "stopped at 10:30: " ("session
        limit of 4 hours reached"); ``reason``: the usage ledger's ("session limit: 4 h"); ``path``: the
        server's URL path (None: asked of the hub); ``at``: the time the sentence gives (default now)."""
        label = f"{user}/{server or 'default'}"
        at = at or self.clock()
        zone = self.zone()
        stopping = await asyncio.to_thread(
            self.notices.warn,
            user,
            server,
            kind=kind,
            message=f"Your server is being stopped now: {cause}. Open notebooks are being saved.",
            hint=hint,
            stop_at=at,
        )
        save = await self.save_round(user, server, stopping.id, path)
        message = f"{stopped_sentence(at, zone, cause)} {save.sentence()} {KEPT}"
        await asyncio.to_thread(self.notices.done, user, server, kind=kind, message=message, hint=hint, reason=reason)
        log.info(
            "Stopping %s (%s); open work: %s%s",
            label,
            reason,
            save.outcome,
            f" ({save.saved} saved, {save.failed} failed)" if save.saved or save.failed else "",
        )
        if save.detail:
            log.info("Save round of %s: %s", label, save.detail)
        try:
            await self.hub.stop_server(user, server)
        except HubUnavailableError as exc:
            log.warning("Could not stop %s: %s", label, exc)
            return Stopped(user, server, save, message, False)
        return Stopped(user, server, save, message, True)

    async def save_round(self, user: str, server: str, notice_id: int, path: str | None) -> SaveRound:
        """Push the stopping notice and wait, at most ``save_wait`` seconds, for the tabs' reports."""
        if self.servers is None or self.save_wait <= 0:
            return SaveRound(NOT_REACHED, detail="no save round (the service does not reach user servers)")
        last: dict = {}
        try:
            async with asyncio.timeout(self.save_wait):
                if path is None:
                    path = await self._server_path(user, server)
                    if path is None:
                        return SaveRound(NOT_REACHED, detail="the hub lists no running server")
                notices = [
                    {**n.to_json(), **({"stopping": True} if n.id == notice_id else {})}
                    for n in await asyncio.to_thread(self.notices.pending, user, server)
                ]
                sharing = (await asyncio.to_thread(self.sharing)).get((user, server), []) if self.sharing else []
                await self.servers.put_notices(path, notices, sharing)
                while True:
                    try:
                        last = await self.servers.saves(path, notice_id)
                    except ServerUnreachableError as exc:
                        if exc.code in (404, 405):  # a monitor without save rounds: nothing will report
                            return SaveRound(NOT_REACHED, detail=str(exc))
                        last = {**last, "error": str(exc)}  # a moment's trouble: ask again until the deadline
                    if last.get("done"):
                        saved, failed = _count(last, "saved"), _count(last, "failed")
                        return SaveRound(SAVED if saved else NOTHING, saved, failed)
                    await asyncio.sleep(self.poll)
        except TimeoutError:
            detail = last.get("error") or (
                f"{_count(last, 'reported')} of {_count(last, 'active_clients')} open tabs reported"
                if last
                else "no answer"
            )
            return SaveRound(
                TIMED_OUT, _count(last, "saved"), _count(last, "failed"), f"{detail} in {self.save_wait:g} s"
            )
        except ServerUnreachableError as exc:
            return SaveRound(NOT_REACHED, detail=str(exc))

    async def _server_path(self, user: str, server: str) -> str | None:
        model = await self.hub.user(user)
        found = ((model or {}).get("servers") or {}).get(server) or {}
        return found.get("url") if found.get("ready") else None


def _count(data: dict, key: str) -> int:
    value = data.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def make_stopper(fleet, hub: HubClient, servers: UserServers | None, save_wait: float, clock=utcnow) -> Stopper:
    """The service's one Stopper: the fleet's database, the hub's time zone, the time-sliced GPUs."""
    from .notice_delivery import time_sliced

    return Stopper(
        NoticeBook(fleet.store, clock=clock),
        hub,
        servers,
        save_wait=save_wait,
        zone=lambda: zone_of(fleet.settings.time_zone),
        clock=clock,
        sharing=lambda: time_sliced(fleet.store.leases(), fleet.settings.slots()),
    )
