"""The idle-GPU part of the OpenAPI document (``api/idle``, exempt groups), merged by ``openapi.py``."""

from __future__ import annotations

from workbench_spawner.rules.idle import MAX_IDLE_MINUTES, MIN_IDLE_MINUTES

from .openapi_parts import ADMIN, NULL_TIME, READ, STRING, TIME
from .openapi_parts import error as _error
from .openapi_parts import json_body as _json
from .openapi_parts import obj as _object
from .openapi_parts import ref as _ref


def idle_quota_properties() -> dict:
    return {
        "gpu_idle_minutes": {"type": ["number", "null"], "minimum": 0, "maximum": MAX_IDLE_MINUTES,
                             "description": f"stop a server whose GPUs all stayed under the threshold this long "
                                            f"(0: never; else at least {MIN_IDLE_MINUTES:g}); null: the hub's "
                                            f"WORKBENCH_GPU_IDLE_MINUTES"},
        "gpu_idle_threshold": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 100,
                               "description": "percent utilization under which a GPU counts as idle; null: the "
                                              "hub's (5 % unless set)"},
    }


def idle_schemas() -> dict:
    exemption = _object(["group", "reason", "created", "created_by"], {
        "group": STRING, "reason": STRING, "created": TIME, "created_by": STRING})
    return {
        "IdleExemption": exemption,
        "IdleExemptions": _object(["exempt_groups"], {"exempt_groups": {"type": "array",
                                                                        "items": _ref("IdleExemption")}}),
        "IdleExemptionView": _object(["group", "exempt", "exemption"], {
            "group": STRING, "exempt": {"type": "boolean"},
            "exemption": {"anyOf": [_ref("IdleExemption"), {"type": "null"}]}}),
        "IdleExemptionBody": _object([], {"reason": {"type": "string", "maxLength": 500}},
                                     additionalProperties=False),
        "IdleGPU": _object(
            ["node", "uuid", "user", "server", "idle_seconds", "idle_since", "utilization_percent",
             "last_reading", "reading_source"],
            {"node": STRING, "uuid": STRING, "user": STRING, "server": STRING,
             "idle_seconds": {"type": ["number", "null"], "minimum": 0,
                              "description": "how long the GPU has been under the threshold; null: busy or no "
                                             "reading"},
             "idle_since": NULL_TIME, "utilization_percent": {"type": ["number", "null"]},
             "last_reading": NULL_TIME,
             "reading_source": {"type": ["string", "null"], "enum": ["host", "server", None],
                                "description": "host: the hub's NVML/simulated source; server: the user "
                                               "server's GPU monitor"}}),
        "IdleView": _object(["default_rule", "exempt_groups", "gpus"], {
            "default_rule": _object(["gpu_idle_minutes", "gpu_idle_threshold", "warn_minutes_before", "enabled",
                                     "describe"], {
                "gpu_idle_minutes": {"type": "number", "minimum": 0},
                "gpu_idle_threshold": {"type": "number"}, "warn_minutes_before": {"type": "number"},
                "enabled": {"type": "boolean"}, "describe": STRING}),
            "exempt_groups": {"type": "array", "items": _ref("IdleExemption")},
            "gpus": {"type": "array", "items": _ref("IdleGPU")}}),
    }


def idle_paths(forbidden: dict, unavailable: dict) -> dict:
    group = {"name": "name", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1,
                                                                        "maxLength": 255}}
    no_group = _error("no group of that name on this hub")
    return {
        "/api/idle": {"get": {
            "summary": "Idle reclaim: the hub's rule, the exempt groups, and how long each held GPU has been idle",
            "x-scope": READ,
            "responses": {"200": {"description": "idle state", **_json(_ref("IdleView"))}, "403": forbidden,
                          "503": unavailable}}},
        "/api/idle/exemptions": {"get": {
            "summary": "The groups exempt from idle reclaim", "x-scope": READ,
            "responses": {"200": {"description": "exempt groups", **_json(_ref("IdleExemptions"))},
                          "403": forbidden, "503": unavailable}}},
        "/api/idle/exemptions/{name}": {
            "parameters": [group],
            "get": {"summary": "Whether one hub group is exempt from idle reclaim", "x-scope": READ,
                    "responses": {"200": {"description": "the group's state", **_json(_ref("IdleExemptionView"))},
                                  "400": _error("the group name is not valid"),
                                  "403": forbidden, "404": no_group, "503": unavailable}},
            "put": {"summary": "Exempt a hub group from idle reclaim (from the loop's next pass)", "x-scope": ADMIN,
                    "requestBody": {"required": False, **_json(_ref("IdleExemptionBody"))},
                    "responses": {"200": {"description": "the group's state", **_json(_ref("IdleExemptionView"))},
                                  "400": _error("the body or the group name is not valid"),
                                  "403": forbidden, "404": no_group, "503": unavailable}},
            "delete": {"summary": "End a group's exemption (or it had none)", "x-scope": ADMIN,
                       "responses": {"204": {"description": "no longer exempt"},
                                     "400": _error("the group name is not valid"), "403": forbidden,
                                     "404": no_group, "503": unavailable}},
        },
    }
