"""The OpenAPI 3.1 description of the service API, served at ``api/openapi.json``.

Every response of every operation, errors included, has a schema with its
required fields, and the tests hold the service to it: each answer in
``tests/service`` is validated against this document, and a schemathesis
run fuzzes the live service with it. The request schema of a quota
(``QuotaBody``) says exactly what ``parse_quota`` accepts (bounds and all);
the answers carry more (``StoredQuota``: who changed it and when;
``EffectiveQuota``: where it comes from).
"""

from __future__ import annotations

from typing import Any

from workbench_spawner.rules.quota import (
    MAX_GPU_HOURS_LIMIT,
    MAX_GPUS_LIMIT,
    MAX_MODELS,
    MAX_SESSION_HOURS_LIMIT,
    MIN_SESSION_HOURS,
)

from .openapi_idle import idle_paths, idle_quota_properties, idle_schemas
from .openapi_slurm import slurm_paths, slurm_schemas
from .openapi_parts import ADMIN, READ, STRING, STRINGS, TIME
from .openapi_parts import error as _error
from .openapi_parts import json_body as _json
from .openapi_parts import obj as _object
from .openapi_parts import ref as _ref
from .reservation_openapi import reservation_paths, reservation_schemas

MAX_NAME = 255


def _nullable(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}


FORBIDDEN = _error("no or wrong authentication, or the caller lacks the scope")
UNAVAILABLE = _error("the hub has not published its GPU settings yet, or its API did not answer; try again")
NO_SUCH_NAME = _error("no user or group of that name on this hub (the message says how to add one)")
BAD_QUOTA = _error("the body is not a valid quota (the message names the field and the bound)")


def _quota_properties() -> dict:
    return {
        "max_gpus": {"type": "integer", "minimum": 0, "maximum": MAX_GPUS_LIMIT,
                     "description": "GPUs held at once, over all the user's servers"},
        "gpu_hours_per_week": {"type": ["number", "null"], "minimum": 0, "maximum": MAX_GPU_HOURS_LIMIT,
                               "description": "GPU-hours in the rolling last 7 days; null: no limit"},
        "allowed_models": {"type": ["array", "null"], "maxItems": MAX_MODELS,
                           "items": {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9._+ -]{0,63}$"},
                           "description": "models of this hub's inventory (case does not matter); null: any, "
                                          "[]: none"},
        "max_session_hours": {"type": ["number", "null"], "minimum": MIN_SESSION_HOURS,
                              "maximum": MAX_SESSION_HOURS_LIMIT,
                              "description": f"a server is stopped after this many hours (at least "
                                             f"{MIN_SESSION_HOURS:g} h = {MIN_SESSION_HOURS * 3600:g} s: a "
                                             f"server takes that long to start); null: no limit"},
        **idle_quota_properties(),
    }


def _schemas() -> dict:
    quota_fields = ["max_gpus", "gpu_hours_per_week", "allowed_models", "max_session_hours", "gpu_idle_minutes",
                    "gpu_idle_threshold"]
    holder = _object(["user", "server", "since", "node"],
                     {"user": STRING, "server": STRING, "since": TIME, "node": STRING})
    return {
        "Error": _object(["status", "message"], {"status": {"type": "integer", "minimum": 400, "maximum": 599},
                                                 "message": {"type": "string", "minLength": 1}}),
        "QuotaBody": _object(["max_gpus"], _quota_properties(), additionalProperties=False),
        "Quota": _object(quota_fields, _quota_properties()),
        "StoredQuota": {"allOf": [_ref("Quota"), _object(["kind", "name", "updated", "updated_by"], {
            "kind": {"type": "string", "enum": ["user", "group"]}, "name": STRING, "updated": TIME,
            "updated_by": {"type": "string", "description": "who set it, e.g. user:admin or service:..."}})]},
        "EffectiveQuota": {"allOf": [_ref("Quota"), _object(["source", "group", "origin"], {
            "source": {"type": "string", "enum": ["user", "group", "default"]},
            "group": {"type": ["string", "null"]},
            "origin": {"type": "string", "examples": ["own quota", "from group ml-course", "default"]}})]},
        "UserQuotaView": _object(["kind", "name", "quota", "effective"], {
            "kind": {"const": "user"}, "name": STRING, "quota": _nullable(_ref("StoredQuota")),
            "effective": _ref("EffectiveQuota")}),
        "GroupQuotaView": _object(["kind", "name", "quota", "users"], {
            "kind": {"const": "group"}, "name": STRING, "quota": _nullable(_ref("StoredQuota")),
            "users": STRINGS}),
        "QuotaList": _object(["default", "models", "node", "users", "groups"], {
            "default": _ref("Quota"),
            "models": {"type": "array", "items": STRING, "description": "the GPU models of the inventory the hub "
                                                                        "stored: what allowed_models may name"},
            "node": STRING,
            "database": {"type": "string", "description": "admins only: the GPU database the hub and the service "
                                                          "share (URL without its password)"},
            "users": {"type": "array", "items": _ref("StoredQuota")},
            "groups": {"type": "array", "items": _ref("StoredQuota")}}),
        "GPU": _object(
            ["index", "uuid", "name", "model", "node", "memory_total_bytes", "simulated", "holders", "free_slots",
             "utilization_percent", "memory_used_bytes", "temperature_c", "power_w", "reading_source"],
            {"index": {"type": "integer"}, "uuid": STRING, "name": STRING, "model": STRING,
             "node": {"type": "string", "description": "the node the GPU is on (this host's name on one host)"},
             "memory_total_bytes": {"type": "integer", "minimum": 0}, "simulated": {"type": "boolean"},
             "holders": {"type": "array", "items": holder},
             "free_slots": {"type": "integer", "minimum": 0},
             "utilization_percent": {"type": ["number", "null"]},
             "memory_used_bytes": {"type": ["integer", "null"]},
             "temperature_c": {"type": ["number", "null"]},
             "power_w": {"type": ["number", "null"]},
             "reading_source": {"type": ["string", "null"]},
             "idle_seconds": {"type": ["number", "null"], "minimum": 0,
                              "description": "held GPUs: how long idle reclaim has seen it idle; null: busy, "
                                             "free, or no reading"},
             "slurm": _object(["node_state", "allocated", "held_outside_workbench"], {
                 "node_state": STRING, "allocated": {"type": "boolean"},
                 "held_outside_workbench": {"type": "boolean"}},
                 description="Slurm hubs only: Slurm's own view of the GPU from its node records")}),
        "Inventory": _object(["node", "source", "simulated", "message", "gpus"], {
            "node": STRING, "source": {"type": "string", "enum": ["nvml", "simulated", "static", "slurm", "none"]},
            "simulated": {"type": "boolean"}, "message": STRING,
            "gpus": {"type": "array", "items": _ref("GPU")}}),
        "Allocation": _object(["user", "server", "node", "gpu_uuids", "since", "ref"], {
            "user": STRING, "server": STRING, "node": STRING, "gpu_uuids": STRINGS, "since": TIME,
            "ref": STRING}),
        "Allocations": _object(["node", "allocations"], {
            "node": STRING, "allocations": {"type": "array", "items": _ref("Allocation")}}),
        "UserUsage": _object(["name", "groups", "quota", "held_gpus", "gpu_hours_week"], {
            "name": STRING, "groups": STRINGS, "quota": _ref("EffectiveQuota"),
            "held_gpus": {"type": "integer", "minimum": 0}, "gpu_hours_week": {"type": "number", "minimum": 0}}),
        "Usage": _object(["window_start", "window_end", "users"], {
            "window_start": TIME, "window_end": TIME, "users": {"type": "array", "items": _ref("UserUsage")}}),
    }


def openapi_document(prefix: str = "/services/workbench/") -> dict[str, Any]:
    name_param = {"name": "name", "in": "path", "required": True,
                  "schema": {"type": "string", "minLength": 1, "maxLength": MAX_NAME}}

    def quota_paths(kind: str) -> dict:
        view = _ref("UserQuotaView" if kind == "user" else "GroupQuotaView")
        return {
            "parameters": [name_param],
            "get": {"summary": f"The quota of one {kind}" + (" and the effective one" if kind == "user"
                                                             else " and its members"),
                    "x-scope": READ,
                    "responses": {"200": {"description": "the quota", **_json(view)}, "403": FORBIDDEN,
                                  "404": NO_SUCH_NAME, "503": UNAVAILABLE}},
            "put": {"summary": f"Set the quota of one {kind} (applies to the next spawn)", "x-scope": ADMIN,
                    "requestBody": {"required": True, **_json(_ref("QuotaBody"))},
                    "responses": {"200": {"description": "the stored quota", **_json(view)}, "400": BAD_QUOTA,
                                  "403": FORBIDDEN, "404": NO_SUCH_NAME, "503": UNAVAILABLE}},
            "delete": {"summary": f"Delete the quota of one {kind} (falls back to groups or the default)",
                       "x-scope": ADMIN,
                       "responses": {"204": {"description": "deleted (or there was none)"}, "403": FORBIDDEN,
                                     "404": NO_SUCH_NAME, "503": UNAVAILABLE}},
        }

    def read(summary: str, schema: str) -> dict:
        return {"get": {"summary": summary, "x-scope": READ,
                        "responses": {"200": {"description": summary, **_json(_ref(schema))}, "403": FORBIDDEN,
                                      "503": UNAVAILABLE}}}

    return {
        "openapi": "3.1.0",
        "info": {
            "title": "GPU Workbench service",
            "version": "1.1.0",
            "description": "GPU quotas, the fleet and usage. Authenticate with a hub API token "
                           "(`Authorization: token ...`); scopes `custom:workbench:admin` (read and write) and "
                           "`custom:workbench:read` (read). Any hub user may read their own usage. Every error "
                           "is JSON `{\"status\": 4xx, \"message\": \"...\"}`.",
        },
        "servers": [{"url": prefix.rstrip("/")}],
        "components": {
            "securitySchemes": {"hubToken": {"type": "apiKey", "in": "header", "name": "Authorization"}},
            "schemas": {**_schemas(), **idle_schemas(), **reservation_schemas(), **slurm_schemas()},
        },
        "security": [{"hubToken": []}],
        "paths": {
            "/": {"get": {"summary": "The admin page (HTML; logs in through the hub)", "x-scope": READ,
                          "responses": {
                              "200": {"description": "HTML page", "content": {"text/html": {"schema": STRING}}},
                              "302": {"description": "to the hub's login"},
                              "403": {"description": "HTML page: not allowed",
                                      "content": {"text/html": {"schema": STRING}}},
                              "503": {"description": "HTML sentence: the hub has not published its settings",
                                      "content": {"text/html": {"schema": STRING}}}}}},
            "/api/gpus": read("Every GPU with its node, holders and live readings", "Inventory"),
            "/api/allocations": read("Every lease held now, with its node", "Allocations"),
            "/api/quotas": read("Every stored quota and the default", "QuotaList"),
            "/api/quotas/users/{name}": quota_paths("user"),
            "/api/quotas/groups/{name}": quota_paths("group"),
            "/api/usage": {"get": {
                "summary": "GPU-hours in the rolling last 7 days, held GPUs and effective quota per user",
                "description": "Without custom:workbench:read a user sees only their own usage; "
                               "asking for another user's is 403.",
                "parameters": [{"name": "user", "in": "query", "required": False,
                                "schema": {"type": "string", "minLength": 1, "maxLength": MAX_NAME}}],
                "responses": {"200": {"description": "usage", **_json(_ref("Usage"))},
                              "400": _error("the query string is not readable"), "403": FORBIDDEN,
                              "404": NO_SUCH_NAME, "503": UNAVAILABLE}}},
            "/api/openapi.json": {"get": {"summary": "This document", "security": [], "responses": {
                "200": {"description": "OpenAPI 3.1", **_json(_object(["openapi", "info", "paths"], {
                    "openapi": STRING, "info": {"type": "object"}, "paths": {"type": "object"}}))}}}},
            **idle_paths(FORBIDDEN, UNAVAILABLE),
            **reservation_paths(READ, ADMIN, FORBIDDEN, UNAVAILABLE),
            **slurm_paths(FORBIDDEN, UNAVAILABLE),
            "/metrics": {"get": {"summary": "Prometheus text (DCGM-exporter names plus workbench_*)",
                                 "x-scope": READ,
                                 "responses": {"200": {"description": "text/plain; version=0.0.4",
                                                       "content": {"text/plain": {"schema": STRING}}},
                                               "403": FORBIDDEN, "503": UNAVAILABLE}}},
        },
    }
