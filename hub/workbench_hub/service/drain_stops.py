"""Drained for maintenance: warn the servers on a drained GPU, then stop them at the time the admin gave.

A drain (``drain_handlers.py``) closes a GPU to new servers; the servers on
it keep running until they stop. ``PUT api/drains/{gpu}`` with
``"stop_servers_in_minutes": N`` asks for more: every server then on the
drained devices gets a notice at once (``NoticeBook.warn``, kind ``drain``):
"Your server will be stopped at 14:00: its GPU is being drained for
maintenance (new MIG layout)." with a countdown in JupyterLab. At that time
the service stops each one as it stops a server for any of its reasons
(``stopping.Stopper.stop_for``: open notebooks saved first, then "Your
server was stopped at 14:00: its GPU was drained for maintenance (new MIG
layout). ..." and the ledger reason ``drained: new MIG layout``).

Where the stop time lives: in the pending ``drain`` notices, not in the
drain book (``gpu_drains`` has no column for it). A notice's ``stop_at`` is
the truth: ``DrainStops.check``, run every ``--reservation-check-seconds``
(``WORKBENCH_RESERVATION_CHECK_SECONDS``, 15) by ``app.serve``, reads the
pending ``drain`` notices from the database on every pass, so a restarted
service keeps each countdown where it was (a stop time that passed while
the service was down is acted on at its first pass: the user was warned).
A pass also withdraws a warning whose reason went away: the GPU was
undrained (``DELETE api/drains/{gpu}`` withdraws them at once, too), or the
server stopped or holds no drained device any more. Draining again with a
new ``stop_servers_in_minutes`` sets a new stop time for the servers on
that GPU; without it, a countdown already running stays (undrain to end it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, tzinfo

from workbench_devices import GPUDevice
from workbench_spawner.ledger.drain_book import DrainBook
from workbench_spawner.ledger.notices import Notice, NoticeBook
from workbench_spawner.ledger.store import AllocationStore, utcnow

from .hub_client import HubClient
from .stopping import Stopper, zone_of

log = logging.getLogger("workbench.service")

KIND = "drain"
# The longest countdown PUT api/drains/{gpu} takes (a week; openapi.yaml's DrainBody says the same).
MAX_STOP_MINUTES = 10080
# A stop asked for is not asked again for this long (the hub's stop takes a moment to release the lease).
RESTOP_SECONDS = 60.0
WARN_HINT = (
    "Save your work now. Your files stay; start again afterwards on another GPU, or start a CPU-only server (0 GPUs)."
)
MAX_MESSAGE = 140
AFTER_DRAIN = "Start again on another GPU, or start a CPU-only server (0 GPUs)."


@dataclass(frozen=True)
class DrainedHolding:
    """A server on drained devices: how many GPUs it holds, which are drained, and the drains' reasons."""

    user: str
    server: str
    held: int
    drained: tuple[str, ...]
    reasons: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, str]:
        return (self.user, self.server)

    @property
    def reason(self) -> str:
        return "; ".join(r for r in self.reasons if r)


def _which(held: int, drained: int, future: bool) -> str:
    """'its GPU is being drained' / 'its GPUs were drained' / 'one of its GPUs was drained' ..."""
    if held <= 1 or drained >= held:
        subject, plural = ("its GPUs", True) if held > 1 else ("its GPU", False)
    elif drained == 1:
        subject, plural = "one of its GPUs", False
    else:
        subject, plural = f"{drained} of its GPUs", True
    verb = ("are being" if plural else "is being") if future else ("were" if plural else "was")
    return f"{subject} {verb} drained for maintenance"


def drain_cause(reason: str, held: int = 1, drained: int = 1) -> str:
    """The stop box's words: 'its GPU was drained for maintenance (new MIG layout)'."""
    return _which(held, drained, False) + (f" ({reason.strip()})" if reason.strip() else "")


def drain_warning(at_text: str, reason: str, held: int = 1, drained: int = 1) -> str:
    """'Your server will be stopped at 14:00: its GPU is being drained for maintenance (new MIG layout).'"""
    because = _which(held, drained, True) + (f" ({reason.strip()})" if reason.strip() else "")
    return f"Your server will be stopped at {at_text}: {because}."


def drain_notice(at_text: str, reason: str, held: int = 1, drained: int = 1) -> tuple[str, str]:
    """The warning's (message, hint): the reason in the message while it stays short enough for a JupyterLab
    notification (140 characters, as the idle rule's); a longer reason goes at the head of the hint."""
    message = drain_warning(at_text, reason, held, drained)
    if len(message) <= MAX_MESSAGE:
        return message, WARN_HINT
    return drain_warning(at_text, "", held, drained), f"The reason: {reason.strip()}. {WARN_HINT}"


def drain_reason(reason: str) -> str:
    """The usage ledger's reason (at most 64 characters): 'drained: new MIG layout'."""
    text = " ".join(reason.split()) or "maintenance"
    return f"drained: {text}"[:64].rstrip()


def drained_holdings(store: AllocationStore, devices: Sequence[GPUDevice]) -> dict[tuple[str, str], DrainedHolding]:
    """Every server holding a drained device now (blocking: one read of drains, one of leases)."""
    drains = {d.gpu_uuid: d.reason for d in DrainBook(store).rows()}
    if not drains:
        return {}
    parents = {d.uuid: d.parent_uuid for d in devices if d.parent_uuid}
    found: dict[tuple[str, str], DrainedHolding] = {}
    for lease in store.leases():
        drained, reasons = [], []
        for uuid in lease.gpu_uuids:
            by = uuid if uuid in drains else parents.get(uuid) if parents.get(uuid) in drains else None
            if by is not None:
                drained.append(uuid)
                reasons.append(drains[by])
        if drained:
            found[(lease.user, lease.server)] = DrainedHolding(
                lease.user, lease.server, len(lease.gpu_uuids), tuple(drained), tuple(dict.fromkeys(reasons))
            )
    return found


def warn_holders(
    store: AllocationStore,
    devices: Sequence[GPUDevice],
    uuids: Sequence[str],
    minutes: float,
    zone: tzinfo,
    now: datetime | None = None,
) -> list[Notice]:
    """Warn each server on ``uuids`` (a drain's stored UUID and the devices it covers) that it will be stopped
    ``minutes`` from now (blocking). A server warned before gets the new stop time."""
    stop_at = (now or utcnow()) + timedelta(minutes=minutes)
    at_text = f"{stop_at.astimezone(zone):%H:%M}"
    wanted = set(uuids)
    notices = NoticeBook(store)
    warned = []
    for holding in drained_holdings(store, devices).values():
        if not wanted.intersection(holding.drained):
            continue
        message, hint = drain_notice(at_text, holding.reason, holding.held, len(holding.drained))
        warned.append(
            notices.warn(holding.user, holding.server, kind=KIND, message=message, hint=hint, stop_at=stop_at)
        )
    return warned


def clear_moot(store: AllocationStore, devices: Sequence[GPUDevice]) -> list[tuple[str, str]]:
    """Withdraw the ``drain`` warnings of servers that hold no drained device any more (undrained, stopped,
    moved); blocking. Returns their (user, server)."""
    notices = NoticeBook(store)
    pending = [n for n in notices.pending() if n.kind == KIND]
    if not pending:
        return []
    holdings = drained_holdings(store, devices)
    cleared = []
    for notice in pending:
        if (notice.user, notice.server) not in holdings:
            notices.clear(notice.user, notice.server, kind=KIND)
            cleared.append((notice.user, notice.server))
    return cleared


@dataclass
class DrainPass:
    """What one pass did (tests and the log read it)."""

    stopped: list[tuple[str, str]] = field(default_factory=list)
    cleared: list[tuple[str, str]] = field(default_factory=list)
    rewarned: list[tuple[str, str]] = field(default_factory=list)


class DrainStops:
    """The loop that stops the servers of drains with a countdown, when their notice's time comes."""

    def __init__(self, fleet, hub: HubClient, stopper: Stopper, clock=utcnow):
        self.fleet = fleet
        self.hub = hub
        self.stopper = stopper
        self.notices = NoticeBook(fleet.store, clock=clock)
        self.clock = clock
        self._asked: dict[tuple[str, str], float] = {}

    async def check(self) -> DrainPass:
        report = DrainPass()
        pending = [n for n in await asyncio.to_thread(self.notices.pending) if n.kind == KIND]
        if not pending:
            return report

        def look():
            return drained_holdings(self.fleet.store, self.fleet.inventory.devices), zone_of(
                self.fleet.settings.time_zone
            )

        holdings, zone = await asyncio.to_thread(look)
        now = self.clock()
        stops = []
        for notice in pending:
            key = (notice.user, notice.server)
            holding = holdings.get(key)
            if holding is None:  # undrained, or the server stopped or moved: nothing to stop
                await asyncio.to_thread(self.notices.clear, notice.user, notice.server, kind=KIND)
                report.cleared.append(key)
                continue
            stop_at = notice.stop_at or now
            if stop_at > now:
                # The drain's reason may have changed (drained again): the countdown stays, the words follow.
                message, hint = drain_notice(
                    f"{stop_at.astimezone(zone):%H:%M}", holding.reason, holding.held, len(holding.drained)
                )
                if (message, hint) != (notice.message, notice.hint):
                    await asyncio.to_thread(
                        self.notices.warn, *key, kind=KIND, message=message, hint=hint, stop_at=stop_at
                    )
                    report.rewarned.append(key)
                continue
            if time.monotonic() - self._asked.get(key, -RESTOP_SECONDS) < RESTOP_SECONDS:
                continue
            self._asked[key] = time.monotonic()
            log.info(
                "Stopping %s/%s: %s drained (%s), stop time %s",
                notice.user,
                notice.server or "default",
                ", ".join(holding.drained),
                holding.reason or "no reason given",
                stop_at.isoformat(),
            )
            stops.append(
                (
                    notice,
                    self.stopper.stop_for(
                        notice.user,
                        notice.server,
                        kind=KIND,
                        cause=drain_cause(holding.reason, holding.held, len(holding.drained)),
                        reason=drain_reason(holding.reason),
                        hint=AFTER_DRAIN,
                        at=now,
                    ),
                )
            )
        for done in await asyncio.gather(*[stop for _, stop in stops]):
            if done.stopped:
                report.stopped.append((done.user, done.server))
        # A stop the hub refused (busy, restarting): the warning comes back with its time, so a pass after
        # RESTOP_SECONDS asks again (``stop_for`` recorded the stop and withdrew the warning).
        for notice, _ in stops:
            if (notice.user, notice.server) not in report.stopped:
                await asyncio.to_thread(
                    self.notices.warn,
                    notice.user,
                    notice.server,
                    kind=KIND,
                    message=notice.message,
                    hint=notice.hint,
                    stop_at=notice.stop_at,
                )
        cutoff = time.monotonic() - RESTOP_SECONDS
        self._asked = {k: v for k, v in self._asked.items() if v > cutoff}
        return report

    async def run_forever(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await self.check()
            except Exception as exc:  # noqa: BLE001 - loop boundary: the next pass tries again
                log.warning("Drain check failed: %s", exc)
