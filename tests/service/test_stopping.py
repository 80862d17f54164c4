"""One way the service stops a server for its own reasons (``service/stopping.py``): open notebooks saved
first, then the sentence recorded, then the hub's stop.

A small tornado app stands in for the user server behind the proxy (its GPU
monitor's ``PUT api/gpu/notices`` and ``GET api/gpu/saves``); the rounds:
saved, nothing to save, unreachable, timed out, and a monitor without save
rounds. The three rules' call sites (idle reclaim, session limit,
preemption) are driven through ``stop_for`` too.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta

import pytest
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from tests.conftest import free_port
from workbench_hub.service.gpu_reclaim import idle_cause
from workbench_hub.service.hub_client import HubUnavailableError
from workbench_hub.service.session_limits import session_cause, session_reason, stop_overlong_servers
from workbench_hub.service.stopping import (
    NOT_REACHED,
    NOTHING,
    NOTHING_TO_SAVE,
    SAVED,
    TIMED_OUT,
    UNREACHABLE,
    SaveRound,
    Stopper,
)
from workbench_hub.service.user_servers import UserServers
from workbench_spawner.ledger.notices import NoticeBook
from workbench_spawner.ledger.quota_book import QuotaBook
from workbench_spawner.ledger.reasons import reason_kind
from workbench_spawner.ledger.store import AllocationStore
from workbench_spawner.rules.idle import IdleRule

PATH = "/user/alice/"
AT = datetime(2025, 3, 2, 10, 30, tzinfo=UTC)  # in the past: seconds_left is 0


class Monitor:
    """What the stand-in server was told and what it answers."""

    def __init__(self):
        self.puts: list[dict] = []
        self.polls: list[str] = []
        self.answers: list[dict] = []  # one per poll; the last repeats
        self.saves_status = 200

    def answer(self) -> dict:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


class NoticesHandler(web.RequestHandler):
    def put(self):
        assert self.request.headers["Authorization"] == "token service-token"
        self.settings["monitor"].puts.append(json.loads(self.request.body))
        self.set_status(204)


class SavesHandler(web.RequestHandler):
    def get(self):
        monitor = self.settings["monitor"]
        monitor.polls.append(self.get_argument("notice_id"))
        if monitor.saves_status != 200:
            raise web.HTTPError(monitor.saves_status)
        self.finish({"notice_id": self.get_argument("notice_id"), **monitor.answer()})


@pytest.fixture
async def monitor():
    state = Monitor()
    app = web.Application(
        [(PATH + "api/gpu/notices", NoticesHandler), (PATH + "api/gpu/saves", SavesHandler)], monitor=state
    )
    sock, port = bind_unused_port()
    server = HTTPServer(app)
    server.add_sockets([sock])
    state.proxy_url = f"http://127.0.0.1:{port}"
    yield state
    server.stop()


class FakeHub:
    def __init__(self, users=()):
        self.stopped: list[tuple[str, str]] = []
        self.models = {u["name"]: u for u in users}

    async def stop_server(self, user, server):
        self.stopped.append((user, server))

    async def users(self):
        return list(self.models.values())

    async def user(self, name):
        return self.models.get(name)


@pytest.fixture
def store(tmp_path):
    store = AllocationStore(f"sqlite:///{tmp_path / 'wb.sqlite'}")
    yield store
    store.dispose()


def stopper(store, hub, proxy_url: str | None, save_wait: float = 5.0) -> Stopper:
    servers = UserServers(proxy_url, "service-token", timeout=2.0) if proxy_url else None
    return Stopper(NoticeBook(store), hub, servers, save_wait=save_wait, poll=0.1)


async def stop_idle(stopper: Stopper):
    return await stopper.stop_for(
        "alice",
        "",
        kind="idle",
        cause=idle_cause(IdleRule(minutes=30, threshold=5, warn_minutes=10)),
        reason="reclaimed: GPU idle 30 min",
        hint="Start again when you are ready.",
        path=PATH,
        at=AT,
    )


def answer(done: bool, saved=0, failed=0, active=1, reported=None) -> dict:
    reported = (active if done else 0) if reported is None else reported
    return {"active_clients": active, "reported": reported, "saved": saved, "failed": failed, "names": [], "done": done}


async def test_open_notebooks_are_saved_before_the_stop_and_the_sentence_says_so(store, monitor):
    book = NoticeBook(store)
    warning = book.warn("alice", "", kind="idle", message="Your server will be stopped at 10:30", stop_at=AT)
    book.warn("alice", "", kind="preempt", message="reserved soon", stop_at=AT + timedelta(hours=1))
    book.warn("bob", "", kind="idle", message="not alice's", stop_at=AT)
    monitor.answers = [answer(False), answer(False), answer(True, saved=3)]
    hub = FakeHub()
    done = await stop_idle(stopper(store, hub, monitor.proxy_url))
    # The pending notices were put once more, the rule's own marked "stopping", the other one kept as it was.
    [put] = monitor.puts
    by_kind = {n["kind"]: n for n in put["notices"]}
    assert set(by_kind) == {"idle", "preempt"}, "only alice's default server's notices"
    assert by_kind["idle"]["id"] == warning.id
    assert by_kind["idle"]["stopping"] is True
    assert by_kind["idle"]["stop_at"] == AT.isoformat()
    assert by_kind["idle"]["seconds_left"] == 0
    assert "stopping" not in by_kind["preempt"]
    # Asked until done, about that notice.
    assert monitor.polls == [str(warning.id)] * 3
    assert done.save == SaveRound(SAVED, 3, 0)
    assert done.stopped
    assert hub.stopped == [("alice", "")]
    assert done.message == (
        "Your server was stopped at 10:30: idle GPU reclaimed after 30 minutes below 5 % use. "
        "We saved 3 notebooks first. Your files are kept."
    )
    last = book.last_done("alice", "")
    assert (last.message, last.reason, last.hint) == (
        done.message,
        "reclaimed: GPU idle 30 min",
        "Start again when you are ready.",
    )
    assert [n.kind for n in book.pending("alice")] == [], "one story per server: the warnings gave way"


@pytest.mark.parametrize(
    ("answers", "round_", "sentence"),
    [
        ([answer(True, saved=1)], SaveRound(SAVED, 1), "We saved 1 notebook first."),
        ([answer(True, saved=0)], SaveRound(NOTHING), NOTHING_TO_SAVE),
        ([answer(True, saved=0, active=0)], SaveRound(NOTHING), NOTHING_TO_SAVE),
        (
            [answer(True, saved=2, failed=1)],
            SaveRound(SAVED, 2, 1),
            "We saved 2 notebooks first; 1 could not be saved, and JupyterLab's autosave keeps their changes up "
            "to 2 minutes old.",
        ),
    ],
)
async def test_what_the_save_round_reports_is_what_the_stop_box_says(store, monitor, answers, round_, sentence):
    monitor.answers = answers
    done = await stop_idle(stopper(store, FakeHub(), monitor.proxy_url))
    assert done.save == round_
    assert round_.sentence() == sentence
    assert NoticeBook(store).last_done("alice").message.endswith(f" {sentence} Your files are kept.")


async def test_a_server_that_cannot_be_reached_is_stopped_anyway_and_the_box_says_so(store):
    hub = FakeHub()
    began = time.monotonic()
    done = await stop_idle(stopper(store, hub, f"http://127.0.0.1:{free_port()}"))
    assert time.monotonic() - began < 3, "a refused connection does not wait out the save round"
    assert done.save.outcome == NOT_REACHED
    assert hub.stopped == [("alice", "")]
    assert done.message == (
        "Your server was stopped at 10:30: idle GPU reclaimed after 30 minutes below 5 % use. "
        f"{UNREACHABLE} Your files are kept."
    )
    assert UNREACHABLE == (
        "Your server could not be reached in time to save open notebooks first; JupyterLab's autosave keeps "
        "changes up to 2 minutes old."
    )


async def test_a_save_round_that_never_ends_is_given_up_after_save_wait(store, monitor):
    monitor.answers = [answer(False, active=2, reported=1, saved=0)]
    hub = FakeHub()
    began = time.monotonic()
    done = await stop_idle(stopper(store, hub, monitor.proxy_url, save_wait=1.0))
    took = time.monotonic() - began
    assert 0.9 < took < 2.5, took
    assert len(monitor.polls) >= 5, "polled every 0.1 s meanwhile"
    assert done.save.outcome == TIMED_OUT
    assert "1 of 2 open tabs reported in 1 s" in done.save.detail
    assert UNREACHABLE in done.message
    assert hub.stopped == [("alice", "")]


async def test_a_round_timed_out_after_some_tabs_saved_says_both(store, monitor):
    monitor.answers = [answer(False, active=2, reported=1, saved=2)]
    done = await stop_idle(stopper(store, FakeHub(), monitor.proxy_url, save_wait=0.5))
    assert done.save == SaveRound(TIMED_OUT, 2, 0, done.save.detail)
    assert "We saved 2 notebooks first; another open tab could not be reached in time" in done.message


async def test_a_monitor_without_save_rounds_is_not_waited_for(store, monitor):
    monitor.saves_status = 404
    began = time.monotonic()
    done = await stop_idle(stopper(store, FakeHub(), monitor.proxy_url, save_wait=10))
    assert time.monotonic() - began < 2
    assert done.save.outcome == NOT_REACHED
    assert UNREACHABLE in done.message
    assert len(monitor.puts) == 1, "the stopping notice still went out (kernels' on_stop reads it)"


async def test_a_stop_the_hub_refuses_is_said_but_not_counted(store, monitor):
    monitor.answers = [answer(True)]

    class Refusing(FakeHub):
        async def stop_server(self, user, server):
            raise HubUnavailableError("the hub's API answered DELETE with 503")

    done = await stop_idle(stopper(store, Refusing(), monitor.proxy_url))
    assert not done.stopped
    assert NoticeBook(store).last_done("alice") is not None


async def test_no_save_wait_means_no_save_round(store, monitor):
    done = await stop_idle(stopper(store, FakeHub(), monitor.proxy_url, save_wait=0))
    assert done.save.outcome == NOT_REACHED
    assert monitor.puts == []


@pytest.mark.parametrize(
    ("minutes", "threshold", "words"),
    [
        (30, 5, "idle GPU reclaimed after 30 minutes below 5 % use"),
        (1, 10, "idle GPU reclaimed after 1 minute below 10 % use"),
        (1.5, 2.5, "idle GPU reclaimed after 1.5 minutes below 2.5 % use"),
        (0.2, 5, "idle GPU reclaimed after 12 seconds below 5 % use"),
    ],
)
def test_idle_cause(minutes, threshold, words):
    assert idle_cause(IdleRule(minutes=minutes, threshold=threshold, warn_minutes=1)) == words


@pytest.mark.parametrize(
    ("hours", "cause", "reason"),
    [
        (4, "session limit of 4 hours reached", "session limit: 4 h"),
        (1, "session limit of 1 hour reached", "session limit: 1 h"),
        (0.5, "session limit of 0.5 hours reached", "session limit: 0.5 h"),
    ],
)
def test_session_limit_words(hours, cause, reason):
    assert (session_cause(hours), session_reason(hours), reason_kind(session_reason(hours))) == (
        cause,
        reason,
        "session limit",
    )


async def test_the_session_limit_saves_first_and_says_why(store, monitor):
    """Before, the session limit stopped a server without a word; now it posts the stop box too."""
    quotas = QuotaBook(store)
    quotas.record_session_limit("alice", "", 4.0)
    quotas.record_session_limit("bob", "", 4.0)
    started = (datetime.now(UTC) - timedelta(hours=4, minutes=1)).isoformat()
    fresh = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    hub = FakeHub(
        [
            {"name": "alice", "servers": {"": {"ready": True, "pending": None, "started": started, "url": PATH}}},
            {"name": "bob", "servers": {"": {"ready": True, "pending": None, "started": fresh, "url": "/user/bob/"}}},
        ]
    )
    monitor.answers = [answer(True, saved=1)]
    assert await stop_overlong_servers(quotas, hub, stopper(store, hub, monitor.proxy_url)) == [("alice", "")]
    assert hub.stopped == [("alice", "")]
    done = NoticeBook(store).last_done("alice")
    assert done.kind == "session"
    assert done.reason == "session limit: 4 h"
    assert done.message.startswith("Your server was stopped at ")
    assert ": session limit of 4 hours reached. We saved 1 notebook first. Your files are kept." in done.message
    assert [n["stopping"] for n in monitor.puts[0]["notices"]] == [True]
    assert NoticeBook(store).last_done("bob") is None


async def test_several_stops_wait_for_their_rounds_at_once(store, monitor):
    """The three rules gather their stops: two slow rounds take one round's time, not two."""
    monitor.answers = [answer(False)]
    hub = FakeHub()
    one = stopper(store, hub, monitor.proxy_url, save_wait=1.0)
    began = time.monotonic()
    await asyncio.gather(
        one.stop_for("alice", "", kind="idle", cause="x", reason="r", path=PATH),
        one.stop_for("alice", "big", kind="idle", cause="x", reason="r", path=PATH),
    )
    assert time.monotonic() - began < 1.8
    assert sorted(hub.stopped) == [("alice", ""), ("alice", "big")]


async def test_without_a_path_the_server_is_found_through_the_hub(store, monitor):
    hub = FakeHub([{"name": "alice", "servers": {"": {"ready": True, "url": PATH}}}])
    monitor.answers = [answer(True, saved=1)]
    done = await stopper(store, hub, monitor.proxy_url).stop_for(
        "alice", "", kind="preempt", cause="its GPUs are reserved for ml-course from 10:00 until 12:00", reason="r"
    )
    assert done.save.outcome == SAVED
    assert len(monitor.puts) == 1
    gone = await stopper(store, FakeHub(), monitor.proxy_url).stop_for(
        "carol", "", kind="preempt", cause="x", reason="r"
    )
    assert gone.save.outcome == NOT_REACHED
    assert "no running server" in gone.save.detail


# -- against a real single-user server with the GPU monitor (tests/monitor's) ---------------------------


@pytest.fixture(scope="module")
def real_server(tmp_path_factory):
    from tests.monitor.monitor_support import EXTENSION_DIR, start_server, stop_server

    if not (EXTENSION_DIR / "workbench_gpu_monitor" / "saves.py").exists():
        pytest.skip("the GPU monitor in this checkout has no save rounds (api/gpu/saves)")

    server = start_server(tmp_path_factory.mktemp("lab"), {"WORKBENCH_SIMULATED_GPUS": "1"}, base_url=PATH)
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def real_store(tmp_path_factory):
    """One database for the module, as the server is: a notice id is never used twice with it."""
    store = AllocationStore(f"sqlite:///{tmp_path_factory.mktemp('real') / 'wb.sqlite'}")
    yield store
    store.dispose()


async def real_stopper(store, server, hub, save_wait=5.0) -> Stopper:
    servers = UserServers(server.url[: -len(PATH)], server.token, timeout=2.0)
    # The server outlives each test's stop (nobody stops it here): the last test's stopping notice goes.
    await servers.put_notices(PATH, [])
    return Stopper(NoticeBook(store), hub, servers, save_wait=save_wait, poll=0.2)


async def tab(server, client: str, report: dict | None, seen: asyncio.Event) -> None:
    """A lab tab: polls notices as ``client``; on a stopping notice it saves and reports ``report``."""
    import requests

    while True:
        r = await asyncio.to_thread(server.get, f"api/gpu/notices?client={client}")
        notices = r.json().get("notices") or []
        stopping = [n for n in notices if n.get("stopping")]
        if stopping:
            seen.set()
            if report is not None:
                body = {"notice_id": str(stopping[0]["id"]), "client": client, **report}
                posted = await asyncio.to_thread(
                    requests.post,
                    f"{server.url}api/gpu/saves",
                    json=body,
                    headers={"Authorization": f"token {server.token}"},
                    timeout=10,
                )
                assert posted.status_code in (201, 204), posted.text
            return
        await asyncio.sleep(0.1)


@pytest.mark.integration
async def test_a_real_server_with_no_tab_open_has_nothing_to_save(real_store, real_server):
    hub = FakeHub()
    done = await stop_idle(await real_stopper(real_store, real_server, hub))
    assert done.save.outcome == NOTHING
    assert NOTHING_TO_SAVE in done.message
    assert hub.stopped == [("alice", "")]


@pytest.mark.integration
async def test_a_real_server_reports_what_its_tab_saved(real_store, real_server):
    stopper = await real_stopper(real_store, real_server, FakeHub())
    await asyncio.to_thread(real_server.get, "api/gpu/notices?client=tab-saves")  # the tab is open
    seen = asyncio.Event()
    lab = asyncio.create_task(tab(real_server, "tab-saves", {"saved": 2, "failed": 0, "names": ["a.ipynb"]}, seen))
    done = await stop_idle(stopper)
    await lab
    assert seen.is_set()
    assert done.save.outcome == SAVED
    assert done.save.saved == 2
    assert "We saved 2 notebooks first." in done.message


@pytest.mark.integration
async def test_a_real_server_whose_tab_never_reports_is_stopped_after_save_wait(real_store, real_server):
    stopper = await real_stopper(real_store, real_server, FakeHub(), save_wait=1.5)
    await asyncio.to_thread(real_server.get, "api/gpu/notices?client=tab-silent")
    seen = asyncio.Event()
    lab = asyncio.create_task(tab(real_server, "tab-silent", None, seen))  # sees the notice, never reports
    began = time.monotonic()
    done = await stop_idle(stopper)
    await lab
    assert seen.is_set()
    assert done.save.outcome == TIMED_OUT
    assert 1.4 < time.monotonic() - began < 4
    assert UNREACHABLE in done.message
