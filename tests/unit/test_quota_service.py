"""The workbench service without a hub: its OpenAPI document matches its routes, its
page escapes what it shows, and its metrics are valid Prometheus text."""

from __future__ import annotations

import re

from workbench_gpu_monitor.devices import discover_devices
from workbench_hub.service.app import Fleet, _jinja, make_app
from workbench_hub.service.metrics import render_metrics
from workbench_hub.service.openapi import openapi_document
from workbench_spawner.quota import Quota
from workbench_spawner.store import AllocationStore

PREFIX = "/services/workbench/"
NOT_API = ("oauth_callback", "api/.*")


def app_routes():
    app = make_app(fleet=None, prefix=PREFIX)
    routes = set()
    for rule in app.wildcard_router.rules:
        path = rule.matcher.regex.pattern.rstrip("$")
        relative = path[len(PREFIX):]
        if relative in NOT_API:
            continue
        openapi_path = "/" + relative.replace("([^/]+)", "{name}")
        for method in ("get", "put", "delete", "post", "patch"):
            if method in vars(rule.target) or any(method in vars(c) for c in rule.target.__mro__[1:3]
                                                   if c.__module__ == rule.target.__module__):
                routes.add((method, openapi_path))
    return routes


def test_every_route_is_documented_and_every_documented_route_exists():
    doc = openapi_document(PREFIX)
    documented = {(method, path) for path, item in doc["paths"].items() for method in item
                  if method in ("get", "put", "delete", "post", "patch")}
    assert app_routes() == documented


def test_the_document_is_openapi_3_with_resolvable_refs():
    doc = openapi_document(PREFIX)
    assert doc["openapi"].startswith("3.0")
    text = repr(doc)
    for ref in set(re.findall(r"#/components/(\w+)/(\w+)", text)):
        assert ref[1] in doc["components"][ref[0]], ref
    quota = doc["components"]["schemas"]["Quota"]
    assert set(quota["properties"]) == {"max_gpus", "gpu_hours_per_week", "allowed_models", "max_session_hours"}


EVIL = '<img src=x onerror="alert(1)">'


def test_the_admin_page_escapes_names():
    inventory = discover_devices("1")
    html = _jinja.get_template("admin.html").render(
        prefix=PREFIX, hub_prefix="/hub/", caller={"name": EVIL}, admin=True, inventory=inventory,
        simulated=True, gpus=[{"index": 0, "uuid": EVIL, "name": EVIL, "model": "x", "memory_total_bytes": 0,
                               "holders": [{"user": EVIL, "server": EVIL, "since": "2026-12-02T10:00:00"}],
                               "utilization_percent": None, "memory_used_bytes": None}],
        users=[{"name": EVIL, "groups": [EVIL], "held_gpus": 0, "gpu_hours_week": 0.0,
                "quota": {"max_gpus": 1, "gpu_hours_per_week": None, "allowed_models": [EVIL],
                          "max_session_hours": None, "origin": f"from group {EVIL}"}}],
        groups=[{"name": EVIL, "users": [EVIL], "quota": None}],
        default={"max_gpus": 1, "gpu_hours_per_week": None, "allowed_models": None, "max_session_hours": None},
        models=[EVIL], xsrf='"</script><script>alert(1)</script>',
    )
    assert "<img" not in html and "</script><script>" not in html
    assert "&lt;img src=x onerror=" in html


def test_metrics_are_prometheus_text_with_dcgm_names(tmp_path):
    store = AllocationStore(f"sqlite:///{tmp_path / 'wb.sqlite'}")
    inventory = discover_devices("2")
    store.allocate('al"ice', "", 1, [d.uuid for d in inventory.devices])
    fleet = Fleet(inventory, store, Quota(1))
    text = render_metrics(fleet)
    store.dispose()
    line = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*\{([a-zA-Z_]\w*="(?:[^"\\]|\\.)*",?)*\} -?[0-9.e+-]+$')
    for row in text.splitlines():
        assert row.startswith("# ") or line.match(row), row
    assert 'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-sim-00-h100-80gb",modelName=' in text
    assert 'user="al\\"ice"' in text and 'simulated="true"' in text
    for name in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "workbench_gpus_free", "workbench_user_gpus_held"):
        assert f"# TYPE {name} gauge" in text
