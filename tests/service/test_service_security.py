"""The workbench service against a real hub, as issue 46's security review tried it: the security headers on
every kind of answer, tokens and the OAuth code kept out of its log, a narrowed token refused while the self
scope is enough, and My GPUs (page and api/me) for a student, hostile names escaped. A browser's login,
the hub home page's link and framing are in tests/browser/test_my_gpus_browser.py."""

from __future__ import annotations

import re

import pytest
import requests

from tests.conftest import wait_until
from tests.integration.sign_ups import admin_session
from workbench_spawner.ledger.store import AllocationStore

pytestmark = pytest.mark.integration

HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
HOSTILE = "<img src=x onerror=alert(1)>"
SELF_REFUSAL = (
    "needs the custom:workbench:self scope (or custom:workbench:read), which this login or token does not hold: "
    "use a token with the hub's default scopes (the hub's token page makes one), or ask a hub admin"
)


def token_with(hub, user: str, scopes: list[str]) -> str:
    r = hub.api("POST", f"/users/{user}/tokens", json={"scopes": scopes, "note": "narrowed", "expires_in": 3600})
    assert r.status_code == 201, r.text
    return r.json()["token"]


@pytest.fixture(scope="module")
def hub(workbench_hub):
    workbench_hub.create_users("carol", "alice")
    r = workbench_hub.api("POST", "/groups/ml-course", json={"users": ["carol"]})
    assert r.status_code in (201, 409), r.text
    quota = {"max_gpus": 2, "gpu_hours_per_week": 10}
    assert workbench_hub.service("PUT", "api/quotas/groups/ml-course", json=quota).status_code == 200
    workbench_hub.student = workbench_hub.user_token("carol")
    workbench_hub.narrowed = token_with(workbench_hub, "carol", ["read:users:name!user=carol"])
    return workbench_hub


# -- headers ----------------------------------------------------------------------------------------------------

ANSWERS = [
    # (what, method, path, who, status, media type)
    ("the page, to the hub's login", "GET", "", None, 302, ""),
    ("the fleet page", "GET", "", "admin", 200, "text/html"),
    ("My GPUs", "GET", "me", "student", 200, "text/html"),
    ("the refusal page", "GET", "me", "narrowed", 403, "text/html"),
    ("an API answer", "GET", "api/gpus", "admin", 200, "application/json"),
    ("an API refusal", "DELETE", "api/quotas/users/carol", "student", 403, "application/json"),
    ("an API 404", "GET", "api/quotas/users/nobody", "admin", 404, "application/json"),
    ("the API's catch-all 404", "GET", "api/nothing-here", "admin", 404, "application/json"),
    ("a page no route serves", "GET", "no-such-page", None, 404, "text/html"),
    ("the metrics", "GET", "metrics", "admin", 200, "text/plain"),
    ("the public document", "GET", "api/openapi.json", None, 200, "application/json"),
    ("a script of the pages", "GET", "static/fleet.js", None, 200, "javascript"),
    ("the OAuth callback", "GET", "oauth_callback?code=x&state=y", None, 403, "text/html"),
]


@pytest.mark.parametrize(("what", "method", "path", "who", "status", "media"), ANSWERS, ids=[a[0] for a in ANSWERS])
def test_every_kind_of_answer_carries_the_security_headers(hub, what, method, path, who, status, media):
    token = {"admin": None, "student": hub.student, "narrowed": hub.narrowed, None: False}[who]
    documented = not path.startswith(("static/", "oauth_callback", "no-such-page"))
    r = hub.service(method, path, token=token, validate=documented)
    assert r.status_code == status, (what, r.status_code, r.text[:300])
    assert media in r.headers.get("Content-Type", ""), (what, r.headers.get("Content-Type"))
    assert {name: r.headers.get(name) for name in HEADERS} == HEADERS, what


def test_the_pages_carry_no_inline_script(hub):
    """The CSP runs scripts from the service's files only: an inline one would not run, so there is none."""
    page = hub.service("GET", "").text
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", page, re.S)
    assert scripts, "the fleet page has its scripts"
    assert all('src="/services/workbench/static/' in attributes and not body.strip() for attributes, body in scripts)
    for attributes, _ in scripts:
        src = re.search(r'src="/services/workbench/([^"]+)"', attributes).group(1)
        assert hub.service("GET", src, token=False, validate=False).status_code == 200, src
    assert not re.search(r"<[^>]+\son[a-z]+=", page), "no event handler attributes either"


def test_every_cookie_of_the_service_says_samesite_lax(hub):
    """The OAuth state cookie on the way to the hub's login, then the login's own cookie and the _xsrf one the
    callback sets: a browser sends none of them with another site's forms, frames or scripts' requests."""
    admin = admin_session(hub)
    r = admin.get(f"{hub.url}/services/workbench/", timeout=30)
    assert r.status_code == 200, r.text[-500:]
    assert 'id="workbench-gpu-table"' in r.text
    set_by_service = [
        line
        for answer in r.history
        if "/services/workbench/" in answer.url
        for line in answer.raw.headers.getlist("Set-Cookie")
    ]
    kept = [line for line in set_by_service if not line.split(";", 1)[0].endswith('=""')]  # not a deletion
    assert sorted(line.split("=", 1)[0] for line in kept) == [
        "_xsrf",
        "service-workbench",
        "service-workbench-oauth-state",
    ]
    for line in kept:
        assert "SameSite=Lax" in line, line


# -- the log ----------------------------------------------------------------------------------------------------


def test_tokens_and_the_oauth_code_never_reach_the_log(hub):
    token = hub.user_token("carol")
    url = f"{hub.url}/services/workbench"
    r = requests.get(f"{url}/api/usage?token={token}&_xsrf=xsrf-secret-1&user=carol", timeout=30)
    assert r.status_code == 403, r.text  # a token in the URL is not a login (JupyterHub's default)
    r = requests.get(f"{url}/oauth_callback?code=oauth-code-secret-2&state=oauth-state-secret-3", timeout=30)
    assert r.status_code == 403, r.text  # no state cookie: a login this browser did not start
    # A token sent the right way is not logged either.
    assert requests.get(f"{url}/api/usage", headers={"Authorization": f"token {token}"}, timeout=30).ok
    scrubbed = "GET /services/workbench/api/usage?token=[secret]&_xsrf=[secret]&user=carol"
    wait_until(lambda: scrubbed in hub.log(), 30, "the access log line of the request")
    wait_until(lambda: "oauth_callback?code=[secret]&state=[secret]" in hub.log(), 30, "the callback's log line")
    log = hub.log()
    for secret in (token, "xsrf-secret-1", "oauth-code-secret-2", "oauth-state-secret-3"):
        assert secret not in log, secret
    # Tornado's warning for the refusal names the request by the same scrubbed summary.
    assert re.search(r"403 GET /services/workbench/api/usage\?token=\[secret\]&_xsrf=\[secret\]&user=carol \(", log)


# -- scopes -----------------------------------------------------------------------------------------------------


def test_a_narrowed_token_is_refused_with_the_scope_it_lacks(hub):
    narrowed = hub.narrowed
    before = hub.service("GET", "api/quotas/users/carol").json()
    for path, what in [
        ("api/usage", "reading your own GPU usage"),
        ("api/usage?user=carol", "reading your own GPU usage"),
        ("api/me", "reading your own GPUs (api/me)"),
        ("api/quotas/users/carol", "reading your own GPU quota"),
    ]:
        r = hub.service("GET", path, token=narrowed)
        assert r.status_code == 403, (path, r.text)
        assert r.json()["message"] == f"{what} {SELF_REFUSAL}", path
    for path in ("", "me"):
        page = hub.service("GET", path, token=narrowed)
        assert page.status_code == 403, path
        assert (
            f"opening {'My GPUs' if path else 'the GPU Workbench pages'} {SELF_REFUSAL}".replace("'", "&#39;")
            in page.text
        )
        assert "alice" not in page.text
    # Nothing else opens for it either.
    for path in ("api/gpus", "api/quotas/users/alice", "metrics"):
        assert hub.service("GET", path, token=narrowed).status_code == 403, path
    assert hub.service("GET", "api/quotas/users/carol").json() == before


def test_the_self_scope_alone_reads_only_ones_own(hub):
    only_self = token_with(hub, "carol", ["custom:workbench:self"])
    for path in ("api/usage", "api/me", "api/quotas/users/carol", "me", ""):
        r = hub.service("GET", path, token=only_self)
        assert r.status_code == 200, (path, r.text[:300])
    assert hub.service("GET", "api/me", token=only_self).json()["name"] == "carol"
    for path in ("api/quotas/users/alice", "api/usage?user=alice", "api/gpus", "api/usage?group=ml-course"):
        r = hub.service("GET", path, token=only_self)
        assert r.status_code == 403, (path, r.text)
        assert "custom:workbench:read" in r.json()["message"], path
    # Filtered as JupyterHub filters scopes: for carol herself it counts, for another user it does not.
    own = token_with(hub, "carol", ["custom:workbench:self!user=carol"])
    assert hub.service("GET", "api/me", token=own).status_code == 200
    elsewhere = token_with(hub, "carol", ["custom:workbench:self!group=nobodys-group"])
    r = hub.service("GET", "api/me", token=elsewhere)
    assert r.status_code == 403
    assert SELF_REFUSAL in r.json()["message"]


def test_every_user_holds_the_self_scope_and_may_open_the_service(hub):
    """The hub's grants the service relies on: the redefined user role."""
    r = requests.get(f"{hub.url}/hub/api/user", headers={"Authorization": f"token {hub.student}"}, timeout=30)
    scopes = set(r.json()["scopes"])
    assert "custom:workbench:self" in scopes
    assert "access:services!service=workbench" in scopes
    assert not {"custom:workbench:read", "custom:workbench:admin"} & scopes


# -- My GPUs ----------------------------------------------------------------------------------------------------


def test_my_gpus_shows_a_students_quota_hours_servers_and_stops_escaped(hub):
    assert hub.spawn("carol", gpus=1).status_code in (201, 202)
    hub.wait_ready("carol")
    held = hub.leases()["carol"]
    assert len(held) == 1
    # A past server with a hostile name (JupyterHub 6 refuses such names, older hubs kept them) and a
    # hostile sentence, written to the ledger as the spawner writes an end.
    store = AllocationStore(f"sqlite:///{hub.data_dir / 'workbench.sqlite'}")
    try:
        free = "GPU-sim-03-a100-40gb"
        assert free not in held
        assert store.allocate("carol", HOSTILE, 1, [free]) is not None
        store.release("carol", HOSTILE, "reclaimed: GPU idle 30 min", message=f"Stopped: {HOSTILE}<script>x()</script>")
    finally:
        store.dispose()

    me = hub.service("GET", "api/me", token=hub.student)
    assert me.status_code == 200, me.text
    data = me.json()
    assert data["name"] == "carol"
    assert data["groups"] == ["ml-course"]
    assert data["simulated"] is True
    assert data["quota"]["origin"] == "from group ml-course"
    assert (data["quota"]["max_gpus"], data["quota"]["gpu_hours_per_week"]) == (2, 10.0)
    assert data["held_gpus"] == 1
    assert 0 < data["gpu_hours_week"] < 1
    assert data["gpu_hours_left"] == pytest.approx(10 - data["gpu_hours_week"], abs=1e-3)
    [server] = data["servers"]
    assert (server["name"], server["label"], server["state"]) == ("", "default server", "running")
    assert server["url"] == "/user/carol/"
    [gpu] = server["gpus"]
    assert gpu["uuid"] == held[0]
    assert gpu["label"] in ("H100-80GB (GPU 0)", "H100-80GB (GPU 1)", "A100-40GB (GPU 2)"), gpu
    assert gpu["simulated"] is True
    stop = data["stops"][0]
    assert (stop["server"], stop["reason"], stop["kind"]) == (HOSTILE, "reclaimed: GPU idle 30 min", "reclaimed")
    assert stop["message"] == f"Stopped: {HOSTILE}<script>x()</script>"
    assert data["ends_by_reason"] == {"reclaimed": 1}
    assert {s["user"] for s in data["stops"]} == {"carol"}, "only her own stops"

    page = hub.service("GET", "me", token=hub.student)
    assert page.status_code == 200
    text = page.text
    assert "<img src=x" not in text
    assert "<script>x()" not in text
    assert "&lt;img src=x onerror=alert(1)&gt;" in text
    assert "Stopped: &lt;img src=x onerror=alert(1)&gt;&lt;script&gt;x()&lt;/script&gt;" in text
    assert '<small class="text-muted" id="my-quota-origin">(from group ml-course)</small>' in text
    assert re.search(r"[0-9.]+ of 10 GPU-hours used; [0-9.]+ left\.", text)
    assert f'data-uuid="{held[0]}">{gpu["label"]}' in text
    assert '<span class="badge text-bg-warning">simulated</span>' in text
    assert 'id="my-simulated-note"' in text
    # Nobody else's data on it, and the front page is the same page for her.
    assert "alice" not in text
    assert 'id="my-quota"' in hub.service("GET", "", token=hub.student).text
    hub.api("DELETE", "/users/carol/server")
    hub.wait_stopped("carol")
