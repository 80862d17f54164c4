"""The workbench service against a real hub: its REST API, scopes, bad input and quotas at spawn."""

from __future__ import annotations

import re
import time
from urllib.parse import quote

import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.integration

GOOD = {"max_gpus": 2, "gpu_hours_per_week": 10, "allowed_models": ["H100-80GB"], "max_session_hours": 8}


@pytest.fixture(scope="module")
def hub(workbench_hub):
    workbench_hub.create_users("alice", "bob", "carol", "dave", "erin")
    r = workbench_hub.api("POST", "/groups/ml-course", json={"users": ["bob"]})
    assert r.status_code in (201, 409), r.text
    workbench_hub.student = workbench_hub.user_token("carol")
    return workbench_hub


def quota_of(hub, kind: str, name: str):
    r = hub.service("GET", f"api/quotas/{kind}/{quote(name, safe='')}")
    assert r.status_code == 200, r.text
    return r.json()["quota"]


def test_set_read_and_delete_a_user_quota(hub):
    r = hub.service("PUT", "api/quotas/users/alice", json=GOOD)
    assert r.status_code == 200, r.text
    body = r.json()
    assert {k: body["quota"][k] for k in GOOD} == {**GOOD, "gpu_hours_per_week": 10.0, "max_session_hours": 8.0}
    assert body["effective"]["origin"] == "own quota"
    assert body["quota"]["updated_by"] == "service:workbench-admin"
    listing = hub.service("GET", "api/quotas").json()
    assert [q["name"] for q in listing["users"]] == ["alice"]
    assert listing["default"]["max_gpus"] == 1
    r = hub.service("DELETE", "api/quotas/users/alice")
    assert r.status_code == 204
    assert quota_of(hub, "users", "alice") is None
    assert hub.service("GET", "api/quotas/users/alice").json()["effective"]["origin"] == "default"


def test_group_quota_reaches_its_members_and_shows_where_it_comes_from(hub):
    r = hub.service("PUT", "api/quotas/groups/ml-course", json={"max_gpus": 2})
    assert r.status_code == 200, r.text
    assert r.json()["users"] == ["bob"]
    bob = hub.service("GET", "api/quotas/users/bob").json()["effective"]
    assert bob["max_gpus"] == 2
    assert bob["origin"] == "from group ml-course"
    usage = hub.service("GET", "api/usage?user=bob").json()["users"][0]
    assert usage["quota"]["origin"] == "from group ml-course"


# Refused by the document's QuotaBody (the sentence names the field and the rule), or by the inventory.
BAD_BODIES = [
    ({"max_gpus": -1}, "invalid quota: max_gpus must be between 0 and 1024, not -1"),
    ({"max_gpus": 1.5}, "max_gpus must be a whole number, not 1.5"),
    ({"max_gpus": 10**15}, "max_gpus must be between 0 and 1024"),
    ({"max_gpus": "two"}, "max_gpus must be a whole number"),
    ({"max_gpus": None}, "max_gpus must be a whole number, not null"),
    ({}, "max_gpus is missing"),
    ({"max_gpus": 1, "gpu_hours_per_week": -5}, "gpu_hours_per_week must be between 0 and 1000000, not -5"),
    ({"max_gpus": 1, "gpu_hours_per_week": "lots"}, "gpu_hours_per_week must be a number"),
    ({"max_gpus": 1, "allowed_models": ["V100"]}, "unknown GPU model"),
    ({"max_gpus": 1, "allowed_models": ["<img src=x onerror=alert(1)>"]}, "allowed_models[0] must be a GPU model name"),
    ({"max_gpus": 1, "max_session_hours": -1}, "max_session_hours must be between 0.01 and 8784, not -1"),
    ({"max_gpus": 1, "max_session_hours": 1e-130}, "max_session_hours must be between 0.01 and 8784, not 1e-130"),
    ({"max_gpus": 1, "gpu_idle_minutes": 0.01}, "gpu_idle_minutes must be 0 or between 0.05 and 10080"),
    ({"max_gpus": 1, "is_admin": True}, "unknown field 'is_admin'; a quota has max_gpus"),
    ([{"max_gpus": 1}], "the body must be a JSON object"),
]


@pytest.mark.parametrize(("kind", "name"), [("users", "dave"), ("groups", "ml-course")])
@pytest.mark.parametrize(("body", "message"), BAD_BODIES)
def test_bad_quotas_are_400_and_change_nothing(hub, kind, name, body, message):
    before = quota_of(hub, kind, name)
    r = hub.service("PUT", f"api/quotas/{kind}/{name}", json=body)
    assert r.status_code == 400, r.text
    assert r.headers["Content-Type"].startswith("application/json")
    assert message in r.json()["message"]
    assert quota_of(hub, kind, name) == before


@pytest.mark.parametrize("raw", ["{max_gpus: 1", "", "NaN", '{"max_gpus": NaN}', b"\xff\xfe"])
def test_malformed_json_is_400(hub, raw):
    before = quota_of(hub, "users", "dave")
    r = hub.service("PUT", "api/quotas/users/dave", data=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["message"]
    assert quota_of(hub, "users", "dave") == before


@pytest.mark.parametrize("kind", ["users", "groups"])
@pytest.mark.parametrize("name", ["nobody", "<script>alert(1)</script>", "../admin", "a/b", "x" * 300, "bob\"'&"])
def test_unknown_and_odd_names_are_404_as_json(hub, kind, name):
    path = f"api/quotas/{kind}/{quote(name, safe='')}"
    for method in ("GET", "PUT", "DELETE"):
        r = hub.service(method, path, json={"max_gpus": 1} if method == "PUT" else None)
        assert r.status_code == 404, (method, r.text)
        assert r.headers["Content-Type"].startswith("application/json")
        message = r.json()["message"]
        assert message.startswith("no ")
        assert "<" not in r.text
        assert ">" not in r.text
    listing = hub.service("GET", "api/quotas").json()
    assert name not in [q["name"] for q in listing["users"] + listing["groups"]]


def test_missing_or_wrong_auth_is_403(hub):
    before = quota_of(hub, "users", "dave")
    for token in (False, "not-a-token"):
        for method, path in [
            ("GET", "api/gpus"),
            ("PUT", "api/quotas/users/dave"),
            ("GET", "api/usage"),
            ("GET", "metrics"),
            ("DELETE", "api/quotas/users/dave"),
        ]:
            r = hub.service(method, path, token=token, json={"max_gpus": 0} if method == "PUT" else None)
            assert r.status_code == 403, (token, method, path, r.text)
            assert "authentication required" in r.json()["message"]
    # A cookie without the XSRF token is no login either.
    r = hub.service(
        "PUT",
        "api/quotas/users/dave",
        token=False,
        json={"max_gpus": 0},
        cookies={"jupyterhub-services-workbench": "forged"},
    )
    assert r.status_code == 403
    assert quota_of(hub, "users", "dave") == before
    # The page sends browsers to the hub's login instead.
    r = hub.service("GET", "", token=False)
    assert r.status_code == 302
    assert "/hub/api/oauth2/authorize" in r.headers["Location"]


def test_a_student_cannot_change_or_list_but_reads_own_usage_and_quota(hub):
    student = hub.student
    before = quota_of(hub, "users", "carol")
    for method, path in [
        ("PUT", "api/quotas/users/carol"),
        ("DELETE", "api/quotas/users/carol"),
        ("PUT", "api/quotas/groups/ml-course"),
    ]:
        r = hub.service(method, path, token=student, json={"max_gpus": 4} if method == "PUT" else None)
        assert r.status_code == 403, r.text
        assert "only hub admins may change quotas" in r.json()["message"]
    for path in ("api/gpus", "api/allocations", "api/quotas", "api/quotas/users/alice", "metrics"):
        r = hub.service("GET", path, token=student)
        assert r.status_code == 403, (path, r.text)
        assert "custom:workbench:read" in r.json()["message"]
    assert quota_of(hub, "users", "carol") == before
    # Their own quota, with custom:workbench:self (the hub's user role).
    own_quota = hub.service("GET", "api/quotas/users/carol", token=student)
    assert own_quota.status_code == 200, own_quota.text
    assert own_quota.json()["effective"]["origin"] == "default"
    own = hub.service("GET", "api/usage", token=student)
    assert own.status_code == 200
    assert [u["name"] for u in own.json()["users"]] == ["carol"]
    assert hub.service("GET", "api/usage?user=carol", token=student).status_code == 200
    other = hub.service("GET", "api/usage?user=alice", token=student)
    assert other.status_code == 403
    assert "only your own usage" in other.json()["message"]
    # The front page is their My GPUs, escaped, without anyone else's data.
    page = hub.service("GET", "", token=student)
    assert page.status_code == 200
    assert 'id="my-quota"' in page.text
    assert "alice" not in page.text


def test_quotas_are_enforced_at_spawn_and_changes_never_kill_running_work(hub):
    assert hub.service("PUT", "api/quotas/users/alice", json={"max_gpus": 0}).status_code == 200
    r = hub.spawn("alice", gpus=1)
    assert r.status_code == 403, r.text
    message = r.json()["message"]
    assert "your own GPU quota allows 0 at once" in message
    assert "ask a hub admin" in message
    assert hub.leases().get("alice") is None

    # A group quota: bob (ml-course, 2 GPUs) may take two; only allowed models.
    assert (
        hub.service(
            "PUT", "api/quotas/groups/ml-course", json={"max_gpus": 2, "allowed_models": ["A100-40GB"]}
        ).status_code
        == 200
    )
    r = hub.spawn("bob", gpus=1, gpu_model="H100-80GB")
    assert r.status_code == 403
    assert "allows only these GPU models: A100-40GB" in r.json()["message"]
    assert hub.spawn("bob", gpus=2).status_code in (201, 202)
    hub.wait_ready("bob")
    assert hub.leases()["bob"] == ["GPU-sim-02-a100-40gb", "GPU-sim-03-a100-40gb"]
    inventory = hub.service("GET", "api/gpus").json()
    node = inventory["node"]
    assert node
    assert all(g["node"] == node for g in inventory["gpus"])
    gpus = {g["uuid"]: g for g in inventory["gpus"]}
    assert gpus["GPU-sim-02-a100-40gb"]["holders"][0]["user"] == "bob"
    allocations = hub.service("GET", "api/allocations").json()["allocations"]
    assert [(a["user"], a["node"]) for a in allocations] == [("bob", node)]
    metrics = hub.service("GET", "metrics").text
    # Read as Prometheus reads it: a sample's labels, in whatever order the exposition writes them.
    samples = [s for family in text_string_to_metric_families(metrics) for s in family.samples]
    util = [s.labels for s in samples if s.name == "DCGM_FI_DEV_GPU_UTIL" and s.labels.get("gpu") == "2"]
    assert len(util) == 1, util
    assert util[0]["UUID"] == "GPU-sim-02-a100-40gb", util
    assert util[0]["Hostname"] == node, util
    assert util[0]["user"] == "bob", util
    names = {s.name for s in samples}
    assert "DCGM_FI_DEV_FB_USED" in names
    assert "DCGM_FI_DEV_FB_FREE" in names

    # Lowering bob's quota does not touch his running server.
    assert hub.service("PUT", "api/quotas/groups/ml-course", json={"max_gpus": 0}).status_code == 200
    time.sleep(1)
    assert hub.server("bob")["ready"]
    assert len(hub.leases()["bob"]) == 2
    usage = hub.service("GET", "api/usage?user=bob").json()["users"][0]
    assert usage["held_gpus"] == 2
    assert usage["gpu_hours_week"] > 0

    # An exhausted GPU-hours budget: refused, CPU still fine.
    assert (
        hub.service("PUT", "api/quotas/users/alice", json={"max_gpus": 1, "gpu_hours_per_week": 0}).status_code == 200
    )
    r = hub.spawn("alice", gpus=1)
    assert r.status_code == 403
    assert "0 GPU-hours per week" in r.json()["message"]
    hub.api("DELETE", "/users/bob/server")
    hub.wait_stopped("bob")


def test_over_long_sessions_are_stopped_by_the_service(hub):
    # 0.01 h = 36 s, the shortest limit; the service checks every second in this hub.
    assert (
        hub.service("PUT", "api/quotas/users/erin", json={"max_gpus": 1, "max_session_hours": 0.01}).status_code == 200
    )
    assert hub.spawn("erin", gpus=1).status_code in (201, 202)
    hub.wait_ready("erin")
    hub.wait_stopped("erin", timeout=90)
    assert hub.leases().get("erin") is None
    assert "ran longer than its 0.01-hour session limit" in hub.log()


METHODS = ("get", "put", "delete", "post", "patch")


def fill_path(path: str) -> str:
    """A documented path with a name for each parameter: a user, a group or course, else an id."""
    values = {"name": "dave" if "users" in path else "ml-course", "user": "dave", "course": "ml-course"}
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), "1"), path)


def test_every_documented_route_is_served_and_nothing_else_is(hub):
    """Both ways, against the live service: each documented path and method answers as documented (not the
    catch-all's 404); each method the document does not name for a path is 405; an undocumented path is the
    catch-all's 404. (That every mounted route is documented is checked on the app: test_openapi_document.)"""
    doc = hub.service("GET", "api/openapi.json", token=False).json()
    assert doc["openapi"].startswith("3.1")
    assert doc["servers"] == [{"url": "/services/workbench"}]
    posted = False
    for path, item in doc["paths"].items():
        for method in METHODS:
            concrete = fill_path(path).lstrip("/")
            if method not in item:
                r = hub.service(method.upper(), concrete, json={} if method in ("put", "post", "patch") else None)
                assert r.status_code == 405, (method, path, r.status_code, r.text)
                continue
            if method == "post" and path == "/api/reservations":
                check_posting_a_reservation(hub, item["post"])
                posted = True
                continue
            body = {"max_gpus": 1} if method in ("put", "post") else None
            r = hub.service(method.upper(), concrete, json=body)
            # A route's own 404 names what is missing ("no reservation with id ml-course", a node it does not
            # know); only the catch-all's 404, for a path no route serves, points to openapi.json.
            own_404 = r.status_code == 404 and "openapi.json" not in r.text
            assert r.status_code != 404 or own_404, (method, path, r.status_code, r.text)
            assert r.status_code < 500, (method, path, r.status_code, r.text)
            assert str(r.status_code) in item[method]["responses"] or (path == "/" and r.status_code == 200), (
                method,
                path,
                r.status_code,
            )
    assert posted, "POST api/reservations is in the document"
    # An unknown API path is a JSON 404.
    r = hub.service("GET", "api/nothing-here")
    assert r.status_code == 404
    assert "openapi.json" in r.json()["message"]


def check_posting_a_reservation(hub, operation: dict) -> None:
    """The documented 201 and 400 of POST api/reservations, each answer validated by hub.service()."""
    from datetime import date, timedelta

    day = (date.today() + timedelta(days=30)).isoformat()  # a one-off window no test of this module is in
    before = hub.service("GET", "api/reservations").json()["reservations"]
    good = {"group": "ml-course", "gpus": 1, "window": f"{day} 10:00-12:00", "grace_minutes": 5}
    for body in ({**good, "gpus": 0}, {**good, "window": "someday"}, {**good, "gpus": 99}, "not json"):
        kwargs = {"data": body} if isinstance(body, str) else {"json": body}
        r = hub.service("POST", "api/reservations", **kwargs)
        assert r.status_code == 400, (body, r.status_code, r.text)
        assert "400" in operation["responses"], (body, r.status_code, r.text)
    assert hub.service("GET", "api/reservations").json()["reservations"] == before, "a refusal stores nothing"
    r = hub.service("POST", "api/reservations", json=good)
    assert r.status_code == 201, r.text
    assert "201" in operation["responses"], r.text
    created = r.json()
    assert created["group"] == "ml-course"
    assert created["gpus"] == 1
    assert hub.service("DELETE", f"api/reservations/{created['id']}").status_code == 204
    assert hub.service("GET", "api/reservations").json()["reservations"] == before


def test_the_cli_sets_shows_and_deletes_quotas(hub):
    r = hub.cli("quota", "set", "dave", "--max-gpus", "2", "--gpu-hours-per-week", "10", "--models", "H100-80GB")
    assert r.returncode == 0, r.stderr
    assert "Set the quota of user dave: 2 GPU(s) at once, 10 GPU-hours/week, models H100-80GB" in r.stdout
    assert quota_of(hub, "users", "dave")["max_gpus"] == 2
    r = hub.cli("quota", "show", "dave")
    assert r.returncode == 0
    assert "effective: 2 GPU(s) at once" in r.stdout
    assert "(own quota)" in r.stdout
    r = hub.cli("quota", "set-group", "ml-course", "--max-gpus", "1", "--max-session-hours", "4")
    assert r.returncode == 0
    assert "sessions up to 4 h" in r.stdout
    listing = hub.cli("quota", "show").stdout
    assert "group ml-course" in listing
    assert f"database: sqlite:///{hub.data_dir / 'workbench.sqlite'}" in listing
    assert "GPU models on " in listing
    assert "A100-40GB, H100-80GB" in listing
    r = hub.cli("quota", "set", "dave", "--max-gpus", "1", "--models", "V100")
    assert r.returncode == 1
    assert 'unknown GPU model "V100"; this hub has: A100-40GB, H100-80GB' in r.stderr
    # Errors: a readable message on stderr and a non-zero exit code; nothing changes.
    r = hub.cli("quota", "set", "dave", "--max-gpus", "-3")
    assert r.returncode == 1
    assert "max_gpus must be between 0 and 1024, not -3" in r.stderr
    r = hub.cli("quota", "set", "nobody", "--max-gpus", "1")
    assert r.returncode == 1
    assert "no user named" in r.stderr
    assert "/hub/signup" in r.stderr
    r = hub.cli("quota", "set", "dave", "--max-gpus", "lots")
    assert r.returncode == 2
    assert "not a whole number" in r.stderr
    r = hub.cli("quota", "set", "dave", "--max-gpus", "1", token=hub.student)
    assert r.returncode == 1
    assert "only hub admins" in r.stderr
    r = hub.cli("quota", "show", "dave", token="")
    assert r.returncode == 2
    assert "no token" in r.stderr
    assert quota_of(hub, "users", "dave")["max_gpus"] == 2
    r = hub.cli("quota", "delete", "dave")
    assert r.returncode == 0
    assert quota_of(hub, "users", "dave") is None
    assert hub.cli("quota", "delete-group", "ml-course").returncode == 0
