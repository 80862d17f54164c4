"""No GET changes anything, on any route we serve or keep (issue 46, item 1): the cross-site request forgery
of a page elsewhere that navigates the admin's browser to ``/hub/authorize/eve``.

Logged in as the hub's admin (the strongest cookie: every GET here is one a forged navigation could
send with it), the test GETs, following redirects as a browser does:

* every route of the workbench service's table (``workbench_hub.service.app.make_app`` for the
  hub's backend, so a new route is walked without a change here), each path parameter filled with
  a real name (the student, their group, a drained GPU, a stored reservation), after the admin's
  browser has logged in to the service through the hub's OAuth;
* every route the hub's authenticator adds (``WorkbenchAuthenticator.get_handlers``: NativeAuthenticator's
  sign-up, login, authorization, discard, e-mail confirmation and password pages, ours where we
  replace them), each route with a parameter once for a fresh pending sign-up and once for a fresh
  authorized student, so one route's change cannot hide another's; and the hub's home page and
  spawn page, which this product renders (its server table, its GPU form).

Around each GET the hub's and the service's state (``hub_state.snapshot``: hub users, groups,
servers, NativeAuthenticator's sign-ups and password hashes, quotas, reservations, drains,
exemptions, GPU leases) must be the same. The e-mail confirmation route (``/hub/confirm/SLUG``)
is walked with a name, which is no slug signed with the hub's secret (those are mailed only where
``allow_self_approval_for`` is set, as it is not here). JupyterHub's own pages (logout, token,
admin) are JupyterHub's, not walked here.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
import requests
from tornado.routing import PathMatches

from tests.integration import hub_state
from tests.integration.sign_ups import admin_session, authorized_student, sign_up
from tests.integration.test_authorization_table import BACKEND, TableHub
from tests.service.conftest import shut_down, start_workbench_hub
from workbench_hub.auth import WorkbenchAuthenticator
from workbench_hub.service.app import make_app

pytestmark = pytest.mark.integration

PARAMETER = re.compile(r"\((?:\[\^/\][*+]|\.\*)\)")  # a tornado route's path parameter: ([^/]+), ([^/]*), (.*)
HUB_PAGES = ["/hub/home", "/hub/spawn"]  # JupyterHub's pages this product renders its own parts of
_fresh = itertools.count(1)


def service_routes(names: dict[str, str]) -> list[str]:
    """Every route of the service's table, its parameters filled with the real name for the segment
    before each (``names``), a static route's with a file it serves, the catch-all with a path nothing
    else serves."""
    paths = []
    for rule in make_app(None, backend=BACKEND).wildcard_router.rules:
        assert isinstance(rule.matcher, PathMatches)
        pattern = rule.matcher.regex.pattern.removesuffix("$")
        parts = PARAMETER.split(pattern)
        path = parts[0]
        for part in parts[1:]:
            segment = path.rstrip("/").rsplit("/", 1)[-1]
            if "path" in rule.target_kwargs:  # tornado's StaticFileHandler: a file of its folder
                folder = Path(rule.target_kwargs["path"])
                path += str(min(p for p in folder.rglob("*") if p.is_file()).relative_to(folder)) + part
                continue
            assert segment in names, f"{pattern}: no real name for the parameter after '{segment}/'; add one"
            path += names[segment] + part
        paths.append(path.replace(".*", "no-such-route"))
    return paths


def hub_routes() -> list[str]:
    """The routes the hub's authenticator adds, under /hub (a parameter left as ``{}``)."""
    authenticator = WorkbenchAuthenticator.__new__(WorkbenchAuthenticator)  # get_handlers needs no database
    return ["/hub" + PARAMETER.sub("{}", path) for path, _ in authenticator.get_handlers(None)]


class Walk:
    """The admin's browser on the hub of the table (two students, a group, a server running, quotas,
    a drain, an exemption, a reservation), and the GETs it sent with what each changed."""

    def __init__(self, table: TableHub):
        self.table = table
        self.hub = table.hub
        self.admin = admin_session(self.hub)
        self.sent: list[str] = []
        self.changed: list[str] = []

    def get(self, path: str) -> requests.Response:
        before = hub_state.snapshot(self.hub)
        r = self.admin.get(f"{self.hub.url}{path}", timeout=30)
        self.sent.append(f"GET {path} -> {r.status_code}")
        changes = hub_state.changes(before, hub_state.snapshot(self.hub))
        if changes:
            self.changed.append(f"GET {path} ({r.status_code}) changed: " + "; ".join(changes))
        return r

    def fresh_names(self) -> list[str]:
        """A new pending sign-up and a new authorized student, for one route with a parameter."""
        n = next(_fresh)
        pending, student = f"walk-pending-{n}", f"walk-student-{n}"
        assert "sent to the admin" in sign_up(self.hub, pending)
        authorized_student(self.admin, self.hub, student)
        return [pending, student]


@pytest.fixture(scope="module")
def walk(tmp_path_factory):
    hub = start_workbench_hub(tmp_path_factory.mktemp("hub") / "hub", {"WORKBENCH_SIMULATED_GPUS": "4"})
    try:
        yield Walk(TableHub(hub))
    finally:
        shut_down(hub)


def test_the_admins_browser_reaches_every_route_it_walks(walk):
    """The premise: the walk is the admin's, logged in to the hub and to the service, so a GET that
    could change something as the admin is sent with the rights to do it."""
    page = walk.admin.get(f"{walk.hub.url}/services/workbench/", timeout=30)
    assert page.status_code == 200, page.text[-1000:]
    assert "/services/workbench/" in page.url
    assert walk.admin.get(f"{walk.hub.url}/services/workbench/api/quotas", timeout=30).status_code == 200
    assert walk.admin.get(f"{walk.hub.url}/hub/authorize", timeout=30).status_code == 200
    assert {"/hub/authorize/{}", "/hub/discard/{}", "/hub/signup", "/hub/change-password"} <= set(hub_routes())


def test_no_get_changes_anything(walk, capsys):
    walk.admin.get(f"{walk.hub.url}/services/workbench/", timeout=30)  # the service's login cookie
    for path in service_routes(walk.table.prepare()):
        walk.get(path)
    for route in [*hub_routes(), *HUB_PAGES]:
        if "{}" not in route:
            walk.get(route)
            continue
        for name in walk.fresh_names():
            walk.get(route.replace("{}", name))
    with capsys.disabled():
        print(f"\n{len(walk.sent)} GETs as the admin (status after redirects):\n" + "\n".join(walk.sent))
    refused = [line for line in walk.sent if line.startswith("GET /services/") and line.endswith(("401", "403"))]
    assert not refused, f"the admin's cookie was refused, so the walk proves nothing there: {refused}"
    assert not walk.changed, "\n".join(walk.changed) + "\n\nevery GET sent:\n" + "\n".join(walk.sent)
