"""The service's OpenAPI document (openapi.yaml plus the backends' fragments): valid OpenAPI 3.1, its
bounds the code's own constants, every route documented and every documented route served, request
bodies refused with a sentence that names the field, and fragments that may add but not redefine."""

from __future__ import annotations

import copy
import re
from importlib.resources import files
from pathlib import Path

import jsonschema
import pytest
from tornado import web

from tests.service.openapi_check import resolve
from workbench_hub import drain_cli
from workbench_hub.service import (
    course_handlers,
    course_staff_handlers,
    drain_handlers,
    drain_stops,
    handlers,
    idle_handlers,
    reservation_handlers,
    roster_handlers,
)
from workbench_hub.service.app import make_app
from workbench_hub.service.openapi import BodyError, load_document, load_fragment, validate_body, with_server
from workbench_spawner.backend import installed_backends, openapi_fragments
from workbench_spawner.ledger.course_book import CourseRow
from workbench_spawner.ledger.drain_book import MAX_REASON as MAX_DRAIN_REASON
from workbench_spawner.ledger.idle_book import GROUP_PATTERN, MAX_REASON, IdleExemptionRow
from workbench_spawner.ledger.quota_book import QuotaRow
from workbench_spawner.ledger.reservation_book import FIELDS, MAX_GROUP, ReservationRow
from workbench_spawner.rules.course import MAX_STAFF, MAX_TITLE, Course
from workbench_spawner.rules.idle import MAX_IDLE_MINUTES, MIN_IDLE_MINUTES
from workbench_spawner.rules.quota import (
    MAX_GPU_HOURS_LIMIT,
    MAX_GPUS_LIMIT,
    MAX_MODELS,
    MAX_PROFILES,
    MAX_SESSION_HOURS_LIMIT,
    MIN_SESSION_HOURS,
    MODEL_PATTERN,
    QUOTA_FIELDS,
)
from workbench_spawner.rules.reservations import DEFAULT_GRACE_MINUTES, DEFAULT_WARN_MINUTES, MAX_MINUTES

PREFIX = "/services/workbench/"
MAIN = load_document()
SLURM = [load_fragment(path) for path in openapi_fragments(["slurm"])]
DOC = load_document(SLURM)  # what a Slurm hub serves: every path there is
HANDLER_MODULES = (
    handlers,
    idle_handlers,
    reservation_handlers,
    drain_handlers,
    course_handlers,
    roster_handlers,
    course_staff_handlers,
)


def at(doc: dict, pointer: str):
    """The node at a JSON pointer ("/components/schemas/QuotaBody/properties/max_gpus/maximum")."""
    node = doc
    for part in pointer.strip("/").split("/"):
        node = node[int(part)] if isinstance(node, list) else node[part.replace("~1", "/")]
    return node


def column_length(row, name: str) -> int:
    return row.__table__.c[name].type.length


# -- the document's numbers are the code's ------------------------------------------------------

QUOTA = "/components/schemas/QuotaBody/properties"
RESERVATION = "/components/schemas/ReservationBody/properties"
STORED_RESERVATION = "/components/schemas/Reservation/properties"
COURSE = "/components/schemas/CourseBody/properties"
SLURM_NODE = "/paths/~1api~1slurm~1nodes~1{name}/parameters/0/schema"
MODEL_LENGTH = int(re.search(r"\{0,(\d+)\}\$$", MODEL_PATTERN.pattern).group(1)) + 1
GROUP_LENGTH = int(re.search(r"\{1,(\d+)\}\$$", GROUP_PATTERN.pattern).group(1))


def _slurm_max_node() -> int:
    from workbench_spawner.backends.slurm.extension import nodes

    return nodes.max_node


# (pointer, the code's value, where the code keeps it)
BOUNDS = [
    (f"{QUOTA}/max_gpus/maximum", MAX_GPUS_LIMIT, "rules.quota.MAX_GPUS_LIMIT"),
    (f"{QUOTA}/gpu_hours_per_week/maximum", MAX_GPU_HOURS_LIMIT, "rules.quota.MAX_GPU_HOURS_LIMIT"),
    (f"{QUOTA}/allowed_models/maxItems", MAX_MODELS, "rules.quota.MAX_MODELS"),
    (f"{QUOTA}/allowed_models/items/pattern", MODEL_PATTERN.pattern, "rules.quota.MODEL_PATTERN"),
    (f"{QUOTA}/allowed_profiles/maxItems", MAX_PROFILES, "rules.quota.MAX_PROFILES"),
    (f"{QUOTA}/max_session_hours/minimum", MIN_SESSION_HOURS, "rules.quota.MIN_SESSION_HOURS"),
    (f"{QUOTA}/max_session_hours/maximum", MAX_SESSION_HOURS_LIMIT, "rules.quota.MAX_SESSION_HOURS_LIMIT"),
    (f"{QUOTA}/gpu_idle_minutes/maximum", MAX_IDLE_MINUTES, "rules.idle.MAX_IDLE_MINUTES"),
    (f"{QUOTA}/gpu_idle_minutes/not/exclusiveMaximum", MIN_IDLE_MINUTES, "rules.idle.MIN_IDLE_MINUTES"),
    (f"{RESERVATION}/group/maxLength", MAX_GROUP, "ledger.reservation_book.MAX_GROUP"),
    (f"{RESERVATION}/group/maxLength", column_length(ReservationRow, "group"), "gpu_reservations.group"),
    (f"{RESERVATION}/gpus/maximum", MAX_GPUS_LIMIT, "rules.quota.MAX_GPUS_LIMIT"),
    (f"{RESERVATION}/model/pattern", MODEL_PATTERN.pattern, "rules.quota.MODEL_PATTERN"),
    (f"{RESERVATION}/window/maxLength", column_length(ReservationRow, "window"), "gpu_reservations.window"),
    (f"{RESERVATION}/grace_minutes/maximum", MAX_MINUTES, "rules.reservations.MAX_MINUTES"),
    (f"{RESERVATION}/grace_minutes/default", DEFAULT_GRACE_MINUTES, "rules.reservations.DEFAULT_GRACE_MINUTES"),
    (f"{RESERVATION}/warn_minutes/maximum", MAX_MINUTES, "rules.reservations.MAX_MINUTES"),
    (f"{RESERVATION}/warn_minutes/default", DEFAULT_WARN_MINUTES, "rules.reservations.DEFAULT_WARN_MINUTES"),
    (f"{STORED_RESERVATION}/grace_minutes/maximum", MAX_MINUTES, "rules.reservations.MAX_MINUTES"),
    (f"{STORED_RESERVATION}/warn_minutes/maximum", MAX_MINUTES, "rules.reservations.MAX_MINUTES"),
    ("/components/schemas/IdleExemptionBody/properties/reason/maxLength", MAX_REASON, "ledger.idle_book.MAX_REASON"),
    ("/components/schemas/DrainBody/properties/reason/maxLength", MAX_DRAIN_REASON, "ledger.drain_book.MAX_REASON"),
    (
        "/components/schemas/DrainBody/properties/stop_servers_in_minutes/maximum",
        drain_stops.MAX_STOP_MINUTES,
        "service.drain_stops.MAX_STOP_MINUTES",
    ),
    (
        "/components/schemas/DrainBody/properties/stop_servers_in_minutes/maximum",
        drain_cli.MAX_STOP_MINUTES,
        "drain_cli.MAX_STOP_MINUTES (workbench drain --stop-in)",
    ),
    ("/components/parameters/Name/schema/maxLength", handlers.MAX_NAME, "service.handlers.MAX_NAME"),
    ("/components/parameters/Course/schema/maxLength", handlers.MAX_NAME, "service.handlers.MAX_NAME"),
    ("/components/parameters/Course/schema/maxLength", column_length(CourseRow, "name"), "workbench_courses.name"),
    ("/components/parameters/Student/schema/maxLength", handlers.MAX_NAME, "service.handlers.MAX_NAME"),
    (f"{COURSE}/title/maxLength", MAX_TITLE, "rules.course.MAX_TITLE"),
    (f"{COURSE}/title/maxLength", column_length(CourseRow, "title"), "workbench_courses.title"),
    (f"{COURSE}/staff_group/maxLength", column_length(CourseRow, "staff_group"), "workbench_courses.staff_group"),
    (f"{COURSE}/staff/maxItems", MAX_STAFF, "rules.course.MAX_STAFF"),
    (f"{COURSE}/reservation_gpus/maximum", MAX_GPUS_LIMIT, "rules.quota.MAX_GPUS_LIMIT"),
    (f"{COURSE}/reservation_gpus/default", Course.reservation_gpus, "rules.course.Course.reservation_gpus"),
    (
        "/components/schemas/CourseExemptionBody/properties/hours/maximum",
        course_staff_handlers.MAX_EXEMPT_HOURS,
        "course_staff_handlers.MAX_EXEMPT_HOURS",
    ),
    ("/components/schemas/CourseExemptionBody/properties/reason/maxLength", MAX_REASON, "idle_book.MAX_REASON"),
    (
        "/components/schemas/CourseExemptionBody/properties/hours/minimum",
        course_staff_handlers.MIN_EXEMPT_HOURS,
        "course_staff_handlers.MIN_EXEMPT_HOURS",
    ),
    (f"{COURSE}/staff/items/maxLength", handlers.MAX_NAME, "service.handlers.MAX_NAME (a hub user's name)"),
    ("/components/schemas/StudentStopBody/properties/server/maxLength", handlers.MAX_NAME, "service.handlers.MAX_NAME"),
    ("/components/schemas/RosterBody/properties/csv/maxLength", roster_handlers.MAX_CSV, "roster_handlers.MAX_CSV"),
    ("/components/parameters/Name/schema/maxLength", column_length(QuotaRow, "name"), "gpu_quotas.name"),
    ("/paths/~1api~1usage/get/parameters/0/schema/maxLength", handlers.MAX_NAME, "service.handlers.MAX_NAME"),
    ("/paths/~1api~1usage/get/parameters/1/schema/maxLength", handlers.MAX_NAME, "service.handlers.MAX_NAME"),
    ("/components/parameters/Group/schema/maxLength", GROUP_LENGTH, "ledger.idle_book.GROUP_PATTERN"),
    (
        "/components/parameters/Group/schema/maxLength",
        column_length(IdleExemptionRow, "group"),
        "gpu_idle_exemptions.group",
    ),
    (SLURM_NODE + "/maxLength", _slurm_max_node(), "backends.slurm.extension.nodes.max_node"),
]
# Numbers of the request schemas and parameters with no constant in the code (each says why).
NO_CONSTANT = {
    f"{QUOTA}/max_gpus/minimum": "a count",
    f"{QUOTA}/gpu_hours_per_week/minimum": "a count",
    f"{QUOTA}/gpu_idle_minutes/minimum": "0 turns reclaim off",
    f"{QUOTA}/gpu_idle_minutes/not/exclusiveMinimum": "0 turns reclaim off",
    f"{QUOTA}/gpu_idle_threshold/exclusiveMinimum": "a percentage",
    f"{QUOTA}/gpu_idle_threshold/maximum": "a percentage",
    f"{RESERVATION}/group/minLength": "a name",
    f"{RESERVATION}/group/pattern": "not only spaces",
    f"{RESERVATION}/gpus/minimum": "a reservation of nothing reserves nothing",
    f"{RESERVATION}/grace_minutes/minimum": "a duration",
    f"{RESERVATION}/warn_minutes/minimum": "a duration",
    "/components/schemas/DrainBody/properties/stop_servers_in_minutes/exclusiveMinimum": "a countdown",
    "/components/parameters/Name/schema/minLength": "a name",
    "/components/parameters/Group/schema/minLength": "a name",
    "/components/parameters/Course/schema/minLength": "a name",
    "/components/parameters/Student/schema/minLength": "a name",
    f"{COURSE}/title/minLength": "a title",
    f"{COURSE}/title/pattern": "not only spaces",
    f"{COURSE}/staff_group/minLength": "a name",
    f"{COURSE}/staff/items/minLength": "a name",
    f"{COURSE}/reservation_gpus/minimum": "a count",
    "/paths/~1api~1courses~1{course}~1reservations~1{rid}/parameters/1/schema/minLength": "an id",
    "/components/parameters/ReservationId/schema/minLength": "an id",
    "/paths/~1api~1usage/get/parameters/0/schema/minLength": "a name",
    "/paths/~1api~1usage/get/parameters/1/schema/minLength": "a name",
    SLURM_NODE + "/minLength": "a name",
}
BOUND_KEYWORDS = (
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "pattern",
    "default",
)


@pytest.mark.parametrize(("pointer", "value", "where"), BOUNDS, ids=[f"{b[0]}={b[2]}" for b in BOUNDS])
def test_a_bound_of_the_document_is_the_codes_constant(pointer, value, where):
    assert at(DOC, pointer) == value, f"openapi.yaml {pointer} is {at(DOC, pointer)!r}; {where} is {value!r}"


def _written_bounds(node, pointer: str):
    if isinstance(node, dict):
        for key, value in node.items():
            here = f"{pointer}/{key.replace('/', '~1')}"
            if key in BOUND_KEYWORDS and isinstance(value, (int, float, str)) and not isinstance(value, bool):
                yield here
            elif key not in ("examples", "description") and not (key == "title" and isinstance(value, str)):
                yield from _written_bounds(value, here)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _written_bounds(value, f"{pointer}/{index}")


# Every request body schema of the document: the handlers check each (valid_body), and its bounds are the code's.
REQUEST_BODIES = {
    "QuotaBody",
    "ReservationBody",
    "IdleExemptionBody",
    "DrainBody",
    "CourseBody",
    "StudentQuotaBody",
    "StudentStopBody",
    "RosterBody",
    "CourseReservationBody",
    "CourseExemptionBody",
}


def test_every_bound_a_request_may_break_is_checked_against_the_code():
    """Each number (or pattern) of a request body or parameter is in BOUNDS or says why it has no constant."""
    request_schemas = {*REQUEST_BODIES, "Ceiling"}  # the course body's ceiling is a schema of its own
    written = set()
    for name in request_schemas:
        written |= set(_written_bounds(DOC["components"]["schemas"][name], f"/components/schemas/{name}"))
    written |= set(_written_bounds(DOC["components"]["parameters"], "/components/parameters"))
    for path, item in DOC["paths"].items():
        for index, parameter in enumerate(item.get("parameters", [])):
            if "$ref" not in parameter:
                written |= set(_written_bounds(parameter, f"/paths/{path.replace('/', '~1')}/parameters/{index}"))
        for method, operation in item.items():
            if method != "parameters":
                for index, parameter in enumerate(operation.get("parameters", [])):
                    written |= set(
                        _written_bounds(parameter, f"/paths/{path.replace('/', '~1')}/{method}/parameters/{index}")
                    )
    checked = {pointer for pointer, _, _ in BOUNDS} | set(NO_CONSTANT)
    assert written - checked == set(), "add these to BOUNDS (or to NO_CONSTANT, saying why)"
    assert set(NO_CONSTANT) <= written, "NO_CONSTANT names bounds the document no longer has"


def test_the_fields_of_a_body_are_the_codes():
    schemas = DOC["components"]["schemas"]
    assert tuple(schemas["QuotaBody"]["properties"]) == QUOTA_FIELDS
    assert tuple(schemas["Quota"]["required"]) == QUOTA_FIELDS
    assert tuple(schemas["ReservationBody"]["properties"]) == FIELDS
    assert column_length(ReservationRow, "model") == MODEL_LENGTH
    for name in ("QuotaBody", "ReservationBody", "IdleExemptionBody", "DrainBody"):
        assert schemas[name]["additionalProperties"] is False, name
        assert schemas[name]["title"], f"{name} needs a title: the 400 sentences name it"


# -- a valid OpenAPI 3.1 document -------------------------------------------------------------------


def _refs(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


@pytest.mark.parametrize("doc", [MAIN, DOC], ids=["main", "main+slurm"])
def test_every_reference_resolves(doc):
    refs = set(_refs(doc))
    assert "#/components/schemas/Error" in refs
    assert "#/components/responses/Forbidden" in refs
    for ref in refs:
        assert ref.startswith("#/"), ref
        at(doc, ref[1:])  # KeyError names the missing part


def test_the_slurm_fragment_leans_on_the_main_documents_shared_parts():
    refs = set(_refs(SLURM[0]))
    assert {"#/components/responses/Forbidden", "#/components/schemas/Error"} <= refs
    unresolved = set()
    for ref in refs:
        try:
            at(SLURM[0], ref[1:])
        except KeyError:
            unresolved.add(ref)
    assert {"#/components/responses/Forbidden", "#/components/schemas/Error"} <= unresolved, "found in the fragment"


def test_the_document_is_valid_openapi_3_1():
    assert DOC["openapi"].startswith("3.1")
    try:
        from openapi_spec_validator import validate
    except ImportError:
        validate = None
    if validate is not None:
        validate(DOC)
        return
    try:  # the OpenAPI 3.1 schema (without schema validation) as schemathesis ships it
        from schemathesis.specs.openapi.definitions import OPENAPI_31
    except ImportError:
        pytest.skip("neither openapi-spec-validator nor schemathesis is installed: references checked only")
    jsonschema.Draft202012Validator(OPENAPI_31).validate(DOC)
    with pytest.raises(jsonschema.ValidationError):  # the meta-schema does refuse a broken document
        jsonschema.Draft202012Validator(OPENAPI_31).validate({**DOC, "paths": {"/x": {"get": {"responses": 7}}}})


def test_every_schema_is_json_schema_2020_12_and_every_answer_has_one():
    for schema in DOC["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)
    for path, item in DOC["paths"].items():
        for method, operation in item.items():
            if method == "parameters":
                continue
            for status in operation["responses"]:
                response, _ = resolve(DOC, ("paths", path, method, "responses", status))
                if status not in ("204", "302"):
                    assert response.get("content"), (method, path, status)
                for media in (response.get("content") or {}).values():
                    assert "schema" in media, (method, path, status)
    body = DOC["components"]["schemas"]["QuotaBody"]
    assert body["properties"]["max_session_hours"]["minimum"] == 0.01


@pytest.mark.parametrize("backend", ["", *installed_backends()])
def test_every_operation_says_who_may_call_it(backend):
    """x-scope (or security: [] for the public document) on every operation; x-self-scope only the self scope, and
    x-self-param only beside it, naming one of the operation's own parameters (the authorization table reads these)."""
    doc = make_app(fleet=None, prefix=PREFIX, backend=backend).settings["openapi"]
    scopes = {"custom:workbench:read", "custom:workbench:admin"}
    for path, item in doc["paths"].items():
        shared = item.get("parameters") or []
        for method, operation in item.items():
            if method not in METHODS:
                continue
            where = f"{method} {path}"
            if operation.get("security") == []:
                assert "x-scope" not in operation, where
                continue
            assert operation.get("x-scope") in scopes, where
            if "x-self-param" in operation:
                assert operation.get("x-self-scope") == "custom:workbench:self", where
                names = {
                    resolve(doc, tuple(p["$ref"][2:].split("/")))[0]["name"] if "$ref" in p else p["name"]
                    for p in [*shared, *(operation.get("parameters") or [])]
                }
                assert operation["x-self-param"] in names, where
            assert operation.get("x-self-scope") in (None, "custom:workbench:self"), where
    me = doc["paths"]["/api/me"]["get"]
    assert (me["x-scope"], me["x-self-scope"], "x-self-param" in me) == (
        "custom:workbench:read",
        "custom:workbench:self",
        False,
    )
    assert doc["paths"]["/api/usage"]["get"]["x-self-param"] == "user"
    assert doc["paths"]["/api/quotas/users/{name}"]["get"]["x-self-param"] == "name"


def test_the_yaml_ships_with_the_package():
    assert (files("workbench_hub.service") / "openapi.yaml").is_file()
    for path in openapi_fragments(list(installed_backends())):
        assert Path(path).is_file()
        assert Path(path).parent.name in installed_backends()


# -- routes and the document, both ways --------------------------------------------------------------

NOT_API = ("oauth_callback", "static/(.*)", "api/.*")
METHODS = ("get", "put", "post", "delete", "patch", "head", "options")


def app_routes(app: web.Application) -> set[tuple[str, str]]:
    """(method, path) of every route the app mounts, a method counted when its handler implements it."""
    routes = set()
    for rule in app.wildcard_router.rules:
        relative = rule.matcher.regex.pattern.rstrip("$")[len(PREFIX) :]
        if relative in NOT_API:
            continue
        path = "/" + re.sub(r"\(\?P<(\w+)>\[\^/\]\+\)", r"{\1}", relative).replace("([^/]+)", "{name}")
        for method in METHODS:
            if getattr(rule.target, method) is not getattr(web.RequestHandler, method):
                routes.add((method, path))
    return routes


def documented(doc: dict) -> set[tuple[str, str]]:
    return {(method, path) for path, item in doc["paths"].items() for method in item if method in METHODS}


@pytest.mark.parametrize("backend", ["", *installed_backends()])
def test_every_route_is_documented_and_every_documented_route_is_served(backend):
    app = make_app(fleet=None, prefix=PREFIX, backend=backend)
    doc = app.settings["openapi"]
    served, described = app_routes(app), documented(doc)
    assert served - described == set(), "mounted but not in the document"
    assert described - served == set(), "in the document but not served"
    assert ("get", "/api/gpus") in served
    assert ("put", "/api/quotas/users/{name}") in served
    slurm = ("delete", "/api/slurm/nodes/{name}")
    assert (slurm in served) is (backend == "slurm")
    assert ("slurm" in doc["components"]["schemas"]["GPU"]["properties"]) is (backend == "slurm")


def test_the_served_document_names_the_prefix_and_leaves_the_loaded_one_alone():
    app = make_app(fleet=None, prefix="/services/other/")
    served = with_server(app.settings["openapi"], app.settings["prefix"])
    assert served["servers"] == [{"url": "/services/other"}]
    assert app.settings["openapi"]["servers"] == [{"url": "/services/workbench"}]


def test_every_request_body_is_checked_by_its_handler():
    """A documented request body names a schema some handler passes to valid_body, and no other."""
    in_document = set()
    for item in DOC["paths"].values():
        for method, operation in item.items():
            if method != "parameters" and "requestBody" in operation:
                ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
                in_document.add(ref.rsplit("/", 1)[1])
    source = "".join(Path(m.__file__).read_text() for m in HANDLER_MODULES)
    assert set(re.findall(r'valid_body\(\s*"(\w+)"', source)) == in_document == REQUEST_BODIES


# -- request bodies: refused with a sentence ------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "body", "sentence"),
    [
        ("QuotaBody", {"max_gpus": 5000}, "max_gpus must be between 0 and 1024, not 5000"),
        (
            "QuotaBody",
            {"max_gpus": 1, "foo": 1},
            "unknown field 'foo'; a quota has max_gpus, gpu_hours_per_week, allowed_models, max_session_hours, "
            "gpu_idle_minutes, gpu_idle_threshold, whole_gpus, allowed_profiles and shared_gpus",
        ),
        (
            "QuotaBody",
            {"max_gpus": 1, "foo": 1, "bar": 2},
            "unknown fields 'foo', 'bar'; a quota has max_gpus, "
            "gpu_hours_per_week, allowed_models, max_session_hours, gpu_idle_minutes, gpu_idle_threshold, "
            "whole_gpus, allowed_profiles and shared_gpus",
        ),
        ("QuotaBody", {}, "max_gpus is missing; a quota needs max_gpus"),
        ("QuotaBody", [1], 'the body must be a JSON object (a quota) such as {"max_gpus": 1}, not [1]'),
        ("QuotaBody", {"max_gpus": "2"}, 'max_gpus must be a whole number, not "2"'),
        (
            "QuotaBody",
            {"max_gpus": 1, "gpu_hours_per_week": True},
            "gpu_hours_per_week must be a number or null, not true",
        ),
        (
            "QuotaBody",
            {"max_gpus": 1, "gpu_idle_minutes": 0.01},
            "gpu_idle_minutes must be 0 or between 0.05 and 10080, not 0.01",
        ),
        (
            "QuotaBody",
            {"max_gpus": 1, "gpu_idle_threshold": 0},
            "gpu_idle_threshold must be more than 0 and at most 100, not 0",
        ),
        (
            "QuotaBody",
            {"max_gpus": 1, "allowed_models": ["ok", "<b>"]},
            "allowed_models[1] must be a GPU model name (letters, digits, . _ + - and spaces; at most 64 characters), "
            'not "<b>"',
        ),
        (
            "QuotaBody",
            {"max_gpus": 1, "allowed_models": ["A"] * 65},
            "allowed_models may have at most 64 items, not 65",
        ),
        (
            "QuotaBody",
            {"max_gpus": 1, "max_session_hours": float("inf")},
            "max_session_hours must be a finite number, not Infinity",
        ),
        ("ReservationBody", {"group": "g", "gpus": 1}, "window is missing; a reservation needs group, gpus and window"),
        ("ReservationBody", {"group": "", "gpus": 1, "window": "Tue 10:00-11:00"}, "group must not be empty"),
        (
            "ReservationBody",
            {"group": " ", "gpus": 1, "window": "Tue 10:00-11:00"},
            'group must be the name of a JupyterHub group, not " "',
        ),
        (
            "ReservationBody",
            {"group": "g", "gpus": 1, "window": "x" * 65},
            "window must be at most 64 characters long, not 65",
        ),
        ("IdleExemptionBody", {"reason": 5}, "reason must be text or null, not 5"),
        ("IdleExemptionBody", {"why": "x"}, "unknown field 'why'; an idle exemption has reason"),
        ("DrainBody", {"why": "x"}, "unknown field 'why'; a drain has reason and stop_servers_in_minutes"),
        (
            "DrainBody",
            {"stop_servers_in_minutes": 0},
            "stop_servers_in_minutes must be more than 0 and at most 10080, not 0",
        ),
        ("DrainBody", {"reason": "r" * 501}, "reason must be at most 500 characters long, not 501"),
    ],
)
def test_a_refused_body_is_one_sentence_naming_the_field_and_the_rule(schema, body, sentence):
    with pytest.raises(BodyError) as refused:
        validate_body(DOC, schema, body)
    assert str(refused.value) == sentence


@pytest.mark.parametrize(
    ("schema", "body"),
    [
        ("QuotaBody", {"max_gpus": 0}),
        (
            "QuotaBody",
            {
                "max_gpus": 2.0,
                "gpu_hours_per_week": None,
                "allowed_models": [],
                "max_session_hours": 0.01,
                "gpu_idle_minutes": 0,
                "gpu_idle_threshold": 100,
            },
        ),
        ("QuotaBody", {"max_gpus": 1024, "gpu_idle_minutes": 0.05, "allowed_models": None}),
        (
            "ReservationBody",
            {
                "group": "ml-course",
                "gpus": 8,
                "window": "Tue 10:00-12:00",
                "model": None,
                "grace_minutes": None,
                "warn_minutes": 1440,
                "preempt": True,
            },
        ),
        ("IdleExemptionBody", {}),
        ("IdleExemptionBody", {"reason": None}),
        ("IdleExemptionBody", {"reason": "r" * 500}),
        ("DrainBody", {}),
        ("DrainBody", {"reason": "r" * 500}),
    ],
)
def test_a_good_body_passes(schema, body):
    validate_body(DOC, schema, body)


def test_an_unknown_schema_is_a_programming_error():
    with pytest.raises(KeyError, match="NoSuchBody"):
        validate_body(DOC, "NoSuchBody", {})


# -- fragments add, never redefine ---------------------------------------------------------------------


def test_the_slurm_fragment_adds_its_paths_schemas_and_the_gpu_rows_slurm_property():
    assert "/api/slurm/nodes" in DOC["paths"]
    assert "/api/slurm/nodes" not in MAIN["paths"]
    assert "SlurmNodes" in DOC["components"]["schemas"]
    assert "SlurmNodes" not in MAIN["components"]["schemas"]
    assert DOC["components"]["schemas"]["GPU"]["properties"]["slurm"] == {"$ref": "#/components/schemas/SlurmGPUState"}
    assert "slurm" not in MAIN["components"]["schemas"]["GPU"]["properties"]
    assert "x-schema-properties" not in DOC
    assert "x-fragment" not in DOC


def test_each_load_is_a_new_document():
    first = load_document()
    first["paths"].clear()
    first["components"]["schemas"]["QuotaBody"]["properties"].clear()
    assert load_document() == MAIN
    assert MAIN["paths"]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda f: f["paths"].update({"/api/gpus": {}}), "redefines the path /api/gpus"),
        (lambda f: f["components"]["schemas"].update({"Error": {}}), "redefines components/schemas/Error"),
        (
            lambda f: f["components"].update({"responses": {"Forbidden": {}}}),
            "redefines components/responses/Forbidden",
        ),
        (lambda f: f["x-schema-properties"]["GPU"].update({"model": {}}), "redefines the property model of GPU"),
        (lambda f: f["x-schema-properties"].update({"Nothing": {"x": {}}}), "Nothing, which is not an object schema"),
        (lambda f: f.update({"info": {}}), "has info; a fragment has only paths, components"),
        (lambda f: f["components"].update({"widgets": {}}), "components/widgets, which OpenAPI does not know"),
    ],
)
def test_a_fragment_that_redefines_is_refused_with_a_sentence(change, words):
    fragment = copy.deepcopy(SLURM[0])
    change(fragment)
    with pytest.raises(ValueError, match=re.escape(words)):
        load_document([fragment])
    with pytest.raises(ValueError, match="redefines the path /api/slurm/nodes"):
        load_document([SLURM[0], SLURM[0]])


def test_a_fragment_is_read_from_a_path_or_a_string(tmp_path):
    path = tmp_path / "frag.yaml"
    path.write_text("paths:\n  /api/extra:\n    get:\n      responses:\n        '204': {description: nothing}\n")
    for source in (path, str(path)):
        fragment = load_fragment(source)
        assert load_document([fragment])["paths"]["/api/extra"]["get"]["responses"]["204"]
    path.write_text("- a list\n")
    with pytest.raises(ValueError, match="not an OpenAPI document"):
        load_fragment(path)


def test_the_largest_roster_fits_the_services_body_limit():
    """A roster of MAX_CSV characters, each one escaped by JSON as a \\uXXXX\\uXXXX pair (a character outside the
    Basic Multilingual Plane: the most one takes), fits MAX_BODY; schemathesis found 80,000 did not."""
    import json

    from workbench_hub.service.app import MAX_BODY

    assert len(json.dumps({"csv": "\U0001f600" * roster_handlers.MAX_CSV}).encode()) < MAX_BODY
