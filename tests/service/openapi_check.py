"""Hold each answer of the workbench service to its own OpenAPI document.

``check(doc, method, path, status, content_type, body)`` finds the operation
for a concrete path (``api/quotas/users/alice`` -> ``/api/quotas/users/{name}``),
fails if the status is not documented for it, and validates a JSON body
against the documented schema (JSON Schema 2020-12, as OpenAPI 3.1 says).
A response may be a reference to one the document shares
(``$ref: "#/components/responses/Forbidden"``). The test hub's ``service()``
calls it on every response.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache

import jsonschema


def _template(doc: dict, path: str) -> str | None:
    path = "/" + path.split("?")[0].lstrip("/")
    for template in doc["paths"]:
        pattern = "^" + re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(template)) + "$"
        if re.match(pattern, path):
            return template
    return None


@lru_cache(maxsize=8)
def _validator(doc_json: str, keys: tuple[str, ...]) -> jsonschema.Draft202012Validator:
    doc = json.loads(doc_json)
    node = doc
    for key in keys:
        node = node[key]
    # Refs (#/components/...) resolve against the root of the validated schema.
    return jsonschema.Draft202012Validator(
        {**node, "components": doc["components"]}, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )


def resolve(doc: dict, keys: tuple[str, ...]) -> tuple[dict, tuple[str, ...]]:
    """The node at ``keys``, following local references (``#/components/...``); and its own keys."""
    node = doc
    for key in keys:
        node = node[key]
    seen = set()
    while isinstance(node, dict) and "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/"), f"not a local, acyclic reference: {ref}"
        assert ref not in seen, f"not a local, acyclic reference: {ref}"
        seen.add(ref)
        keys = tuple(part.replace("~1", "/").replace("~0", "~") for part in ref[2:].split("/"))
        node = doc
        for key in keys:
            node = node[key]
    return node, keys


def check(doc: dict, method: str, path: str, status: int, content_type: str, body: bytes) -> None:
    template = _template(doc, path)
    if template is None:
        # Only the catch-all answers undocumented API paths: a JSON 404 error.
        assert status == 404, (method, path, status)
        _validator(json.dumps(doc), ("components", "schemas", "Error")).validate(json.loads(body))
        return
    operation = doc["paths"][template].get(method.lower())
    if operation is None:
        assert status == 405, f"{method} {path}: {status} for an undocumented method"
        return
    assert str(status) in operation["responses"], (
        f"{method} {template}: status {status} is not documented ({body[:200]!r})"
    )
    response, response_keys = resolve(doc, ("paths", template, method.lower(), "responses", str(status)))
    content = response.get("content") or {}
    if not content:
        assert not body, f"{method} {template} {status}: a body where the document says none"
        return
    media = (content_type or "").split(";")[0].strip()
    assert media in content, f"{method} {template} {status}: {media!r} is not one of {sorted(content)}"
    if media == "application/json":
        keys = (*response_keys, "content", media, "schema")
        _validator(json.dumps(doc), keys).validate(json.loads(body))
