"""The reservations part of the service's OpenAPI document (merged into ``openapi.py``).

``ReservationBody`` says what ``reservation_book.parse_reservation`` accepts;
the window's exact grammar (a weekday or a date, then HH:MM-HH:MM, an end
not after the start crossing midnight) is in ``reservations.parse_window``.
"""

from __future__ import annotations

from workbench_spawner.rules.quota import MAX_GPUS_LIMIT
from workbench_spawner.rules.reservations import MAX_MINUTES

from .openapi_parts import STRING, TIME
from .openapi_parts import error as _error
from .openapi_parts import json_body as _json
from .openapi_parts import ref as _ref

WINDOW = {"type": "string", "maxLength": 64,
          "description": "wall-clock time in the hub's time zone: weekly \"Tue 10:00-12:00\" or one-off "
                         "\"2026-12-08 10:00-12:00\"; an end not after the start crosses midnight",
          "examples": ["Tue 10:00-12:00", "2026-12-08 10:00-12:00"]}
MINUTES = {"type": "number", "minimum": 0, "maximum": MAX_MINUTES}


def reservation_schemas() -> dict:
    body = {
        "group": {"type": "string", "minLength": 1, "maxLength": 255, "description": "a JupyterHub group"},
        "gpus": {"type": "integer", "minimum": 1, "maximum": MAX_GPUS_LIMIT},
        "model": {"type": ["string", "null"], "description": "only GPUs of this model of the inventory; null: any"},
        "window": WINDOW,
        "grace_minutes": {**MINUTES, "default": 15,
                          "description": "after this long, GPUs no member holds or waits for go back to everyone"},
        "preempt": {"type": "boolean", "default": False,
                    "description": "stop non-members' servers that hold the needed GPUs at the start"},
        "warn_minutes": {**MINUTES, "default": 10,
                         "description": "with preempt: how long before the start those users are warned"},
    }
    stored = {**body, "id": {"type": "integer", "minimum": 1}, "weekly": {"type": "boolean"},
              "active": {"type": "boolean", "description": "the window is open now"},
              "next_start": {"type": ["string", "null"], "format": "date-time",
                             "description": "the current or next occurrence, in the hub's time zone; null: over"},
              "next_end": {"type": ["string", "null"], "format": "date-time"},
              "description": STRING, "created": TIME, "created_by": STRING,
              "grace_minutes": MINUTES, "warn_minutes": MINUTES, "preempt": {"type": "boolean"}}
    return {
        "ReservationBody": {"type": "object", "required": ["group", "gpus", "window"], "properties": body,
                            "additionalProperties": False},
        "Reservation": {"type": "object", "properties": stored,
                        "required": ["id", "group", "gpus", "model", "window", "weekly", "grace_minutes", "preempt",
                                     "warn_minutes", "active", "next_start", "next_end", "description", "created",
                                     "created_by"]},
        "ReservationList": {"type": "object", "required": ["time_zone", "now", "reservations"], "properties": {
            "time_zone": {"type": "string", "description": "the hub's time zone, which windows are written in"},
            "now": TIME, "reservations": {"type": "array", "items": _ref("Reservation")}}},
    }


def reservation_paths(read: str, admin: str, forbidden: dict, unavailable: dict) -> dict:
    bad = _error("not a valid reservation, or one the inventory cannot meet (the message says why); nothing stored")
    missing = _error("no reservation with that id")
    rid = {"name": "name", "in": "path", "required": True, "description": "the reservation's id",
           "schema": {"type": "string", "minLength": 1}}
    return {
        "/api/reservations": {
            "get": {"summary": "Every reservation, open now or not", "x-scope": read,
                    "responses": {"200": {"description": "reservations", **_json(_ref("ReservationList"))},
                                  "403": forbidden, "503": unavailable}},
            "post": {"summary": "Reserve GPUs for a group during a window", "x-scope": admin,
                     "requestBody": {"required": True, **_json(_ref("ReservationBody"))},
                     "responses": {"201": {"description": "the stored reservation", **_json(_ref("Reservation"))},
                                   "400": bad, "403": forbidden, "503": unavailable}},
        },
        "/api/reservations/{name}": {
            "parameters": [rid],
            "get": {"summary": "One reservation", "x-scope": read,
                    "responses": {"200": {"description": "the reservation", **_json(_ref("Reservation"))},
                                  "403": forbidden, "404": missing, "503": unavailable}},
            "post": {"summary": "Not allowed: create with POST api/reservations", "x-scope": admin,
                     "responses": {"405": _error("use POST api/reservations"), "403": forbidden,
                                   "503": unavailable}},
            "delete": {"summary": "Delete a reservation (running servers are not touched)", "x-scope": admin,
                       "responses": {"204": {"description": "deleted"}, "403": forbidden, "404": missing,
                                     "503": unavailable}},
        },
    }
