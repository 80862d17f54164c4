"""The reservations API under /services/workbench/api/reservations.

* ``GET api/reservations``: every reservation, with whether its window is
  open now and its current or next occurrence in the hub's time zone
  (``custom:workbench:read``).
* ``POST api/reservations``: create one (``custom:workbench:admin``), body
  ``{"group": "ml-course", "gpus": 8, "model": "H100-80GB", "window": "Tue
  10:00-12:00", "grace_minutes": 15, "preempt": false, "warn_minutes": 10}``
  (only group, gpus and window are required). 201 with the stored one; 400
  with a sentence, and nothing stored, for a body its schema refuses (fields,
  numbers, lengths: ``ReservationBody`` in ``openapi.yaml``), a malformed
  window, an unknown model or group, more GPUs than the hub has, or an overlap
  with other reservations that the inventory cannot meet.
* ``GET|DELETE api/reservations/{id}``: one reservation; delete is 204.

"Now" is the hub's clock (``policy/clock.py``: the real one, or the test clock the
hub was told to use), so the API, placement and preemption agree.
"""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import tzinfo

from workbench_hub.service.handlers import APIHandler
from workbench_spawner.ledger.reservation_book import ReservationBook, StoredReservation, reservation_from_body
from workbench_spawner.policy.clock import Clock, hub_clock, zone
from workbench_spawner.rules.reservations import next_occurrence
from workbench_spawner.rules.window import ReservationError

log = logging.getLogger("workbench.service")


def hub_time(fleet) -> tuple[Clock, tzinfo, str]:
    """The hub's clock and zone, from the settings it stored."""
    settings = fleet.settings
    return hub_clock(settings.test_clock_file), zone(settings.time_zone), settings.time_zone


def reservation_json(stored: StoredReservation, clock: Clock, tz: tzinfo) -> dict:
    now = clock()
    occurrence = next_occurrence(stored.reservation, now, tz)
    active = stored.reservation.window.current(now, tz) is not None
    return {
        **stored.to_json(),
        "active": active,
        "next_start": occurrence[0].astimezone(tz).isoformat() if occurrence else None,
        "next_end": occurrence[1].astimezone(tz).isoformat() if occurrence else None,
        "description": stored.reservation.describe(),
    }


class ReservationListHandler(APIHandler):
    @property
    def book(self) -> ReservationBook:
        return ReservationBook(self.fleet.store)

    async def get(self):
        await self.require_read()
        clock, tz, name = hub_time(self.fleet)
        stored = await asyncio.to_thread(self.book.all)
        self.send(
            {
                "time_zone": name,
                "now": clock().astimezone(tz).isoformat(),
                "reservations": [reservation_json(s, clock, tz) for s in stored],
            }
        )

    async def post(self):
        await self.require_admin()
        body = self.valid_body("ReservationBody", "invalid reservation")
        try:
            reservation = reservation_from_body(body, self.fleet.models())
        except ReservationError as exc:
            self.fail(400, f"invalid reservation: {exc}")
        if await self.hub.group(reservation.group) is None:
            self.fail(
                400,
                f"invalid reservation: no group named {json.dumps(reservation.group)} on this hub; "
                f"create it on the hub's admin page (Groups) first",
            )
        clock, tz, _ = hub_time(self.fleet)
        counts = self.fleet.inventory.count_by_model()
        try:
            stored = await asyncio.to_thread(self.book.create, reservation, counts, clock(), tz, self.caller_name())
        except ReservationError as exc:
            self.fail(400, f"invalid reservation: {exc}")
        log.info("%s reserved %s (id %s)", self.caller_name(), reservation.describe(), stored.reservation.id)
        self.send(reservation_json(stored, clock, tz), 201)


class ReservationHandler(ReservationListHandler):
    async def _find(self, rid: str) -> StoredReservation:
        ok = rid.isascii() and rid.isdigit() and len(rid) < 12
        stored = await asyncio.to_thread(self.book.get, int(rid)) if ok else None
        if stored is None:
            self.fail(404, f"no reservation with id {rid[:40]}; GET api/reservations lists them")
        return stored

    # One reservation's URL carries its id, which tornado hands to each method: the list's take none.
    async def get(self, rid: str):  # type: ignore[override]
        await self.require_read()
        clock, tz, _ = hub_time(self.fleet)
        self.send(reservation_json(await self._find(rid), clock, tz))

    async def post(self, rid: str):  # type: ignore[override]
        self.fail(405, "create reservations with POST api/reservations")

    async def delete(self, rid: str):
        await self.require_admin()
        stored = await self._find(rid)
        await asyncio.to_thread(self.book.delete, stored.reservation.id)
        log.info("%s deleted the reservation %s (%s)", self.caller_name(), rid, stored.reservation.describe())
        self.set_status(204)
        self.finish()
