"""In a real ``jupyter server``: the ``stopping`` field, the kernels' notices file, tabs' polls, save rounds
(``api/gpu/saves``) and the memory cgroup (``api/gpu/memory``, on a fake cgroup directory)."""

from __future__ import annotations

import json
import stat
import time
from datetime import UTC, datetime, timedelta

import pytest
import requests

from tests.monitor.monitor_support import start_server, stop_server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("saves")
    cgroup = tmp / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text(f"{16 << 30}\n")
    (cgroup / "memory.current").write_text("4096\n")
    (cgroup / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
    running = start_server(tmp, {"WORKBENCH_SIMULATED_GPUS": "1", "WORKBENCH_MEMORY_CGROUP": str(cgroup)})
    running.cgroup = cgroup
    yield running
    stop_server(running)


def auth(server):
    return {"Authorization": f"token {server.token}"}


def put(server, notices):
    return requests.put(server.url + "api/gpu/notices", json={"notices": notices}, headers=auth(server), timeout=10)


def post(server, body):
    return requests.post(server.url + "api/gpu/saves", json=body, headers=auth(server), timeout=10)


def notice(id_, minutes=5.0, **over):
    stop_at = (datetime.now(UTC) + timedelta(minutes=minutes)).isoformat()
    return {"id": id_, "kind": "idle", "message": "Your server stops soon.", "stop_at": stop_at, **over}


def kernels_file(server):
    return server.runtime_dir / "workbench-notices.json"


def test_the_server_starts_with_an_empty_kernels_file(server):
    # A file left in a persistent runtime dir by an earlier server must not reach this one's kernels.
    assert json.loads(kernels_file(server).read_text())["notices"] == []


def test_stopping_is_kept_returned_and_written_for_kernels_0600(server):
    assert put(server, [notice(11, stopping=True), notice(12)]).status_code == 200
    got = server.get("api/gpu/notices").json()["notices"]
    assert [(n["id"], n["stopping"]) for n in got] == [("11", True), ("12", False)]
    path = kernels_file(server)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    body = json.loads(path.read_text())
    assert datetime.fromisoformat(body["written"]).tzinfo is not None
    assert [sorted(n) for n in body["notices"]] == [["id", "kind", "message", "stop_at", "stopping"]] * 2
    assert [(n["id"], n["stopping"]) for n in body["notices"]] == [("11", True), ("12", False)]
    assert not [p for p in server.runtime_dir.iterdir() if p.name.endswith(".tmp")]
    assert put(server, []).status_code == 200
    assert json.loads(path.read_text())["notices"] == []


@pytest.mark.parametrize("value", ["yes", 1, [], {}])
def test_a_bad_stopping_is_refused_and_changes_nothing(server, value):
    assert put(server, [notice(21)]).status_code == 200
    before = kernels_file(server).read_text()
    r = put(server, [notice(22, stopping=value)])
    assert r.status_code == 400
    assert "stopping must be true or false" in r.json()["message"]
    assert [n["id"] for n in server.get("api/gpu/notices").json()["notices"]] == ["21"]
    assert kernels_file(server).read_text() == before
    put(server, [])


@pytest.mark.parametrize("client", ["a b", "x" * 65, "tab/1", ""])
def test_a_bad_client_id_is_a_400_with_a_sentence(server, client):
    r = server.get("api/gpu/notices", params={"client": client})
    assert r.status_code == 400
    assert "client must be a short id" in r.json()["message"]


def test_a_save_round_is_done_when_every_active_tab_reported(server):
    for tab in ("tab-a", "tab-b"):
        assert server.get("api/gpu/notices", params={"client": tab}).status_code == 200
    assert put(server, [notice(31, minutes=0, stopping=True)]).status_code == 200
    server.get("api/gpu/notices", params={"client": "tab-late"})  # opened after: not waited for
    round_ = server.get("api/gpu/saves", params={"notice_id": "31"}).json()
    assert round_ == {
        "notice_id": "31",
        "active_clients": 2,
        "reported": 0,
        "saved": 0,
        "failed": 0,
        "names": [],
        "done": False,
    }
    r = post(server, {"notice_id": "31", "client": "tab-a", "saved": 2, "failed": 0, "names": ["a.ipynb", "b.py"]})
    assert r.status_code == 201
    assert r.json()["reported"] == 1
    assert r.json()["done"] is False
    r = post(server, {"notice_id": "31", "client": "tab-b", "saved": 1, "failed": 1, "names": ["c.ipynb"]})
    assert r.status_code == 201
    round_ = server.get("api/gpu/saves", params={"notice_id": "31"}).json()
    assert (round_["reported"], round_["saved"], round_["failed"], round_["done"]) == (2, 3, 1, True)
    assert round_["names"] == ["a.ipynb", "b.py", "c.ipynb"]
    put(server, [])


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"notice_id": "41", "client": "t", "saved": -1, "failed": 0}, "saved must be a whole number"),
        ({"notice_id": "41", "client": "t t", "saved": 1, "failed": 0}, "client must be"),
        ({"notice_id": "41", "client": "t", "saved": 1, "failed": 0, "names": ["x"] * 51}, "at most 50"),
        ({"notice_id": "41", "client": "t", "saved": 1, "failed": 0, "extra": 1}, "unknown field"),
        ([1, 2], "the body must be"),
    ],
)
def test_bad_reports_are_400_with_a_sentence_and_change_nothing(server, body, words):
    assert post(server, {"notice_id": "41", "client": "t", "saved": 1, "failed": 0}).status_code == 201
    before = server.get("api/gpu/saves", params={"notice_id": "41"}).json()
    r = post(server, body)
    assert r.status_code == 400
    assert words in r.json()["message"]
    assert server.get("api/gpu/saves", params={"notice_id": "41"}).json() == before


def test_reports_that_are_not_json_and_reads_without_an_id_are_refused(server):
    r = requests.post(server.url + "api/gpu/saves", data=b"{nope", headers=auth(server), timeout=10)
    assert r.status_code == 400
    assert "not JSON" in r.json()["message"]
    r = server.get("api/gpu/saves")
    assert r.status_code == 400
    assert "notice_id" in r.json()["message"]


def test_saves_and_memory_need_authentication(server):
    assert server.get("api/gpu/saves", params={"notice_id": "1"}, auth=False).status_code == 403
    assert server.get("api/gpu/memory", auth=False).status_code == 403
    r = requests.post(server.url + "api/gpu/saves", json={"notice_id": "1", "client": "t", "saved": 0, "failed": 0})
    assert r.status_code == 403


def test_memory_reports_the_cgroup_and_when_a_kill_happened(server):
    body = server.get("api/gpu/memory").json()
    assert body == {
        "cgroup": "v2",
        "limit_bytes": 16 << 30,
        "usage_bytes": 4096,
        "oom_kills": 0,
        "last_oom_kill_at": None,
        "source": str(server.cgroup),
    }
    (server.cgroup / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    deadline = time.time() + 5
    while time.time() < deadline and body["last_oom_kill_at"] is None:
        time.sleep(0.2)
        body = server.get("api/gpu/memory").json()
    assert body["oom_kills"] == 1
    assert abs((datetime.now(UTC) - datetime.fromisoformat(body["last_oom_kill_at"])).total_seconds()) < 5
