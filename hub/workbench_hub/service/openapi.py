"""The service's OpenAPI 3.1 document, served at ``api/openapi.json``, and request bodies checked against it.

The document is kept by hand in ``openapi.yaml`` next to this module (package data: it ships in
the wheel). Backends add their own parts as YAML fragments (``load_fragment``), partial documents
with ``paths`` and ``components``; ``load_document`` merges them into the main document, and a
fragment may add but never redefine (a path, schema, response or parameter that exists already is
a ValueError). A fragment may also add optional properties to the main document's object schemas
under ``x-schema-properties`` (the Slurm backend adds ``slurm`` to a GPU row).

Every JSON request body is checked against the schema its operation names (``validate_body``):
a body that breaks it raises ``BodyError``, whose str is one sentence naming the field and the
rule ("max_gpus must be between 0 and 1024, not 5000"), which the service answers as a 400. What a
schema cannot say (a model this hub has, a window that parses) the handlers check after it.
"""

from __future__ import annotations

import copy
import functools
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

MAIN = "openapi.yaml"
COMPONENT_SECTIONS = (
    "schemas",
    "responses",
    "parameters",
    "requestBodies",
    "headers",
    "examples",
    "securitySchemes",
    "links",
    "callbacks",
    "pathItems",
)
FRAGMENT_KEYS = ("paths", "components", "x-schema-properties")


class BodyError(ValueError):
    """A request body its schema refuses; str(err) is a sentence naming the field and the rule."""


@functools.cache
def _main() -> dict:
    return _read_yaml((files(__package__) / MAIN).read_text(encoding="utf-8"), MAIN)


def _read_yaml(text: str, where: str) -> dict:
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError(f"{where} is not an OpenAPI document: its top level is not a mapping")
    return data


def load_fragment(path: str | Path | Traversable) -> dict:
    """A backend's YAML fragment: a partial document with ``paths`` and ``components``."""
    source = Path(path) if isinstance(path, str) else path
    fragment = _read_yaml(source.read_text(encoding="utf-8"), str(path))
    fragment.setdefault("x-fragment", str(path))
    return fragment


def load_document(fragments: Sequence[dict] = ()) -> dict:
    """The service's whole document: the main YAML (read once) with each fragment merged in.

    Returns a new dict each call (the caller may change it). A fragment that redefines a path or
    a component, or names a part a fragment cannot have, is a ValueError.
    """
    document = copy.deepcopy(_main())
    for fragment in fragments:
        _merge(document, copy.deepcopy(fragment))
    return document


def _merge(document: dict, fragment: dict) -> None:
    name = fragment.pop("x-fragment", "an OpenAPI fragment")
    unknown = sorted(set(fragment) - set(FRAGMENT_KEYS))
    if unknown:
        raise ValueError(
            f"the OpenAPI fragment {name} has {', '.join(unknown)}; a fragment has only {', '.join(FRAGMENT_KEYS)}"
        )
    _add_only(document.setdefault("paths", {}), fragment.get("paths"), name, "the path {}", "paths")
    components = document.setdefault("components", {})
    for section, entries in (fragment.get("components") or {}).items():
        if section not in COMPONENT_SECTIONS:
            raise ValueError(f"the OpenAPI fragment {name} has components/{section}, which OpenAPI does not know")
        _add_only(components.setdefault(section, {}), entries, name, f"components/{section}/{{}}", section)
    schemas = components.get("schemas", {})
    for schema_name, added in (fragment.get("x-schema-properties") or {}).items():
        target = schemas.get(schema_name)
        if not isinstance(target, dict) or not isinstance(target.get("properties"), dict):
            raise ValueError(
                f"the OpenAPI fragment {name} adds properties to {schema_name}, which is not an "
                f"object schema of the document"
            )
        _add_only(target["properties"], added, name, f"the property {{}} of {schema_name}", "properties")


def _add_only(target: dict, entries: dict | None, fragment: str, what: str, kind: str) -> None:
    """Add a fragment's ``entries`` to ``target``; redefining one (``what`` names it) is a ValueError."""
    for key, value in (entries or {}).items():
        if key in target:
            raise ValueError(
                f"the OpenAPI fragment {fragment} redefines {what.format(key)}, which the document "
                f"already has; a fragment may only add {kind}"
            )
        target[key] = value


def with_server(document: dict, prefix: str) -> dict:
    """The document as served under ``prefix`` (its ``servers`` name where the API answers)."""
    return {**document, "servers": [{"url": "/" + prefix.strip("/")}]}


# -- request bodies -------------------------------------------------------------------------


def validate_body(document: dict, schema_name: str, body: Any) -> None:
    """Raise BodyError (one sentence) unless ``body`` matches ``components/schemas/<schema_name>``."""
    schemas = document["components"]["schemas"]
    if schema_name not in schemas:
        raise KeyError(f"the OpenAPI document has no schema {schema_name}")
    # JSON has no NaN or infinity, but Python's json module reads them; no bound catches them.
    odd = next(_non_finite(body, ()), None)
    if odd is not None:
        path, value = odd
        raise BodyError(f"{_field(path)} must be a finite number, not {_show(value)}")
    validator = Draft202012Validator(
        {"$ref": f"#/components/schemas/{schema_name}", "components": document["components"]}
    )
    error = best_match(validator.iter_errors(body))
    if error is not None:
        raise BodyError(_sentence(error, schemas[schema_name]))


def _non_finite(value: Any, path: tuple) -> Iterator[tuple[tuple, float]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _non_finite(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _non_finite(item, (*path, index))
    elif isinstance(value, float) and not math.isfinite(value):
        yield path, value


def _field(path: Iterable) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "the body"


def _show(value: Any, limit: int = 60) -> str:
    """What was sent, as JSON writes it (a number as a person would: 1000000000, not 1000000000.0)."""
    if isinstance(value, float) and math.isfinite(value):
        return _number(value)
    text = json.dumps(value, ensure_ascii=False, allow_nan=True)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _number(value: float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def _and(words: Sequence[str]) -> str:
    words = list(words)
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


TYPE_WORDS = {
    "integer": "a whole number",
    "number": "a number",
    "string": "text",
    "boolean": "true or false",
    "array": "a list",
    "object": "an object",
    "null": "null",
}


def _range(schema: dict) -> str:
    low = high = None
    if "minimum" in schema:
        low = f"at least {_number(schema['minimum'])}"
    if "exclusiveMinimum" in schema:
        low = f"more than {_number(schema['exclusiveMinimum'])}"
    if "maximum" in schema:
        high = f"at most {_number(schema['maximum'])}"
    if "exclusiveMaximum" in schema:
        high = f"less than {_number(schema['exclusiveMaximum'])}"
    if "minimum" in schema and "maximum" in schema:
        return f"between {_number(schema['minimum'])} and {_number(schema['maximum'])}"
    return " and ".join(p for p in (low, high) if p)


def _sentence(error: ValidationError, root: dict) -> str:
    """One sentence for a person: the field, the rule it breaks, and what was sent."""
    # jsonschema's stubs type these "X | Unset" (unset before validation); on a reported error all are set.
    keyword: Any = error.validator
    rule: Any = error.validator_value
    schema: Any = error.schema
    value: Any = error.instance
    path = list(error.absolute_path)
    field = _field(path)
    title = schema.get("title") if isinstance(schema, dict) else None
    if keyword == "type":
        types = [rule] if isinstance(rule, str) else list(rule)
        if not path and "object" in types:
            example = (root.get("examples") or [None])[0]
            such = f" such as {_show(example, 200)}" if example is not None else ""
            what = f" ({title})" if title else ""
            return f"the body must be a JSON object{what}{such}, not {_show(value)}"
        return f"{field} must be {' or '.join(TYPE_WORDS.get(t, t) for t in types)}, not {_show(value)}"
    if keyword == "required":
        missing = [name for name in rule if name not in value]
        where = _field([*path, missing[0]]) if missing else field
        needs = f"; {title} needs {_and(rule)}" if title else ""
        return f"{where} is missing{needs}"
    if keyword in ("additionalProperties", "unevaluatedProperties"):
        known = list(schema.get("properties") or {})
        extra = [k for k in value if k not in known]
        names = ", ".join(repr(k[:40]) for k in extra)
        has = f"; {title} has {_and(known)}" if title and known else (f"; {field} has {_and(known)}" if known else "")
        return f"unknown field{'s' if len(extra) > 1 else ''} {names}{has}"
    if keyword in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        return f"{field} must be {_range(schema)}, not {_show(value)}"
    if keyword == "not" and isinstance(rule, dict) and "exclusiveMinimum" in rule and "exclusiveMaximum" in rule:
        low, high = rule["exclusiveMinimum"], rule["exclusiveMaximum"]
        first = _number(low) if schema.get("minimum") == low else f"at most {_number(low)}"
        then = (
            f"between {_number(high)} and {_number(schema['maximum'])}"
            if "maximum" in schema
            else f"at least {_number(high)}"
        )
        return f"{field} must be {first} or {then}, not {_show(value)}"
    if keyword == "minLength":
        if rule == 1:
            return f"{field} must not be empty"
        return f"{field} must be at least {rule} characters long, not {len(value)}"
    if keyword == "maxLength":
        return f"{field} must be at most {rule} characters long, not {len(value)}"
    if keyword == "maxItems":
        return f"{field} may have at most {rule} items, not {len(value)}"
    if keyword == "minItems":
        return f"{field} must have at least {rule} item{'s' if rule != 1 else ''}, not {len(value)}"
    if keyword == "pattern":
        return f"{field} must be {title or f'text matching {rule}'}, not {_show(value)}"
    if keyword == "enum":
        return f"{field} must be one of {', '.join(_show(v) for v in rule)}, not {_show(value)}"
    if keyword == "const":
        return f"{field} must be {_show(rule)}, not {_show(value)}"
    return f"{field} is not valid: {error.message}"
