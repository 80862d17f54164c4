"""One student, many servers at once: the GPU quota holds however the servers are asked for.

A real hub (the real proxy, the local backend, 4 simulated GPUs, ``WORKBENCH_NAMED_SERVERS=25``) and a
student whose own quota is ``max_gpus=1``. Two spawns of one student that overlap once both passed the
quota (it was checked when the options were applied, counting the GPUs held at that moment) and the
student held 2 GPUs. Now the quota is checked again where the lease is written (``ledger.lease_limits``):

* 20 ``POST /hub/api/users/stu/servers/sN`` with ``{"gpus": 1}`` at the same moment: exactly one GPU is
  held (the service's ``api/allocations`` and the ledger agree), and every other answer is a 4xx whose
  message is the sentence naming the server that holds the quota;
* the same with the default server and named servers, through the REST API and the spawn form
  (``POST /hub/spawn/stu/SERVER`` with the student's cookie and ``_xsrf``, as a browser sends it).

On the SQLite GPU database and on PostgreSQL (``WORKBENCH_DB_URL``), one hub each for the module.
"""

from __future__ import annotations

import contextlib
import html
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import requests
from sqlalchemy import create_engine, text

from tests.conftest import Hub, hub_form, native_sign_up, sign_up_decision, wait_until
from tests.postgres.server import fresh_database

pytestmark = pytest.mark.integration

STUDENT = "stu"
PASSWORD = "a-long-student-passphrase-4"


@dataclass
class QuotaHub:
    hub: Hub
    db_url: str  # the GPU database (SQLite file or PostgreSQL)
    student: requests.Session  # the student's browser: logged in, with its _xsrf cookie


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def quota_hub(request, tmp_path_factory) -> Iterator[QuotaHub]:
    with contextlib.ExitStack() as stack:
        data_dir = tmp_path_factory.mktemp(f"quota-{request.param}")
        env = {
            "WORKBENCH_SIMULATED_GPUS": "4",
            "WORKBENCH_NAMED_SERVERS": "25",
            "WORKBENCH_DEFAULT_MAX_GPUS": "2",  # the student's own quota (1) is lower: it must be the one that holds
        }
        db_url = f"sqlite:///{data_dir / 'workbench.sqlite'}"
        if request.param == "postgresql":
            db_url = env["WORKBENCH_DB_URL"] = stack.enter_context(fresh_database("wb_hub"))
        hub = Hub(data_dir, env, ["--GPUSpawnerMixin.gpu_queue_recheck_interval=0.2"])
        stack.callback(hub.kill_everything)  # before the database is dropped
        hub.start()
        # The student signs up, the admin authorizes them, and they log in: the spawn form needs their cookie.
        native_sign_up(requests.Session(), hub.url, STUDENT, PASSWORD)
        admin = hub.admin_pages()
        r = sign_up_decision(admin, hub.url, STUDENT, "authorize")
        assert r.status_code == 302, r.text
        student = requests.Session()
        r = hub_form(student, hub.url, "/hub/login", {"username": STUDENT, "password": PASSWORD})
        assert r.status_code == 302, r.text
        r = hub.service("PUT", f"api/quotas/users/{STUDENT}", json={"max_gpus": 1})
        assert r.status_code == 200, r.text
        yield QuotaHub(hub, db_url, student)


def sentence(holder: str) -> str:
    """What every refused spawn reads, whichever check caught it (admission or the lease's own)."""
    held = f"your other server {holder} holds" if holder else "your default server holds"
    return (
        f"Cannot start the server: you asked for 1 GPU, but your own GPU quota allows 1 at once and {held} 1 "
        f"(H100-80GB). Stop {holder or 'your default server'} first, ask for fewer, or ask a hub admin to raise "
        "your GPU quota."
    )


def server_path(server: str) -> str:
    return f"/users/{STUDENT}/servers/{server}" if server else f"/users/{STUDENT}/server"


def outcome(hub: Hub, server: str, timeout: float = 120) -> tuple[str, str]:
    """How a spawn the hub answered as pending ended: ("ready", "") or ("failed", its message), from the spawn
    progress stream the spawn page reads."""
    deadline = time.monotonic() + timeout
    with hub.api("GET", f"{server_path(server)}/progress", stream=True) as r:
        if r.status_code == 400:  # neither pending nor failed: it runs
            return "ready", ""
        for line in r.iter_lines(decode_unicode=True):
            if line and line.startswith("data:"):
                event = json.loads(line[5:])
                if event.get("ready"):
                    return "ready", ""
                if event.get("failed"):
                    return "failed", event.get("message", "").removeprefix("Spawn failed: ")
            if time.monotonic() > deadline:
                break
    raise AssertionError(f"{server or 'the default server'} neither started nor failed within {timeout} s")


def api_spawn(quota: QuotaHub, server: str) -> Callable[[], tuple[int, str]]:
    def send() -> tuple[int, str]:
        r = quota.hub.api("POST", server_path(server), json={"gpus": 1})
        return r.status_code, (r.json().get("message", "") if r.status_code >= 400 else "")

    return send


def form_spawn(quota: QuotaHub, server: str) -> Callable[[], tuple[int, str]]:
    """The spawn form as a browser submits it: the student's cookies, the ``_xsrf`` field, the form's fields."""
    cookies = quota.student.cookies.copy()  # a session of its own: requests' sessions are not shared by threads

    def send() -> tuple[int, str]:
        session = requests.Session()
        session.cookies.update(cookies)
        path = f"/hub/spawn/{STUDENT}/{server}" if server else f"/hub/spawn/{STUDENT}"
        r = session.post(
            f"{quota.hub.url}{path}",
            data={"gpus": "1", "_xsrf": cookies.get("_xsrf", "")},
            allow_redirects=False,
            timeout=60,
        )
        # A refusal within the second the hub waits renders the form again with the sentence; else a redirect.
        return r.status_code, (html.unescape(r.text) if r.status_code >= 400 else "")

    return send


def at_once(requests_: dict[str, Callable[[], tuple[int, str]]]) -> dict[str, tuple[int, str]]:
    """Send every request at the same moment, one thread each; server -> (status, refusal text)."""
    barrier = threading.Barrier(len(requests_))
    answers: dict[str, tuple[int, str]] = {}

    def one(server: str, send: Callable[[], tuple[int, str]]) -> None:
        barrier.wait()
        answers[server] = send()

    threads = [threading.Thread(target=one, args=item) for item in requests_.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(answers) == len(requests_), "a request did not answer"
    return answers


def settle(quota: QuotaHub, answers: dict[str, tuple[int, str]]) -> tuple[str, dict[str, str]]:
    """The one server that got a GPU, and each refused server's sentence; a spawn the hub answered as pending
    (202, or the form's redirect) is followed to its end."""
    started: list[str] = []
    refused: dict[str, str] = {}
    for server, (status, said) in answers.items():
        if 400 <= status < 500:
            refused[server] = said
            continue
        assert status in (201, 202, 302), (server, status, said)
        end, message = ("ready", "") if status == 201 else outcome(quota.hub, server)
        if end == "ready":
            started.append(server)
        else:
            refused[server] = message
    assert len(started) == 1, f"started: {started}; refused: {refused}"
    return started[0], refused


def ledger(db_url: str) -> list[tuple[str, str, str]]:
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text('SELECT "user", server, gpu_uuid FROM gpu_leases ORDER BY id')).all()
    finally:
        engine.dispose()
    return [tuple(row) for row in rows]


def assert_one_gpu_held_by(quota: QuotaHub, holder: str) -> None:
    rows = ledger(quota.db_url)
    assert [(user, server) for user, server, _ in rows] == [(STUDENT, holder)], rows
    r = quota.hub.service("GET", "api/allocations")
    assert r.status_code == 200, r.text
    held = [(a["user"], a["server"], a["gpu_uuids"]) for a in r.json()["allocations"]]
    assert held == [(STUDENT, holder, [rows[0][2]])], held


def remove_every_server(hub: Hub) -> None:
    """Stop the student's servers and delete the named ones (refused ones too: JupyterHub keeps a stopped named
    server, and counts it against the limit of 25), so the next test starts from none."""

    def named(stopped: bool) -> dict:
        query = "?include_stopped_servers=1" if stopped else ""
        return hub.api("GET", f"/users/{STUDENT}{query}").json()["servers"]

    for name in named(stopped=True):
        r = hub.api("DELETE", server_path(name), json={"remove": True} if name else None)
        assert r.status_code in (202, 204, 404), r.text
    wait_until(lambda: not named(stopped=False), 90, "the student's servers to stop", hub.log)
    for name in named(stopped=True):  # one that was running is deleted once it stopped
        if name:
            hub.api("DELETE", server_path(name), json={"remove": True})
    wait_until(lambda: list(named(stopped=True)) in ([], [""]), 30, "the named servers to be deleted", hub.log)


def test_twenty_named_servers_asked_for_at_once_get_one_gpu(quota_hub):
    quota = quota_hub
    began = time.monotonic()
    answers = at_once({f"s{i}": api_spawn(quota, f"s{i}") for i in range(20)})
    holder, refused = settle(quota, answers)
    try:
        assert len(refused) == 19
        for server, said in refused.items():
            assert said == sentence(holder), (server, said)
        # Every refusal was an answer to its own request (a 4xx), not a wait that failed later.
        assert sorted(status for server, (status, _) in answers.items() if server != holder) == [403] * 19
        assert_one_gpu_held_by(quota, holder)
        assert time.monotonic() - began < 120
    finally:
        remove_every_server(quota.hub)
    assert ledger(quota.db_url) == []


def test_the_default_server_named_servers_the_api_and_the_form_at_once_get_one_gpu(quota_hub):
    quota = quota_hub
    spawns = {"": api_spawn(quota, "")}
    spawns |= {f"api{i}": api_spawn(quota, f"api{i}") for i in range(1, 5)}
    spawns |= {f"form{i}": form_spawn(quota, f"form{i}") for i in range(1, 6)}
    answers = at_once(spawns)
    holder, refused = settle(quota, answers)
    try:
        assert len(refused) == len(spawns) - 1
        for server, said in refused.items():
            if server.startswith("form") and answers[server][0] >= 400:
                assert sentence(holder) in said, (server, said[-3000:])  # the form page, with the sentence
            else:
                assert said == sentence(holder), (server, said)
        assert_one_gpu_held_by(quota, holder)
        # The student's own spawn page, asked again, refuses in the same words (admission's check now).
        r = form_spawn(quota, "form1" if holder != "form1" else "form2")()
        assert r[0] == 403
        assert sentence(holder) in r[1]
    finally:
        remove_every_server(quota.hub)
    assert ledger(quota.db_url) == []
