"""The session limit warns first (``service/session_limits.py``): a countdown ``lead`` before the limit
(the idle rule's warning lead, at most the session itself), the stop at the limit as before, and the warning
withdrawn when the server stops first. Table tests with a stand-in hub; the real hub is in
``test_drain_stops_hub.py``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from tests.service.test_stopping import FakeHub
from workbench_hub.service.session_limits import (
    KIND,
    session_warning,
    stop_overlong_servers,
    warn_lead,
)
from workbench_hub.service.stopping import Stopper
from workbench_spawner.ledger.notices import NoticeBook
from workbench_spawner.ledger.quota_book import QuotaBook
from workbench_spawner.ledger.store import AllocationStore

LEAD = timedelta(minutes=10)


@pytest.fixture
def store(tmp_path):
    store = AllocationStore(f"sqlite:///{tmp_path / 'wb.sqlite'}")
    yield store
    store.dispose()


def running(name: str, ago: timedelta, server: str = "") -> dict:
    started = (datetime.now(UTC) - ago).isoformat().replace("+00:00", "Z")
    return {"name": name, "servers": {server: {"ready": True, "pending": None, "started": started, "url": ""}}}


def stopper(store, hub, zone=UTC) -> Stopper:
    return Stopper(NoticeBook(store), hub, None, save_wait=0, zone=lambda: zone)


@pytest.mark.parametrize(
    ("lead", "hours", "before"),
    [
        (LEAD, 4, LEAD),
        (LEAD, 0.1, timedelta(minutes=6)),  # capped by the session: warned from its start
        (timedelta(minutes=0.5), 1, timedelta(seconds=30)),
        (timedelta(minutes=-1), 1, timedelta(0)),
    ],
)
def test_the_lead_is_the_idle_rules_at_most_the_session(lead, hours, before):
    assert warn_lead(lead, hours) == before


@pytest.mark.parametrize(
    ("hours", "words"),
    [
        (4, "Your server will be stopped at 16:00: session limit of 4 hours."),
        (1, "Your server will be stopped at 16:00: session limit of 1 hour."),
        (0.02, "Your server will be stopped at 16:00: session limit of 0.02 hours."),
    ],
)
def test_the_warning_words(hours, words):
    assert session_warning("16:00", hours) == words


async def test_a_server_near_its_limit_is_warned_one_past_it_stopped_one_early_left_alone(store):
    quotas = QuotaBook(store)
    for user in ("near", "past", "early"):
        quotas.record_session_limit(user, "", 4.0)
    hub = FakeHub(
        [
            running("near", timedelta(hours=3, minutes=55)),
            running("past", timedelta(hours=4, minutes=1)),
            running("early", timedelta(hours=3)),
        ]
    )
    berlin = ZoneInfo("Europe/Berlin")
    assert await stop_overlong_servers(quotas, hub, stopper(store, hub, berlin), lead=LEAD) == [("past", "")]
    assert hub.stopped == [("past", "")]
    [warning] = NoticeBook(store).pending()
    began = datetime.fromisoformat(hub.models["near"]["servers"][""]["started"].replace("Z", "+00:00"))
    end = began + timedelta(hours=4)
    assert (warning.user, warning.kind, warning.stop_at) == ("near", KIND, end)
    assert (
        warning.message == f"Your server will be stopped at {end.astimezone(berlin):%H:%M}: session limit of 4 hours."
    )
    assert "Save your work now" in warning.hint
    assert NoticeBook(store).last_done("past").reason == "session limit: 4 h"
    # Another pass changes nothing: the warning stays as it was (same id, same time).
    await stop_overlong_servers(quotas, hub, stopper(store, hub, berlin), lead=LEAD)
    [again] = NoticeBook(store).pending()
    assert (again.id, again.stop_at, again.updated) == (warning.id, warning.stop_at, warning.updated)


async def test_the_warned_server_is_stopped_at_its_limit_with_the_sentence(store):
    quotas = QuotaBook(store)
    quotas.record_session_limit("alice", "", 1.0)
    hub = FakeHub([running("alice", timedelta(minutes=55))])
    await stop_overlong_servers(quotas, hub, stopper(store, hub), lead=LEAD)
    assert [n.kind for n in NoticeBook(store).pending()] == [KIND]
    assert hub.stopped == []
    hub.models["alice"] = running("alice", timedelta(hours=1, seconds=1))
    assert await stop_overlong_servers(quotas, hub, stopper(store, hub), lead=LEAD) == [("alice", "")]
    done = NoticeBook(store).last_done("alice")
    assert done.kind == KIND
    assert ": session limit of 1 hour reached." in done.message
    assert NoticeBook(store).pending() == [], "the warning gave way to the stop"


async def test_the_warning_goes_when_the_server_stops_first_or_starts_a_new_session(store):
    quotas = QuotaBook(store)
    quotas.record_session_limit("alice", "", 1.0)
    quotas.record_session_limit("bob", "gpu", 1.0)
    hub = FakeHub([running("alice", timedelta(minutes=55)), running("bob", timedelta(minutes=58), server="gpu")])
    await stop_overlong_servers(quotas, hub, stopper(store, hub), lead=LEAD)
    assert sorted((n.user, n.server) for n in NoticeBook(store).pending()) == [("alice", ""), ("bob", "gpu")]
    # alice stopped her server; bob's was restarted: a new session, far from its limit.
    hub.models = {"alice": {"name": "alice", "servers": {}}, "bob": running("bob", timedelta(minutes=1), server="gpu")}
    assert await stop_overlong_servers(quotas, hub, stopper(store, hub), lead=LEAD) == []
    assert NoticeBook(store).pending() == []
    assert hub.stopped == []


async def test_a_session_shorter_than_the_lead_is_warned_from_its_start(store):
    quotas = QuotaBook(store)
    quotas.record_session_limit("alice", "", 0.05)  # 3 minutes
    hub = FakeHub([running("alice", timedelta(seconds=5))])
    await stop_overlong_servers(quotas, hub, stopper(store, hub), lead=LEAD)
    [warning] = NoticeBook(store).pending()
    assert 170 < (warning.stop_at - datetime.now(UTC)).total_seconds() <= 175


async def test_a_server_still_starting_is_not_warned(store):
    quotas = QuotaBook(store)
    quotas.record_session_limit("alice", "", 0.05)
    model = running("alice", timedelta(seconds=5))
    model["servers"][""].update(ready=False, pending="spawn")
    hub = FakeHub([model])
    await stop_overlong_servers(quotas, hub, stopper(store, hub), lead=LEAD)
    assert NoticeBook(store).pending() == []
