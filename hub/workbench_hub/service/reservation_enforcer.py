"""Preemption for reservations that say ``preempt``: warn before the window, stop at its start.

Every ``--reservation-check-seconds`` (``WORKBENCH_RESERVATION_CHECK_SECONDS``,
15; 0 turns it off) the workbench service looks at each ``preempt``
reservation (``reservations.preemption_phase``):

* from ``warn_minutes`` before the start: the non-member servers that hold
  GPUs the reservation will need (``preemption_plan``: only as many as the
  free and member-held GPUs fall short, newest servers first) get a notice
  (``notices.NoticeBook.warn``, kind ``preempt``): the user's JupyterLab
  shows it with a countdown. A server no longer in the plan (someone else
  stopped, a GPU came free) has its warning withdrawn.
* from the start until the grace period ends: each server in the plan is
  stopped as every rule of the service stops one
  (``stopping.Stopper.stop_for``: open notebooks saved first, then "Your
  server was stopped at 10:00: its GPUs are reserved for ml-course from
  10:00 until 12:00." with the ledger reason ``preempted: reserved for
  GROUP``, then the hub's stop, so the spawner's stop releases the lease).
  A service that was down at the start does not stop servers long after it.

A reservation without ``preempt`` is never enforced here: non-members keep
their GPUs, and placement hands the GPUs they free to the members first.
"""

from __future__ import annotations

import asyncio
import logging
import time

from workbench_spawner.ledger.notices import NoticeBook
from workbench_spawner.ledger.reservation_book import ReservationBook
from workbench_spawner.placement.host import holdings
from workbench_spawner.policy.clock import real_now
from workbench_spawner.rules.reservations import preemption_phase, preemption_plan

from .hub_client import HubClient
from .reservation_handlers import hub_time
from .stopping import Stopper, make_stopper

log = logging.getLogger("workbench.service")
KIND = "preempt"
# A stop asked for is not asked again for this long (the hub's stop takes a moment to release the lease).
RESTOP_SECONDS = 60.0
AFTER_PREEMPTION = "Start again later on a free GPU, or start a CPU-only server (0 GPUs)."


class Preemption:
    def __init__(self, fleet, hub: HubClient, stopper: Stopper | None = None):
        self.fleet = fleet
        self.hub = hub
        self.notices = NoticeBook(fleet.store)
        # How a server is stopped (saved first, the sentence recorded); without one, no save round.
        self.stopper = stopper or make_stopper(fleet, hub, None, 0)
        self.book = ReservationBook(fleet.store)
        self._asked: dict[tuple[str, str], float] = {}

    def _plan(self):
        """(phase, start, reservation, holdings to stop) for each preempt reservation due now; blocking."""
        clock, tz, _ = hub_time(self.fleet)
        now = clock()
        models = {d.uuid: d.model for d in self.fleet.inventory.devices}
        leases = self.fleet.store.leases()
        held = {uuid for lease in leases for uuid in lease.gpu_uuids}
        free = [d.uuid for d in self.fleet.inventory.devices if d.uuid not in held]
        due = []
        for res in self.book.in_force(now, tz):  # a course's reservations preempt only while it runs
            phase = preemption_phase(res, now, tz)
            if phase is not None:
                due.append((phase[0], phase[1], res, preemption_plan(res, holdings(leases), free, models)))
        return due, now, tz

    async def check(self) -> list[tuple[str, str]]:
        """One pass; returns the (user, server) stopped."""
        due, now, tz = await asyncio.to_thread(self._plan)
        warned: set[tuple[str, str]] = set()
        stops = []
        for phase, start, res, plan in due:
            at = start.astimezone(tz)
            for holding in plan:
                key = (holding.user, holding.server)
                if phase == "warn":
                    warned.add(key)
                    # The countdown runs on the real clock (a test clock only moves "now" for the rules).
                    stop_at = real_now() + (start - now)
                    await asyncio.to_thread(
                        self.notices.warn,
                        holding.user,
                        holding.server,
                        kind=KIND,
                        message=f"Your server will be stopped at {at:%H:%M} because its GPUs are reserved for "
                        f"{res.group} from then ({res.window.text()}).",
                        hint="Save your work now. Your files stay; start again later on a free GPU, or start a "
                        "CPU-only server (0 GPUs).",
                        stop_at=stop_at,
                    )
                    continue
                if time.monotonic() - self._asked.get(key, -RESTOP_SECONDS) < RESTOP_SECONDS:
                    continue
                self._asked[key] = time.monotonic()
                end = (start + res.window.length).astimezone(tz)
                log.info(
                    "Stopping %s/%s: its GPUs are reserved for %s from %s (preempt)",
                    holding.user,
                    holding.server or "default",
                    res.group,
                    at.isoformat(),
                )
                stops.append(
                    self.stopper.stop_for(
                        holding.user,
                        holding.server,
                        kind=KIND,
                        cause=f"its GPUs are reserved for {res.group} from {at:%H:%M} until {end:%H:%M}",
                        reason=f"preempted: reserved for {res.group}",
                        hint=AFTER_PREEMPTION,
                        at=now,
                    )
                )
        # Every stop at once, each with its own save round.
        stopped = [(done.user, done.server) for done in await asyncio.gather(*stops) if done.stopped]
        # Warnings whose reason went away (a GPU came free, the reservation was deleted).
        for notice in await asyncio.to_thread(self.notices.pending):
            if notice.kind == KIND and (notice.user, notice.server) not in warned:
                await asyncio.to_thread(self.notices.clear, notice.user, notice.server, kind=KIND)
        cutoff = time.monotonic() - RESTOP_SECONDS
        self._asked = {k: v for k, v in self._asked.items() if v > cutoff}
        return stopped

    async def run_forever(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await self.check()
            except Exception as exc:  # noqa: BLE001 - loop boundary: the next pass tries again
                log.warning("Reservation check failed: %s", exc)
