"""The workbench service's authorization table, made from the OpenAPI document it serves and run against
a real hub: every path and method by every kind of caller, as the security review of issue 46 checked it.

The document says who may call each operation (``hub/workbench_hub/service/openapi.yaml``):
``x-scope``, the scope that opens it for everyone's data; where a caller may act on their own data,
``x-self-scope`` (``custom:workbench:self``), with ``x-self-param`` naming the path or query parameter
that must then be the caller's own name (absent: the operation is about the caller only); or
``security: []``, open to anyone. From these the table derives what each caller must get:

* the callers: anonymous (no token, no cookie), a student, another student, a token of the student
  narrowed to a scope that is not the workbench's (``read:users:name!user=STUDENT``, made through
  the hub's API), and the hub's admin. Each caller's scopes are what the hub says its token holds
  (``GET /hub/api/user``), so the table tests the service's checks against the hub's grants; a
  separate test holds the grants to the scope design (every user holds ``custom:workbench:self``,
  the narrowed token no workbench scope, the admin ``custom:workbench:admin``). Two instructors
  (issue 48): one on the staff of the students' course (through its staff group), one of another
  course;
* a caller may call an operation when it holds ``x-scope`` (``custom:workbench:admin`` reads too, as
  the document says), or holds ``x-self-scope`` and the ``x-self-param`` parameter is its own name,
  or is on the staff of the course that ``x-course-staff`` names (a path parameter) with a token
  that holds ``custom:workbench:self``;
* every request is real: path and query parameters are filled with real names (the student's own
  name, a group they are in, a GPU, a stored reservation), every write carries a body its schema
  accepts (so a refusal is about who asks, not what), and the quotas, reservations, drains,
  exemptions and the student's running server exist before each operation;
* a refused caller gets 401 or 403 (an HTML page: anonymous is sent to the hub's login instead; an
  operation that answers 405 to everyone refuses everyone with it) and nothing changed on the hub or
  the service (``hub_state.snapshot`` before and after); an allowed caller gets neither 401 nor 403
  nor a 5xx; every answer is one the document describes.

A route without an operation, or an operation that says neither ``x-scope`` nor ``security: []``,
fails here too, so a new route cannot ship without its row.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlparse

import jsonschema
import pytest
import requests

from tests.integration import hub_state
from tests.service.conftest import WorkbenchHub, shut_down, start_workbench_hub
from tests.service.openapi_check import check, resolve
from tests.unit.test_openapi_document import app_routes, documented
from workbench_hub.service.app import make_app
from workbench_hub.service.openapi import load_document, load_fragment
from workbench_spawner.backend import installed_backends, openapi_fragments

BACKEND = "local"  # what the test hub runs: the service serves openapi.yaml with this backend's fragment
ADMIN_SCOPE = "custom:workbench:admin"
READ_SCOPE = "custom:workbench:read"
SELF_SCOPE = "custom:workbench:self"
WORKBENCH_SCOPES = {ADMIN_SCOPE, READ_SCOPE, SELF_SCOPE}
STUDENT, OTHER, GROUP = "alice", "bob", "course"
INSTRUCTOR, OTHER_INSTRUCTOR, OTHER_COURSE = "prof", "nlp-prof", "nlp"
# Who is on which course's staff (the hub groups the table makes and the courses it sets up).
STAFF = {INSTRUCTOR: GROUP, OTHER_INSTRUCTOR: OTHER_COURSE}
# A value for each query parameter the table fills: a real name on this hub.
QUERY_VALUES = {"user": STUDENT, "group": GROUP}
# Bodies the schema's first example does not fit to this hub (the example's group and 8 GPUs do not
# exist here): a reservation of one GPU for the students' group, in a window that never opens during
# the test.
NEXT_YEAR = (datetime.date.today() + datetime.timedelta(days=300)).isoformat()
BODIES: dict[str, dict[str, Any]] = {
    "ReservationBody": {"group": GROUP, "gpus": 1, "window": f"{NEXT_YEAR} 10:00-12:00"},
    "CourseReservationBody": {"gpus": 1, "window": f"{NEXT_YEAR} 14:00-16:00"},
}
pytestmark = pytest.mark.integration
KEPT = "kept by the authorization table"  # the reason of the drain and exemption set before each row


def served_document(backend: str = BACKEND) -> dict:
    """The document a hub with ``backend`` serves (openapi.yaml with the backend's fragment), built here."""
    return load_document([load_fragment(path) for path in openapi_fragments([backend] if backend else [])])


OPERATIONS = sorted(documented(served_document()), key=lambda op: (op[1], op[0]))


@dataclass(frozen=True)
class Caller:
    label: str
    name: str | None  # the hub user it acts as (None: anonymous)
    token: str | None
    scopes: frozenset[str]  # what the hub says the token holds, filters left off
    course: str | None = None  # the course it is staff of

    def holds(self, scope: str) -> bool:
        return scope in self.scopes or (scope == READ_SCOPE and ADMIN_SCOPE in self.scopes)


class TableHub:
    """The hub of the table: two students in one group, the student's server running, the admin, and
    the callers' tokens; ``prepare()`` puts back what an allowed write of the previous row removed."""

    def __init__(self, hub: WorkbenchHub):
        self.hub = hub
        hub.create_users(STUDENT, OTHER, INSTRUCTOR, OTHER_INSTRUCTOR)
        assert hub.api("POST", f"/groups/{GROUP}", json={"users": [STUDENT, OTHER]}).status_code in (201, 409)
        for staff, course in STAFF.items():
            assert hub.api("POST", f"/groups/{course}-staff", json={"users": [staff]}).status_code in (201, 409)
        gpus = hub.service("GET", "api/gpus").json()["gpus"]
        self.gpu = gpus[-1]["uuid"]  # a GPU to keep drained (the student's server takes the first free one)
        assert hub.spawn(STUDENT, gpus=1).status_code in (201, 202)
        hub.wait_ready(STUDENT)
        narrowed = hub.api(
            "POST", f"/users/{STUDENT}/tokens", json={"scopes": [f"read:users:name!user={STUDENT}"], "note": "table"}
        )
        assert narrowed.status_code == 201, narrowed.text
        self.callers = [
            Caller("anonymous", None, None, frozenset()),
            self._caller("narrowed token", STUDENT, narrowed.json()["token"]),
            self._caller("other student", OTHER, hub.user_token(OTHER)),
            self._caller("student", STUDENT, hub.user_token(STUDENT)),
            self._caller("instructor", INSTRUCTOR, hub.user_token(INSTRUCTOR)),
            self._caller("another course's instructor", OTHER_INSTRUCTOR, hub.user_token(OTHER_INSTRUCTOR)),
            self._caller("admin", "admin", hub.user_token("admin")),
        ]

    def _caller(self, label: str, name: str, token: str) -> Caller:
        r = requests.get(f"{self.hub.url}/hub/api/user", headers={"Authorization": f"token {token}"}, timeout=30)
        assert r.status_code == 200, f"{label}: {r.status_code} {r.text}"
        assert r.json()["name"] == name
        scopes = frozenset(scope.partition("!")[0] for scope in r.json()["scopes"])
        return Caller(label, name, token, scopes, STAFF.get(name))

    def prepare(self) -> dict[str, str]:
        """Quotas, an exemption, a drain and a reservation in place (as the automation token sets them);
        the real name to put in a path after each segment ("users" -> the student)."""
        hub = self.hub
        for path, body in (
            (f"api/quotas/users/{STUDENT}", {"max_gpus": 2}),
            (f"api/quotas/groups/{GROUP}", {"max_gpus": 2}),
            (f"api/idle/exemptions/{GROUP}", {"reason": KEPT}),
            (f"api/drains/{self.gpu}", {"reason": KEPT}),
        ):
            r = hub.service("PUT", path, json=body)
            assert r.status_code == 200, f"PUT {path}: {r.status_code} {r.text}"
        for course in (GROUP, OTHER_COURSE):
            body = {
                "title": course,
                "ceiling": {"max_gpus": 2},
                "staff_group": f"{course}-staff",
                "reservation_gpus": 2,
            }
            r = hub.service("PUT", f"api/courses/{course}", json=body)
            assert r.status_code == 200, f"PUT api/courses/{course}: {r.status_code} {r.text}"
        if hub.server(STUDENT) is None:  # an allowed stop of the row before (a course's staff stop it)
            assert hub.spawn(STUDENT, gpus=1).status_code in (201, 202)
            hub.wait_ready(STUDENT)
        reservations = hub.service("GET", "api/reservations").json()["reservations"]
        if not reservations:
            r = hub.service("POST", "api/reservations", json=BODIES["ReservationBody"])
            assert r.status_code == 201, r.text
            reservations = [r.json()]
        return {
            "users": STUDENT,
            "groups": GROUP,
            "exemptions": GROUP,
            "drains": self.gpu,
            "reservations": str(reservations[0]["id"]),
            "courses": GROUP,
            "students": STUDENT,
        }


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    hub = start_workbench_hub(
        tmp_path_factory.mktemp("hub") / "hub", {"WORKBENCH_SIMULATED_GPUS": "2xH100-80GB,2xA100-40GB"}
    )
    try:
        yield TableHub(hub)
    finally:
        shut_down(hub)


def parameters(doc: dict, path: str, method: str) -> list[dict]:
    """The operation's parameters and its path's, each local reference (``#/components/parameters/Name``)
    followed to what it names."""
    found = []
    for parameter in [*doc["paths"][path].get("parameters", []), *doc["paths"][path][method].get("parameters", [])]:
        while "$ref" in parameter:
            target: Any = doc
            for key in parameter["$ref"].removeprefix("#/").split("/"):
                target = target[key]
            parameter = target
        found.append(parameter)
    return found


@dataclass
class Row:
    """One request of the table: the concrete path, its query, each parameter's value, and what the
    table could not fill (a new path segment or query parameter without a real name yet)."""

    path: str
    query: dict[str, str]
    values: dict[str, str]
    missing: list[str]


def rows(doc: dict, path: str, method: str, names: dict[str, str]) -> list[Row]:
    """The requests of one operation: path parameters filled with the real name for the segment before
    each, required query parameters and ``x-self-param`` with ``QUERY_VALUES``; where ``x-self-param``
    is an optional query parameter, the request without it too (then it is about the caller)."""
    operation = doc["paths"][path][method]
    values: dict[str, str] = {}
    missing: list[str] = []
    concrete = path
    for match in re.finditer(r"\{(\w+)\}", path):
        segment = path[: match.start()].rstrip("/").rsplit("/", 1)[-1]
        if segment not in names:
            missing.append(f"no real name for {{{match.group(1)}}} after '{segment}/': add one to TableHub.prepare")
            continue
        values[match.group(1)] = names[segment]
        concrete = concrete.replace(match.group(0), names[segment])
    query: dict[str, str] = {}
    optional_self = None
    for parameter in parameters(doc, path, method):
        own = parameter["name"] == operation.get("x-self-param")
        if parameter["in"] != "query" or not (parameter.get("required") or own):
            continue
        if parameter["name"] not in QUERY_VALUES:
            missing.append(f"no real value for the query parameter {parameter['name']!r}: add one to QUERY_VALUES")
            continue
        query[parameter["name"]] = values[parameter["name"]] = QUERY_VALUES[parameter["name"]]
        if own and not parameter.get("required"):
            optional_self = parameter["name"]
    found = [Row(concrete.lstrip("/"), query, values, missing)]
    if optional_self:
        less = {k: v for k, v in query.items() if k != optional_self}
        found.append(Row(concrete.lstrip("/"), less, {k: v for k, v in values.items() if k != optional_self}, missing))
    return found


def body_for(doc: dict, path: str, method: str) -> tuple[Any, str | None]:
    """A body the operation's schema accepts (its first example, or ``BODIES``), or why there is none."""
    if "requestBody" not in doc["paths"][path][method]:
        return None, None
    _, keys = resolve(doc, ("paths", path, method, "requestBody"))
    schema, schema_keys = resolve(doc, (*keys, "content", "application/json", "schema"))
    name = schema_keys[-1] if schema_keys[:2] == ("components", "schemas") else f"{method.upper()} {path}"
    body = BODIES.get(name) or next(iter(schema.get("examples") or []), None)
    if body is None:
        return None, f"{method.upper()} {path}: no body for {name}; give its schema an example or add one to BODIES"
    errors = list(jsonschema.Draft202012Validator({**schema, "components": doc["components"]}).iter_errors(body))
    if errors:
        return None, f"{method.upper()} {path}: the table's body {body} breaks {name}: {errors[0].message}"
    return body, None


def allowed(operation: dict, caller: Caller, values: dict[str, str]) -> bool:
    """Whether the document lets ``caller`` make this request (``values``: its parameters)."""
    if operation.get("security") == []:
        return True
    if caller.token is None:
        return False
    if operation.get("x-scope") and caller.holds(operation["x-scope"]):
        return True
    course_param = operation.get("x-course-staff")
    self_scope = operation.get("x-self-scope")
    if course_param and caller.course is not None and values.get(course_param) == caller.course:
        return caller.holds(SELF_SCOPE)  # staff act with a token that holds the workbench's self scope
    if not self_scope or not caller.holds(self_scope):
        return False
    own = operation.get("x-self-param")
    return own is None or own not in values or values[own] == caller.name


def is_page(operation: dict) -> bool:
    return "text/html" in ((operation.get("responses", {}).get("200") or {}).get("content") or {})


def verdict(operation: dict, caller: Caller, may: bool, r: requests.Response) -> str | None:
    """None when the answer is what the table expects, else a sentence saying what went wrong."""
    status, text = r.status_code, r.text[:200].replace("\n", " ")
    if may:
        if status in (401, 403) or status >= 500:
            return f"{caller.label} may call it but got {status}: {text}"
        return None
    if caller.token is None and is_page(operation):
        location = r.headers.get("Location", "")
        if status == 302 and urlparse(location).path.startswith("/hub/"):
            return None
        return f"anonymous must be sent to the hub's login but got {status} (Location {location!r}): {text}"
    if status in (401, 403):
        return None
    if status == 405 and not any(code.startswith("2") for code in operation["responses"]):
        return None  # an operation nobody may use answers 405 to everyone
    return f"{caller.label} must be refused but got {status}: {text}"


# -- the document says who may call every operation, and the service serves no route it does not describe --


@pytest.mark.parametrize("backend", ["", *installed_backends()])
def test_every_operation_says_who_may_call_it(backend):
    doc = served_document(backend)
    unsaid = []
    for method, path in sorted(documented(doc)):
        operation = doc["paths"][path][method]
        where = f"{method.upper()} {path}"
        scopes = [operation.get("x-scope"), operation.get("x-self-scope")]
        if operation.get("security") == []:
            continue
        if not operation.get("x-scope"):
            unsaid.append(f"{where}: neither x-scope nor security: []")
        if any(scope and not scope.startswith("custom:workbench:") for scope in scopes):
            unsaid.append(f"{where}: {scopes} are not the workbench's scopes")
        course = operation.get("x-course-staff")
        if course and course not in {p["name"] for p in parameters(doc, path, method) if p["in"] == "path"}:
            unsaid.append(f"{where}: x-course-staff {course!r} is none of its path parameters")
        own = operation.get("x-self-param")
        if own and not operation.get("x-self-scope"):
            unsaid.append(f"{where}: x-self-param {own!r} without x-self-scope")
        if own and own not in {p["name"] for p in parameters(doc, path, method)}:
            unsaid.append(f"{where}: x-self-param {own!r} is none of its parameters")
    assert not unsaid, "\n".join(unsaid)


def test_the_table_covers_every_route_the_hubs_service_serves(table):
    served = table.hub.openapi()
    assert documented(served) == set(OPERATIONS), "the table's rows are not the served document's operations"
    mounted = app_routes(make_app(None, backend=BACKEND))
    assert mounted - documented(served) == set(), "routes the service serves without an operation in its document"


def test_the_callers_hold_the_scopes_the_design_gives_them(table):
    """The premise of the table: the hub grants every user ``custom:workbench:self`` (issue 46's scope
    design), the narrowed token no workbench scope, the admin ``custom:workbench:admin``."""
    held = {caller.label: sorted(caller.scopes & WORKBENCH_SCOPES) for caller in table.callers}
    assert held == {
        "anonymous": [],
        "narrowed token": [],
        "other student": [SELF_SCOPE],
        "student": [SELF_SCOPE],
        "instructor": [SELF_SCOPE],
        "another course's instructor": [SELF_SCOPE],
        "admin": sorted(held["admin"]),
    }
    assert ADMIN_SCOPE in held["admin"]


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m.upper()} {p}" for m, p in OPERATIONS])
def test_each_caller_gets_what_the_document_says(table, method, path):
    hub = table.hub
    doc = hub.openapi()
    operation = doc["paths"][path][method]
    body, problem = body_for(doc, path, method)
    assert problem is None, problem
    failures: list[str] = []
    for row in rows(doc, path, method, table.prepare()):
        failures += row.missing
        if row.missing:
            continue
        table.prepare()
        before = hub_state.snapshot(hub)
        for caller in table.callers:
            may = allowed(operation, caller, row.values)
            r = hub.service(
                method.upper(),
                row.path,
                token=caller.token or False,
                validate=False,
                params=row.query,
                **({"json": body} if body is not None else {}),
            )
            where = f"{method.upper()} {row.path}{'?' + urlencode(row.query) if row.query else ''} as {caller.label}"
            wrong = verdict(operation, caller, may, r)
            if wrong:
                failures.append(f"{where}: {wrong}")
            try:
                check(doc, method, row.path, r.status_code, r.headers.get("Content-Type", ""), r.content)
            except (AssertionError, ValueError) as exc:
                failures.append(f"{where}: an answer the document does not describe: {exc}")
            if not may:
                after = hub_state.snapshot(hub)
                changed = hub_state.changes(before, after)
                if changed:
                    failures.append(f"{where} was refused or should have been, yet changed: " + "; ".join(changed))
                before = after
            else:  # an allowed write changes what the next caller's refusal is compared with
                before = hub_state.snapshot(hub)
    assert not failures, "\n".join(failures)
