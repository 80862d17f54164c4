"""Idle GPUs come back: warn, then stop, servers whose GPUs all stayed idle; deliver every notice.

What it does, every ``--idle-check-seconds`` (``WORKBENCH_GPU_IDLE_CHECK_SECONDS``,
default 30; 0 turns the loop off), in the workbench service:

1. lists the leases (the GPU database) and the hub's running servers;
2. reads each held GPU's utilization where it is true (``utilization.py``:
   the hub's NVML or simulated source for local and docker, the user
   server's own monitor where the hub cannot see the node's GPUs, the
   site's dcgm-exporter for a MIG slice, ``dcgm.py``);
3. advances each GPU's idle clock and judges each server by the rules of
   ``workbench_spawner.rules.idle`` with the user's rule (quota, else the hub's
   ``WORKBENCH_GPU_IDLE_MINUTES``) and the exempt groups;
4. warns (a notice: JupyterLab shows it with a countdown), withdraws the
   warning when a GPU got busy again, or stops the server as every rule of
   the service does (``stopping.Stopper.stop_for``: open notebooks saved
   first, then the ``done`` notice "Your server was stopped at 10:30: idle
   GPU reclaimed after 30 minutes below 5 % use. We saved 3 notebooks
   first." whose reason the spawner's stop records in the usage ledger,
   "reclaimed: GPU idle 30 min", then the hub's stop). The stops of one
   pass run at once. The hub's release wakes the wait list, so the GPUs go
   to the next in line. Files are untouched (a stop, not a delete).
5. puts every pending notice, of any rule (reservations' preemption too), on
   the user servers (``notice_delivery.py``).

A server is stopped only after a warning it could see: if a pass finds a
server past its limit with no warning yet (the loop was down, the limit was
lowered), it warns now and stops a lead time later. A server whose readings
are missing is left alone, and the log says so once per server; after a gap
in readings longer than three passes (the service was down, a pass ran
late) the idle clocks start again: time nobody watched is not idle time.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from workbench_spawner.ledger.idle_book import IdleBook
from workbench_spawner.ledger.notices import NoticeBook
from workbench_spawner.ledger.store import utcnow
from workbench_spawner.rules.idle import (
    BUSY,
    STOP,
    UNKNOWN,
    WARN,
    GpuTrack,
    IdleRule,
    advance,
    format_minutes,
    is_exempt,
    judge,
    ledger_reason,
    rule_for,
    warning_text,
)

from .fleet import Fleet
from .hub_client import HubClient
from .notice_delivery import NoticeDelivery, time_sliced
from .stopping import Stopper, make_stopper, zone_of
from .utilization import SourceChooser

log = logging.getLogger("workbench.service")

KIND = "idle"
AFTER_RECLAIM = "Start again when you are ready to use a GPU, or choose 0 GPUs for CPU work."


def idle_cause(rule: IdleRule) -> str:
    """The stop box's words: 'idle GPU reclaimed after 30 minutes below 5 % use'."""
    minutes = format_minutes(rule.minutes).replace(" min", " minutes").replace(" s", " seconds")
    if minutes == "1 minutes":
        minutes = "1 minute"
    return f"idle GPU reclaimed after {minutes} below {rule.threshold:g} % use"


@dataclass
class PassReport:
    """What one pass did (tests and the log read it)."""

    warned: list[tuple[str, str]] = field(default_factory=list)
    stopped: list[tuple[str, str]] = field(default_factory=list)
    cleared: list[tuple[str, str]] = field(default_factory=list)
    unknown: list[tuple[str, str]] = field(default_factory=list)


def _clock_text(when: datetime, zone_name: str) -> str:
    return f"{when.astimezone(zone_of(zone_name)):%H:%M}"


class Reclaimer:
    def __init__(
        self,
        fleet: Fleet,
        hub: HubClient,
        chooser: SourceChooser,
        delivery: NoticeDelivery | None,
        clock=utcnow,
        interval: float = 30.0,
        stopper: Stopper | None = None,
    ):
        self.fleet = fleet
        self.hub = hub
        self.chooser = chooser
        self.delivery = delivery
        self.notices = NoticeBook(fleet.store, clock=clock)
        self.idle = IdleBook(fleet.store)
        self.clock = clock
        self.interval = interval
        self._unknown_logged: set[tuple[str, str]] = set()
        # Stops (``stopping.Stopper``): saved first, then stopped through the hub, with the sentence.
        self.stopper = stopper or Stopper(
            self.notices,
            hub,
            getattr(delivery, "servers", None),
            zone=lambda: zone_of(fleet.settings.time_zone),
            clock=clock,
        )
        self._stops: list = []
        self._paths: dict[tuple[str, str], str] = {}

    # At most this many servers' monitors are read at once (each read may take the client's 10 s timeout).
    PARALLEL_READS = 16
    READ_TIMEOUT = 10.0

    @property
    def stale_after(self) -> timedelta:
        # A reading older than three passes is no reading. Passes are one interval plus one pass's reads
        # apart (reads run in parallel, each at most READ_TIMEOUT; stops wait at most one save round), so a
        # slow pass never looks like a gap.
        return timedelta(seconds=max(3 * self.interval + self.READ_TIMEOUT + self.stopper.save_wait, 10.0))

    async def running_servers(self) -> tuple[dict[tuple[str, str], str], dict[str, list[str]]]:
        """(user, server) -> URL path of every ready server; user -> groups."""
        running: dict[tuple[str, str], str] = {}
        groups: dict[str, list[str]] = {}
        for user in await self.hub.users():
            groups[user["name"]] = list(user.get("groups") or [])
            for name, server in (user.get("servers") or {}).items():
                if server.get("ready") and not server.get("pending"):
                    running[(user["name"], name)] = server.get("url") or ""
        return running, groups

    async def run_pass(self) -> PassReport:
        report = PassReport()
        settings = await asyncio.to_thread(lambda: self.fleet.settings)
        leases = await asyncio.to_thread(self.fleet.store.leases)
        running, groups = await self.running_servers()
        self._paths = running
        effective = await asyncio.to_thread(
            self.fleet.book.effective_many,
            {lease.user: groups.get(lease.user, []) for lease in leases},
            settings.default_quota,
        )
        exempt_groups = await asyncio.to_thread(self.idle.exempt_groups)
        old = {(t.node, t.gpu_uuid): t for t in await asyncio.to_thread(self.idle.tracks)}
        pending = {(n.user, n.server): n for n in await asyncio.to_thread(self.notices.pending) if n.kind == KIND}
        tracks: list[GpuTrack] = []
        live = [lease for lease in leases if (lease.user, lease.server) in running]  # starting: not idle time
        limit = asyncio.Semaphore(self.PARALLEL_READS)

        async def read(lease):
            # In parallel, each stamped with its own time: a few slow monitors never delay the rest.
            source = self.chooser.for_lease(lease)
            async with limit:
                readings = await source.read(lease, running[(lease.user, lease.server)])
            return source, readings, self.clock()

        results = await asyncio.gather(*(read(lease) for lease in live))
        for lease, (source, readings, now) in zip(live, results, strict=True):
            key = (lease.user, lease.server)
            quota = effective[lease.user].quota
            rule = rule_for(
                quota.gpu_idle_minutes,
                quota.gpu_idle_threshold,
                settings.gpu_idle_minutes,
                settings.gpu_idle_threshold,
                settings.gpu_idle_warn_minutes,
            )
            node = lease.node or settings.node
            server_tracks = []
            for uuid in lease.gpu_uuids:
                previous = old.get((node, uuid))
                if previous is None or (previous.user, previous.server) != key:
                    previous = GpuTrack(node=node, gpu_uuid=uuid, user=lease.user, server=lease.server)
                track = advance(
                    previous, readings.get(uuid), rule.threshold, now, source.name, stale_after=self.stale_after
                )
                if (
                    previous.idle_since is not None
                    and track.idle_since == now
                    and track.utilization is not None
                    and track.utilization < rule.threshold
                ):
                    log.info(
                        "Idle clock of %s on %s restarted: no reading for %s before this one",
                        uuid,
                        f"{lease.user}/{lease.server or 'default'}",
                        now - previous.last_reading if previous.last_reading else "ever",
                    )
                server_tracks.append(track)
            tracks.extend(server_tracks)
            exempt = is_exempt(groups.get(lease.user, []), exempt_groups)
            verdict = judge(server_tracks, rule, now, exempt=exempt, stale_after=self.stale_after)
            await self._act(key, lease, rule, verdict, pending.get(key), settings, report, now)
        # The stops, each with its own save round, at once (a slow server never holds up the others).
        stops, self._stops = self._stops, []
        await asyncio.gather(*stops)
        judged = {(lease.user, lease.server) for lease in leases if (lease.user, lease.server) in running}
        for key in pending.keys() - judged:
            if key not in running or not any((lease.user, lease.server) == key for lease in leases):
                # Stopped by its owner, or gave its GPUs back: the warning is moot.
                await asyncio.to_thread(self.notices.clear, key[0], key[1], kind=KIND)
                report.cleared.append(key)
        await asyncio.to_thread(self.idle.save, tracks)
        if self.delivery is not None:
            await self.delivery.deliver(running)
        return report

    async def _act(self, key, lease, rule: IdleRule, verdict, notice, settings, report: PassReport, now) -> None:
        user, server = key
        label = f"{user}/{server or 'default'}"
        if verdict.action == UNKNOWN:
            report.unknown.append(key)
            if key not in self._unknown_logged:
                log.warning("Idle reclaim leaves %s alone: %s", label, verdict.detail)
                self._unknown_logged.add(key)
        else:
            self._unknown_logged.discard(key)
        if verdict.action not in (WARN, STOP):
            if notice is not None:
                await asyncio.to_thread(self.notices.clear, user, server, kind=KIND)
                report.cleared.append(key)
                log.info(
                    "Idle warning for %s withdrawn (%s)",
                    label,
                    "its GPU is busy again" if verdict.action == BUSY else verdict.action,
                )
            return
        stop_at = verdict.stop_at
        if notice is not None and notice.stop_at is not None:
            stop_at = max(stop_at, notice.stop_at)  # never sooner than the user was told
        elif verdict.action == STOP:
            stop_at = now + rule.lead  # past the limit but never warned: warn first
        if verdict.action == STOP and notice is not None and stop_at <= now:
            log.info(
                "Stopping %s: its GPUs %s stayed under %g %% for %s (reclaimed for others)",
                label,
                ", ".join(lease.gpu_uuids),
                rule.threshold,
                verdict.idle_for,
            )
            self._stops.append(self._stop(key, rule, notice, report, now))
            return
        message, hint = warning_text(rule, stop_at, len(lease.gpu_uuids), _clock_text(stop_at, settings.time_zone))
        if notice is None or notice.stop_at != stop_at or notice.message != message:
            await asyncio.to_thread(
                self.notices.warn, user, server, kind=KIND, message=message, hint=hint, stop_at=stop_at
            )
            if notice is None:
                log.info(
                    "Warned %s: its GPUs are idle; stopping at %s unless they are used", label, stop_at.isoformat()
                )
        report.warned.append(key)

    async def _stop(self, key, rule: IdleRule, notice, report: PassReport, now) -> None:
        user, server = key
        done = await self.stopper.stop_for(
            user,
            server,
            kind=KIND,
            cause=idle_cause(rule),
            reason=ledger_reason(rule),
            hint=AFTER_RECLAIM,
            path=self._paths.get(key),
            at=now,
        )
        if done.stopped:
            report.stopped.append(key)

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.run_pass()
            except Exception as exc:  # noqa: BLE001 - loop boundary: the hub restarting, the database busy: next pass
                log.warning("Idle reclaim pass failed: %s", exc)


def make_reclaimer(fleet: Fleet, hub: HubClient, args, servers=None, stopper: Stopper | None = None) -> Reclaimer:
    """The loop as the service runs it: host readings where the hub sees the GPUs, else the server's monitor;
    MIG slices from the hub's dcgm-exporters where it names any. ``servers``, ``stopper``: the service's
    (``app.serve`` shares one of each among its loops)."""
    from .dcgm import DcgmReadings
    from .user_servers import UserServers
    from .utilization import HostReadings, ServerMonitorReadings

    servers = servers or UserServers(args.proxy_url, hub.token)
    stopper = stopper or make_stopper(fleet, hub, servers, getattr(args, "save_wait_seconds", 20.0))
    chooser = SourceChooser(HostReadings(fleet), ServerMonitorReadings(servers), dcgm=DcgmReadings(fleet))
    delivery = NoticeDelivery(
        NoticeBook(fleet.store), servers, sharing=lambda: time_sliced(fleet.store.leases(), fleet.settings.slots())
    )
    return Reclaimer(fleet, hub, chooser, delivery, interval=args.idle_check_seconds, stopper=stopper)
