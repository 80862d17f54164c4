"""The workbench service without a hub: its answers match its OpenAPI document (the document itself
and its routes are checked in test_openapi_document), its page escapes what it shows, its metrics are
valid Prometheus text, and it reads the policy settings the hub stored (503 with a sentence before
there are any)."""

from __future__ import annotations

import asyncio
import json
import socket
from importlib.resources import files

import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tornado.httpclient import AsyncHTTPClient

from tests.service.openapi_check import check
from workbench_devices import DeviceInventory, GPUDevice, discover_devices
from workbench_hub.service import handlers
from workbench_hub.service.app import make_app
from workbench_hub.service.fleet import NO_SETTINGS, Fleet, SettingsMissingError
from workbench_hub.service.handlers import _jinja
from workbench_hub.service.metrics import render_metrics
from workbench_spawner.policy.settings import PolicySettings, store_policy_settings
from workbench_spawner.rules.quota import Quota

PREFIX = "/services/workbench/"


def service_document() -> dict:
    """The document the service serves (the app's; the route and validity checks are in test_openapi_document)."""
    return make_app(fleet=None, prefix=PREFIX).settings["openapi"]


def settings_for(url: str, spec: str = "2", node: str = "gpu-node-7", default: int = 1) -> PolicySettings:
    return PolicySettings(url, discover_devices(spec), servers_per_gpu=1, default_quota=Quota(default), node=node)


def test_answers_validate_against_the_document(store):
    doc = service_document()
    fleet = Fleet(store, settings_for(store.url))
    store.allocate("alice", "", 1, [d.uuid for d in fleet.inventory.devices], node="gpu-node-7")
    inventory = {"node": fleet.node, "source": "simulated", "simulated": True, "message": "", "gpus": fleet.gpus()}
    check(doc, "GET", "api/gpus", 200, "application/json", json.dumps(inventory).encode())
    allocations = {"node": fleet.node, "allocations": fleet.allocations()}
    assert allocations["allocations"][0]["node"] == "gpu-node-7"
    check(doc, "GET", "api/allocations", 200, "application/json", json.dumps(allocations).encode())
    stored = fleet.book.set("user", "alice", Quota(2, 10.0, ("H100-80GB",), 4.0), by="user:admin")
    view = {
        "kind": "user",
        "name": "alice",
        "quota": stored.to_json(),
        "effective": fleet.book.effective("alice", [], fleet.default).to_json(),
    }
    check(doc, "PUT", "api/quotas/users/alice", 200, "application/json", json.dumps(view).encode())
    listing = {
        "default": fleet.default.to_json(),
        "models": fleet.models(),
        "node": fleet.node,
        "users": [stored.to_json()],
        "groups": [],
    }
    check(doc, "GET", "api/quotas", 200, "application/json", json.dumps(listing).encode())
    error = {"status": 404, "message": 'no user named "x" on this hub'}
    check(doc, "GET", "api/quotas/users/x", 404, "application/json", json.dumps(error).encode())
    with pytest.raises(jsonschema.ValidationError):
        check(doc, "GET", "api/quotas", 200, "application/json", json.dumps({"default": {}}).encode())
    with pytest.raises(AssertionError, match="not documented"):
        check(doc, "GET", "api/gpus", 418, "application/json", b"{}")


EVIL = '<img src=x onerror="alert(1)">'


def test_the_admin_page_escapes_names():
    inventory = discover_devices("1")
    html = _jinja.get_template("admin.html").render(
        prefix=PREFIX,
        hub_prefix="/hub/",
        caller={"name": EVIL},
        admin=True,
        inventory=inventory,
        node=EVIL,
        simulated=True,
        gpus=[
            {
                "index": 0,
                "uuid": EVIL,
                "name": EVIL,
                "model": "x",
                "memory_total_bytes": 0,
                "holders": [{"user": EVIL, "server": EVIL, "since": "2026-12-02T10:00:00"}],
                "utilization_percent": None,
                "memory_used_bytes": None,
            }
        ],
        users=[
            {
                "name": EVIL,
                "groups": [EVIL],
                "held_gpus": 0,
                "gpu_hours_week": 0.0,
                "quota": {
                    "max_gpus": 1,
                    "gpu_hours_per_week": None,
                    "allowed_models": [EVIL],
                    "max_session_hours": None,
                    "origin": f"from group {EVIL}",
                },
            }
        ],
        groups=[{"name": EVIL, "users": [EVIL], "quota": None}],
        default={"max_gpus": 1, "gpu_hours_per_week": None, "allowed_models": None, "max_session_hours": None},
        models=[EVIL],
        xsrf='"</script><script>alert(1)</script>',
    )
    assert "<img" not in html
    assert "</script><script>" not in html
    assert "&lt;img src=x onerror=" in html


def test_metrics_are_prometheus_text_with_dcgm_names(store):
    fleet = Fleet(store, settings_for(store.url, default=2))
    store.allocate('al"ice', "", 1, [d.uuid for d in fleet.inventory.devices])
    fleet.book.set("group", "ml", Quota(3))
    text = render_metrics(fleet, [{"name": 'al"ice', "groups": []}, {"name": "bob", "groups": ["ml"]}])
    # Read as Prometheus reads it (label order is not part of the format).
    families = {f.name: f for f in text_string_to_metric_families(text)}
    util = {s.labels["UUID"]: s.labels for s in families["DCGM_FI_DEV_GPU_UTIL"].samples}
    first = util["GPU-sim-00-h100-80gb"]
    assert set(first) == {"gpu", "UUID", "modelName", "Hostname", "user", "simulated"}
    assert first["gpu"] == "0"
    assert first["Hostname"] == "gpu-node-7"
    assert first["simulated"] == "true"
    assert 'al"ice' in {labels["user"] for labels in util.values()}
    quotas = {s.labels["user"]: s.value for s in families["workbench_user_quota_max_gpus"].samples}
    assert quotas == {"bob": 3.0, 'al"ice': 2.0}
    for name in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "workbench_gpus_free", "workbench_user_gpus_held"):
        assert families[name].type == "gauge", name


def test_the_fleet_reads_the_settings_the_hub_stored_and_notices_a_change(store):
    fleet = Fleet(store, refresh_seconds=0)
    with pytest.raises(SettingsMissingError, match="has not published its GPU settings yet"):
        fleet.inventory  # noqa: B018
    static = DeviceInventory(
        "static",
        [GPUDevice("GPU-static-1", 0, "NVIDIA L4", 24 << 30, "L4-24GB")],
        "1 GPU(s) from the static_gpus setting",
    )
    store_policy_settings(
        store, PolicySettings(store.url, static, servers_per_gpu=3, default_quota=Quota(2), node="head-1")
    )
    assert fleet.default == Quota(2)
    assert fleet.gpus()[0]["slots"] == 3
    assert fleet.node == "head-1"
    assert [g["uuid"] for g in fleet.gpus()] == ["GPU-static-1"]
    assert fleet.models() == ["L4-24GB"]
    assert fleet.gpus()[0]["utilization_percent"] is None  # static GPUs cannot be read by the hub
    store_policy_settings(store, settings_for(store.url, spec="3", node="head-2", default=4))
    assert fleet.default == Quota(4)
    assert len(fleet.gpus()) == 3
    assert fleet.node == "head-2"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_the_api_answers_503_with_a_sentence_until_the_hub_stored_its_settings(store, monkeypatch):
    monkeypatch.setattr(handlers, "SETTINGS_WAIT_SECONDS", 0.3)
    monkeypatch.setattr(
        handlers.WorkbenchHandler,
        "get_current_user",
        lambda self: {"kind": "user", "name": "admin", "scopes": [handlers.ADMIN_SCOPE]},
    )
    fleet = Fleet(store, refresh_seconds=0)
    port = _free_port()
    server = make_app(fleet, None, PREFIX).listen(port, "127.0.0.1")
    doc = service_document()
    client = AsyncHTTPClient()
    try:
        for path in ("api/gpus", "api/allocations", "api/quotas", "metrics"):
            r = await client.fetch(f"http://127.0.0.1:{port}{PREFIX}{path}", raise_error=False)
            assert r.code == 503, (path, r.body)
            assert json.loads(r.body) == {"status": 503, "message": NO_SETTINGS}
            check(doc, "GET", path, r.code, r.headers["Content-Type"], r.body)
        store_policy_settings(store, settings_for(store.url))
        r = await client.fetch(f"http://127.0.0.1:{port}{PREFIX}api/gpus", raise_error=False)
        assert r.code == 200
        assert json.loads(r.body)["node"] == "gpu-node-7"
        check(doc, "GET", "api/gpus", r.code, r.headers["Content-Type"], r.body)
    finally:
        server.stop()


# -- quotas by kind (MIG): the REST round trip and the CLI ----------------------------------------------


class FakeHub:
    """The hub's API as the quota handlers ask it: every user and group exists."""

    async def user(self, name: str) -> dict:
        return {"name": name, "groups": []}

    async def group(self, name: str) -> dict:
        return {"name": name, "users": []}


@pytest.fixture
async def live_service(store, monkeypatch):
    monkeypatch.setattr(
        handlers.WorkbenchHandler,
        "get_current_user",
        lambda self: {"kind": "user", "name": "admin", "scopes": [handlers.ADMIN_SCOPE]},
    )
    store_policy_settings(store, settings_for(store.url))
    port = _free_port()
    server = make_app(Fleet(store, refresh_seconds=0), FakeHub(), PREFIX).listen(port, "127.0.0.1")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


async def test_the_kind_parts_of_a_quota_round_trip_through_the_api(live_service, store):
    doc = service_document()
    client = AsyncHTTPClient()

    async def put(path: str, body) -> tuple[int, dict]:
        r = await client.fetch(f"{live_service}{PREFIX}{path}", method="PUT", body=json.dumps(body), raise_error=False)
        check(doc, "PUT", path, r.code, r.headers["Content-Type"], r.body)
        return r.code, json.loads(r.body)

    code, view = await put(
        "api/quotas/users/alice", {"max_gpus": 1, "whole_gpus": False, "allowed_profiles": ["1G.18GB"]}
    )
    assert code == 200, view
    assert (view["quota"]["whole_gpus"], view["quota"]["allowed_profiles"]) == (False, ["1g.18gb"])
    assert (view["effective"]["whole_gpus"], view["effective"]["allowed_profiles"]) == (False, ["1g.18gb"])
    r = await client.fetch(f"{live_service}{PREFIX}api/quotas/users/alice")
    check(doc, "GET", "api/quotas/users/alice", r.code, r.headers["Content-Type"], r.body)
    assert json.loads(r.body)["quota"]["allowed_profiles"] == ["1g.18gb"]
    code, view = await put("api/quotas/groups/research", {"max_gpus": 4, "allowed_profiles": []})
    assert code == 200
    assert (view["quota"]["whole_gpus"], view["quota"]["allowed_profiles"]) == (True, [])
    code, view = await put("api/quotas/groups/thesis", {"max_gpus": 1, "shared_gpus": False})
    assert code == 200
    assert (view["quota"]["shared_gpus"], view["quota"]["whole_gpus"]) == (False, True)
    code, error = await put("api/quotas/groups/thesis", {"max_gpus": 1, "shared_gpus": "no"})
    assert code == 400, error
    assert "shared_gpus" in error["message"], error
    assert Fleet(store, refresh_seconds=0).book.get("group", "thesis").quota == Quota(1, shared_gpus=False)
    # Refused bodies are a sentence each, and change nothing.
    code, error = await put("api/quotas/users/alice", {"max_gpus": 1, "allowed_profiles": ["1x.5gb"]})
    assert (code, error["message"]) == (
        400,
        "invalid quota: allowed_profiles: '1x.5gb' is not a MIG profile; profiles read like 1g.18gb or 3g.71gb",
    )
    code, error = await put("api/quotas/users/alice", {"max_gpus": 1, "whole_gpus": False, "allowed_profiles": []})
    assert code == 400
    assert "allows neither whole GPUs nor any MIG slice" in error["message"]
    stored = Fleet(store, refresh_seconds=0).book.get("user", "alice").quota
    assert stored == Quota(1, whole_gpus=False, allowed_profiles=("1g.18gb",))
    # A body without the kind parts gets their defaults.
    code, view = await put("api/quotas/users/alice", {"max_gpus": 1})
    assert (view["quota"]["whole_gpus"], view["quota"]["allowed_profiles"], view["quota"]["shared_gpus"]) == (
        True,
        None,
        True,
    )
    r = await client.fetch(f"{live_service}{PREFIX}api/quotas")
    check(doc, "GET", "api/quotas", r.code, r.headers["Content-Type"], r.body)


async def test_the_cli_sets_and_shows_the_kind_parts(live_service, store, capsys):
    from workbench_hub.cli import main

    base = ["--url", live_service, "--token", "t"]
    code = await asyncio.to_thread(
        main,
        [
            *base,
            "quota",
            "set-group",
            "students",
            "--max-gpus",
            "1",
            "--no-whole-gpus",
            "--allowed-profiles",
            "1g.18gb,2G.35GB",
        ],
    )
    assert code == 0, capsys.readouterr().err
    assert "no whole GPUs, MIG slices 1g.18gb, 2g.35gb" in capsys.readouterr().out
    book = Fleet(store, refresh_seconds=0).book
    assert book.get("group", "students").quota == Quota(1, whole_gpus=False, allowed_profiles=("1g.18gb", "2g.35gb"))
    assert (
        await asyncio.to_thread(
            main, [*base, "quota", "set-group", "research", "--max-gpus", "4", "--allowed-profiles", "none"]
        )
        == 0
    )
    assert "no MIG slices" in capsys.readouterr().out
    assert book.get("group", "research").quota == Quota(4, whole_gpus=True, allowed_profiles=())
    assert (
        await asyncio.to_thread(
            main, [*base, "quota", "set-group", "research", "--max-gpus", "4", "--allowed-profiles", "any"]
        )
        == 0
    )
    assert book.get("group", "research").quota == Quota(4)
    assert await asyncio.to_thread(main, [*base, "quota", "show"]) == 0
    out = capsys.readouterr().out
    assert "group students: 1 GPU(s) at once" in out
    assert "no whole GPUs, MIG slices 1g.18gb, 2g.35gb" in out
    code = await asyncio.to_thread(
        main, [*base, "quota", "set", "alice", "--max-gpus", "1", "--allowed-profiles", "1x.5gb"]
    )
    assert code == 1
    assert "'1x.5gb' is not a MIG profile" in capsys.readouterr().err
    args = [*base, "quota", "set-group", "thesis", "--max-gpus", "1", "--no-shared-gpus"]
    assert await asyncio.to_thread(main, args) == 0
    assert "1 GPU(s) at once, no GPU-hour limit, any model, no time-sliced GPUs." in capsys.readouterr().out
    assert book.get("group", "thesis").quota == Quota(1, shared_gpus=False)


def test_the_admin_page_shows_and_edits_the_kind_parts():
    quota = {**Quota(1, whole_gpus=False, allowed_profiles=("1g.18gb",)).to_json(), "origin": "own quota"}
    html = _jinja.get_template("admin.html").render(
        prefix=PREFIX,
        hub_prefix="/hub/",
        caller={"name": "admin"},
        admin=True,
        inventory=discover_devices("1"),
        node="n",
        simulated=True,
        gpus=[],
        users=[{"name": "alice", "groups": [], "held_gpus": 0, "gpu_hours_week": 0.0, "quota": quota}],
        groups=[
            {"name": "research", "users": [], "quota": Quota(4, allowed_profiles=()).to_json()},
            {"name": "thesis", "users": [], "quota": Quota(1, shared_gpus=False).to_json()},
        ],
        default=Quota(1).to_json(),
        models=["H100-80GB"],
        xsrf="x",
    )
    assert "any; no whole GPUs; MIG slices: 1g.18gb</td>" in html
    assert "any; MIG slices: none</td>" in html
    assert 'id="quota-whole-gpus"' in html
    assert "MIG profiles (comma list; empty: any)" in html
    # The editor's code is the page's script file (the CSP runs no inline script).
    assert '<script src="/services/workbench/static/fleet.js"></script>' in html
    script = (files("workbench_hub.service") / "static" / "fleet.js").read_text()
    assert 'whole_gpus: document.getElementById("quota-whole-gpus").checked' in script
    assert 'allowed_profiles: profiles === "" ? null' in script
    assert "<td>any; no time-sliced GPUs</td>" in html
    assert html.count("no time-sliced GPUs</td>") == 1
    assert 'shared_gpus: document.getElementById("quota-shared-gpus").checked' in script
