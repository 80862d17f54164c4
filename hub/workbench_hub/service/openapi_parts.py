"""The building blocks every part of the service's OpenAPI document uses.

The document is assembled from several modules (quotas and fleet in ``openapi.py``, idle
reclaim in ``openapi_idle.py``, reservations in ``reservation_openapi.py``); they share these
so that an error answer, a reference or a scope name is spelled one way everywhere.
"""

from __future__ import annotations

READ = "custom:workbench:read"
ADMIN = "custom:workbench:admin"
STRING = {"type": "string"}
STRINGS = {"type": "array", "items": STRING}
TIME = {"type": "string", "format": "date-time"}
NULL_TIME = {"type": ["string", "null"], "format": "date-time"}


def json_body(schema: dict) -> dict:
    return {"content": {"application/json": {"schema": schema}}}


def ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def error(description: str) -> dict:
    """An answer with the service's ``Error`` body: a sentence for a person."""
    return {"description": description, **json_body(ref("Error"))}


def obj(required: list[str], properties: dict, **extra) -> dict:
    return {"type": "object", "required": required, "properties": properties, **extra}
