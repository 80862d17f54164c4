"""Policy settings made only as traits in the local config file reach every part.

Before the settings were stored once, the workbench service re-derived them
from environment variables: a ``default_max_gpus`` trait was enforced at
spawn but shown as 1, a ``gpu_db_url`` trait split quotas and leases over two
databases, ``static_gpus`` never reached the service. Here the three are set
only in a local config file, with no WORKBENCH_* variable for them, and the
admin page, the REST API and enforcement at spawn must all agree.
"""

from __future__ import annotations

import sqlite3

import pytest

from tests.conftest import process_env
from tests.service.conftest import shut_down, start_workbench_hub

pytestmark = pytest.mark.integration

STATIC = [
    {"uuid": "GPU-static-aaaa", "name": "NVIDIA A100-SXM4-40GB", "model": "A100-40GB"},
    {"uuid": "GPU-static-bbbb", "name": "NVIDIA A100-SXM4-40GB", "model": "A100-40GB"},
    {"uuid": "GPU-static-cccc", "name": "NVIDIA L40S", "model": "L40S-48GB"},
]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("settings")
    other_db = root / "elsewhere.sqlite"
    local = root / "jupyterhub_config.local.py"
    local.write_text(
        "c.GPUSpawnerMixin.default_max_gpus = 2\n"
        f"c.GPUSpawnerMixin.gpu_db_url = {f'sqlite:///{other_db}'!r}\n"
        f"c.GPUSpawnerMixin.static_gpus = {STATIC!r}\n"
    )
    hub = start_workbench_hub(root / "hub", {"WORKBENCH_SIMULATED_GPUS": "", "WORKBENCH_LOCAL_CONFIG": str(local)})
    hub.other_db = other_db
    hub.create_users("alice")
    yield hub
    shut_down(hub)


def test_the_api_shows_the_trait_settings(hub):
    assert hub.service("GET", "api/quotas").json()["default"]["max_gpus"] == 2
    gpus = hub.service("GET", "api/gpus").json()
    assert gpus["source"] == "static"
    assert [g["uuid"] for g in gpus["gpus"]] == [g["uuid"] for g in STATIC]
    assert hub.service("GET", "api/quotas/users/alice").json()["effective"]["max_gpus"] == 2


def test_the_admin_page_shows_them(hub):
    r = hub.service("GET", "")
    assert r.status_code == 200, r.text[:500]
    assert "the default (2 GPUs at once)" in r.text
    assert "GPU-static-cccc" in r.text
    assert "NVIDIA L40S" in r.text


def test_quotas_go_to_the_configured_database_and_accept_its_models(hub):
    r = hub.service("PUT", "api/quotas/users/alice", json={"max_gpus": 2, "allowed_models": ["a100-40gb"]})
    assert r.status_code == 200, r.text
    assert r.json()["quota"]["allowed_models"] == ["A100-40GB"]
    with sqlite3.connect(hub.other_db) as db:
        assert db.execute("SELECT name, max_gpus FROM gpu_quotas").fetchall() == [("alice", 2)]
    default_db = hub.data_dir / "workbench.sqlite"
    if default_db.exists():
        with sqlite3.connect(default_db) as db:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            assert "gpu_quotas" not in tables or not db.execute("SELECT * FROM gpu_quotas").fetchall()
    hub.service("DELETE", "api/quotas/users/alice")


def test_enforcement_at_spawn_uses_the_same_settings(hub):
    r = hub.spawn("alice", gpus=3)
    assert r.status_code == 403, r.text
    assert "the default quota allows 2 at once" in r.json()["message"]
    r = hub.spawn("alice", gpus=2, gpu_model="A100-40GB")
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("alice")
    pid = next(iter(hub.server_pids()))
    assert process_env(pid)["WORKBENCH_GPUS"] == "GPU-static-aaaa,GPU-static-bbbb"
    with sqlite3.connect(hub.other_db) as db:
        rows = db.execute("SELECT user, gpu_uuid, node FROM gpu_leases ORDER BY gpu_uuid").fetchall()
    assert [(u, g) for u, g, _ in rows] == [("alice", "GPU-static-aaaa"), ("alice", "GPU-static-bbbb")]
    assert all(node for _, _, node in rows), "every lease names its node"
    allocations = hub.service("GET", "api/allocations").json()["allocations"]
    assert [(a["user"], a["gpu_uuids"]) for a in allocations] == [("alice", ["GPU-static-aaaa", "GPU-static-bbbb"])]
    hub.api("DELETE", "/users/alice/server")
    hub.wait_stopped("alice")
