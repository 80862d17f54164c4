"""The Slurm part of the OpenAPI document (``api/slurm/nodes``), merged by ``openapi.py``."""

from __future__ import annotations

from .openapi_parts import ADMIN, READ, STRING
from .openapi_parts import error as _error
from .openapi_parts import json_body as _json
from .openapi_parts import obj as _object
from .openapi_parts import ref as _ref


def slurm_schemas() -> dict:
    gpu = _object(["index", "uuid", "name", "memory_total_bytes"], {
        "index": {"type": "integer", "minimum": 0}, "uuid": STRING, "name": STRING,
        "memory_total_bytes": {"type": "integer", "minimum": 0}})
    return {
        "SlurmNodeGPUs": _object(["node", "gpus"], {"node": STRING, "gpus": {"type": "array", "items": gpu}}),
        "SlurmNodes": _object(["nodes"], {"nodes": {"type": "array", "items": _ref("SlurmNodeGPUs")}}),
    }


def slurm_paths(forbidden: dict, unavailable: dict) -> dict:
    return {
        "/api/slurm/nodes": {"get": {
            "summary": "Slurm: the GPUs jobs reported on each node, by Slurm's index (empty on other backends)",
            "x-scope": READ,
            "responses": {"200": {"description": "what the hub knows", **_json(_ref("SlurmNodes"))},
                          "403": forbidden, "503": unavailable}}},
        "/api/slurm/nodes/{name}": {
            "parameters": [{"name": "name", "in": "path", "required": True, "description": "the Slurm node",
                            "schema": {"type": "string", "minLength": 1}}],
            "delete": {"summary": "Forget a node's GPUs (they were replaced); the next job names them again",
                       "x-scope": ADMIN,
                       "responses": {"204": {"description": "forgotten"},
                                     "400": _error("the node name is too long"), "403": forbidden,
                                     "404": _error("nothing is known about that node"), "503": unavailable}}},
    }
