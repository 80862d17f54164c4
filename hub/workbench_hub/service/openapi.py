"""The OpenAPI 3 description of the service API (tests check it against the routes)."""

from __future__ import annotations

from typing import Any

_error = {"$ref": "#/components/responses/Error"}


def _json(schema: dict) -> dict:
    return {"content": {"application/json": {"schema": schema}}}


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def openapi_document(prefix: str = "/services/workbench/") -> dict[str, Any]:
    name_param = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
    common = {"401": _error, "403": _error}

    def quota_paths(kind: str) -> dict:
        view = _ref("UserQuotaView" if kind == "user" else "GroupQuotaView")
        return {
            "parameters": [name_param],
            "get": {"summary": f"The quota of one {kind}", "x-scope": "custom:workbench:read",
                    "responses": {"200": {"description": "the quota", **_json(view)}, **common, "404": _error}},
            "put": {"summary": f"Set the quota of one {kind} (applies to the next spawn)",
                    "x-scope": "custom:workbench:admin",
                    "requestBody": {"required": True, **_json(_ref("Quota"))},
                    "responses": {"200": {"description": "the stored quota", **_json(view)},
                                  "400": _error, **common, "404": _error}},
            "delete": {"summary": f"Delete the quota of one {kind} (falls back to groups or the default)",
                       "x-scope": "custom:workbench:admin",
                       "responses": {"204": {"description": "deleted (or there was none)"}, **common,
                                     "404": _error}},
        }

    return {
        "openapi": "3.0.3",
        "info": {
            "title": "GPU Workbench service",
            "version": "1.0.0",
            "description": "GPU quotas, the fleet and usage. Authenticate with a hub API token "
                           "(`Authorization: token ...`); scopes `custom:workbench:admin` (read and write) and "
                           "`custom:workbench:read` (read). Any hub user may read their own usage.",
        },
        "servers": [{"url": prefix.rstrip("/")}],
        "components": {
            "securitySchemes": {"hubToken": {"type": "apiKey", "in": "header", "name": "Authorization"}},
            "responses": {"Error": {"description": "an error with a readable message", **_json(_ref("Error"))}},
            "schemas": {
                "Error": {"type": "object", "required": ["status", "message"],
                          "properties": {"status": {"type": "integer"}, "message": {"type": "string"}}},
                "Quota": {
                    "type": "object",
                    "required": ["max_gpus"],
                    "additionalProperties": False,
                    "properties": {
                        "max_gpus": {"type": "integer", "minimum": 0, "maximum": 1024},
                        "gpu_hours_per_week": {"type": "number", "nullable": True, "minimum": 0},
                        "allowed_models": {"type": "array", "nullable": True, "items": {"type": "string"}},
                        "max_session_hours": {"type": "number", "nullable": True, "exclusiveMinimum": True,
                                              "minimum": 0},
                    },
                },
                "EffectiveQuota": {"allOf": [_ref("Quota"), {"type": "object", "properties": {
                    "source": {"type": "string", "enum": ["user", "group", "default"]},
                    "group": {"type": "string", "nullable": True},
                    "origin": {"type": "string", "example": "from group ml-course"}}}]},
                "UserQuotaView": {"type": "object", "properties": {
                    "kind": {"type": "string"}, "name": {"type": "string"},
                    "quota": {"allOf": [_ref("Quota")], "nullable": True},
                    "effective": _ref("EffectiveQuota")}},
                "GroupQuotaView": {"type": "object", "properties": {
                    "kind": {"type": "string"}, "name": {"type": "string"},
                    "quota": {"allOf": [_ref("Quota")], "nullable": True},
                    "users": {"type": "array", "items": {"type": "string"}}}},
                "GPU": {"type": "object", "properties": {
                    "index": {"type": "integer"}, "uuid": {"type": "string"}, "name": {"type": "string"},
                    "model": {"type": "string"}, "memory_total_bytes": {"type": "integer"},
                    "simulated": {"type": "boolean"},
                    "holders": {"type": "array", "items": {"type": "object", "properties": {
                        "user": {"type": "string"}, "server": {"type": "string"},
                        "since": {"type": "string", "format": "date-time"}}}},
                    "free_slots": {"type": "integer"},
                    "utilization_percent": {"type": "number", "nullable": True},
                    "memory_used_bytes": {"type": "integer", "nullable": True},
                    "temperature_c": {"type": "number", "nullable": True},
                    "power_w": {"type": "number", "nullable": True},
                    "reading_source": {"type": "string", "nullable": True}}},
                "Allocation": {"type": "object", "properties": {
                    "user": {"type": "string"}, "server": {"type": "string"},
                    "gpu_uuids": {"type": "array", "items": {"type": "string"}},
                    "since": {"type": "string", "format": "date-time"}, "ref": {"type": "string"}}},
                "UserUsage": {"type": "object", "properties": {
                    "name": {"type": "string"}, "groups": {"type": "array", "items": {"type": "string"}},
                    "quota": _ref("EffectiveQuota"), "held_gpus": {"type": "integer"},
                    "gpu_hours_week": {"type": "number"}}},
            },
        },
        "security": [{"hubToken": []}],
        "paths": {
            "/": {"get": {"summary": "The admin page (HTML; logs in through the hub)",
                          "x-scope": "custom:workbench:read",
                          "responses": {"200": {"description": "HTML page"}, "302": {"description": "to login"},
                                        "403": {"description": "HTML page: not allowed"}}}},
            "/api/gpus": {"get": {"summary": "Every GPU with its holders and live readings",
                                  "x-scope": "custom:workbench:read",
                                  "responses": {"200": {"description": "the inventory", **_json({
                                      "type": "object", "properties": {
                                          "source": {"type": "string"}, "simulated": {"type": "boolean"},
                                          "message": {"type": "string"},
                                          "gpus": {"type": "array", "items": _ref("GPU")}}})}, **common}}},
            "/api/allocations": {"get": {"summary": "Every lease held now", "x-scope": "custom:workbench:read",
                                         "responses": {"200": {"description": "leases", **_json({
                                             "type": "object", "properties": {"allocations": {
                                                 "type": "array", "items": _ref("Allocation")}}})}, **common}}},
            "/api/quotas": {"get": {"summary": "Every stored quota and the default",
                                    "x-scope": "custom:workbench:read",
                                    "responses": {"200": {"description": "quotas"}, **common}}},
            "/api/quotas/users/{name}": quota_paths("user"),
            "/api/quotas/groups/{name}": quota_paths("group"),
            "/api/usage": {"get": {
                "summary": "GPU-hours in the rolling last 7 days, held GPUs and effective quota per user",
                "description": "Without custom:workbench:read a user sees only their own usage; "
                               "asking for another user's is 403.",
                "parameters": [{"name": "user", "in": "query", "required": False, "schema": {"type": "string"}}],
                "responses": {"200": {"description": "usage", **_json({"type": "object", "properties": {
                    "window_start": {"type": "string", "format": "date-time"},
                    "window_end": {"type": "string", "format": "date-time"},
                    "users": {"type": "array", "items": _ref("UserUsage")}}})}, **common, "404": _error}}},
            "/api/openapi.json": {"get": {"summary": "This document", "security": [],
                                          "responses": {"200": {"description": "OpenAPI 3"}}}},
            "/metrics": {"get": {"summary": "Prometheus text (DCGM-exporter names plus workbench_*)",
                                 "x-scope": "custom:workbench:read",
                                 "responses": {"200": {"description": "text/plain; version=0.0.4"}, **common}}},
        },
    }
