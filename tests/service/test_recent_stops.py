"""How servers ended, for the admin: the fleet page's recent stops and ``api/usage``'s ends by reason.

Table tests of ``service/ends.py`` on a ledger of known rows (an end of
several GPUs is one end; the sentence where the ledger kept one, else the
reason; paging through the ledger), then the real service: counts by
reason kind for everyone, one user and a group's members, the 404 and 400
sentences, the admin page's table and the CLI.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.service.conftest import shut_down, start_workbench_hub
from workbench_hub.service import ends
from workbench_hub.service.ends import HAS_MESSAGE, ends_by_reason, recent_stops
from workbench_spawner.ledger.store import AllocationStore, utcnow

GPUS = [f"GPU-test-{i}" for i in range(4)]


@pytest.fixture
def store(tmp_path):
    store = AllocationStore(f"sqlite:///{tmp_path / 'wb.sqlite'}")
    yield store
    store.dispose()


def end(store: AllocationStore, user: str, reason: str, gpus: int = 1, server: str = "", message: str = "") -> None:
    """One server's lease, begun and ended with ``reason`` (and the sentence, where the ledger keeps one)."""
    assert store.allocate(user, server, gpus, GPUS, node="node1") is not None
    extra = {"message": message} if HAS_MESSAGE and message else {}
    store.release(user, server, reason, **extra)


def test_an_end_of_several_gpus_is_one_stop_newest_first(store):
    end(store, "alice", "stopped by the user")
    end(store, "bob", "reclaimed: GPU idle 30 min", gpus=3, server="big")
    end(store, "carol", "")
    stops = recent_stops(store)
    assert [(s["user"], s["server"], s["gpus"], s["kind"]) for s in stops] == [
        ("carol", "", 1, "unknown"),
        ("bob", "big", 3, "reclaimed"),
        ("alice", "", 1, "stopped by the user"),
    ]
    assert stops[1]["node"] == "node1"
    assert len(stops[1]["gpu_uuids"]) == 3
    assert stops[1]["message"] == "reclaimed: GPU idle 30 min", "no sentence kept: the reason stands in"


@pytest.mark.skipif(not HAS_MESSAGE, reason="this ledger keeps no sentences yet (gpu_usage.message)")
def test_the_sentence_the_student_was_told_is_shown(store):
    told = "Your server was stopped at 10:30: idle GPU reclaimed after 30 minutes below 5 % use."
    end(store, "alice", "reclaimed: GPU idle 30 min", message=told)
    assert recent_stops(store)[0]["message"] == told


def test_only_the_newest_are_listed_across_pages(store, monkeypatch):
    monkeypatch.setattr(ends, "PAGE", 4)  # several pages of the ledger, an end's rows split between two
    for i in range(7):
        end(store, f"u{i}", "server exited", gpus=3)
    stops = recent_stops(store, limit=5)
    assert [s["user"] for s in stops] == ["u6", "u5", "u4", "u3", "u2"]
    assert all(s["gpus"] == 3 for s in stops), "an end read across a page boundary is still whole"
    assert ends_by_reason(store, utcnow() - timedelta(days=7)) == {"server exited": 7}


def test_ends_are_counted_by_reason_kind_for_some_users_or_all(store):
    for user, reason, gpus in [
        ("alice", "out of memory", 2),
        ("alice", "out of memory", 1),
        ("bob", "out of memory", 1),
        ("bob", "reclaimed: GPU idle 30 min", 2),
        ("carol", "session limit: 4 h", 1),
        ("carol", "preempted: reserved for ml-course", 1),
    ]:
        end(store, user, reason, gpus)
    week = utcnow() - timedelta(days=7)
    assert ends_by_reason(store, week) == {
        "out of memory": 3,
        "preempted": 1,
        "reclaimed": 1,
        "session limit": 1,
    }
    assert next(iter(ends_by_reason(store, week))) == "out of memory", "largest first"
    assert ends_by_reason(store, week, {"alice", "bob"}) == {"out of memory": 3, "reclaimed": 1}
    assert ends_by_reason(store, week, set()) == {}
    assert ends_by_reason(store, utcnow() + timedelta(seconds=1)) == {}, "only ends inside the window"


# -- the real service -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    hub = start_workbench_hub(tmp_path_factory.mktemp("stops") / "hub", {"WORKBENCH_SIMULATED_GPUS": "4"})
    hub.create_users("alice", "bob", "carol")
    assert hub.api("POST", "/groups/ml-course").status_code in (201, 409)
    assert hub.api("POST", "/groups/ml-course/users", json={"users": ["alice", "bob"]}).status_code == 200
    store = AllocationStore(f"sqlite:///{hub.data_dir / 'workbench.sqlite'}")
    try:
        for user, reason, gpus in [
            ("alice", "out of memory", 2),
            ("bob", "out of memory", 1),
            ("bob", "reclaimed: GPU idle 30 min", 1),
            ("carol", "out of memory", 1),
            ("carol", "stopped by the user", 1),
        ]:
            end(store, user, reason, gpus, message=f"{user} was told why")
    finally:
        store.dispose()
    yield hub
    shut_down(hub)


@pytest.mark.integration
def test_usage_counts_ends_by_reason_for_everyone_a_user_and_a_group(hub):
    every = hub.service("GET", "api/usage").json()
    assert every["ends_by_reason"] == {"out of memory": 3, "reclaimed": 1, "stopped by the user": 1}
    assert every["group"] is None
    group = hub.service("GET", "api/usage?group=ml-course").json()
    assert group["group"] == "ml-course"
    assert sorted(u["name"] for u in group["users"]) == ["alice", "bob"]
    assert group["ends_by_reason"] == {"out of memory": 2, "reclaimed": 1}
    assert hub.service("GET", "api/usage?user=carol").json()["ends_by_reason"] == {
        "out of memory": 1,
        "stopped by the user": 1,
    }


@pytest.mark.integration
def test_a_bad_group_is_404_and_a_user_with_a_group_is_400(hub):
    missing = hub.service("GET", "api/usage?group=no-such-course")
    assert missing.status_code == 404
    assert missing.json()["message"].startswith('no group named "no-such-course" on this hub')
    both = hub.service("GET", "api/usage?group=ml-course&user=alice")
    assert both.status_code == 400
    assert "not both" in both.json()["message"]
    student = hub.user_token("carol")
    refused = hub.service("GET", "api/usage?group=ml-course", token=student)
    assert refused.status_code == 403
    assert "custom:workbench:read" in refused.json()["message"]
    own = hub.service("GET", "api/usage", token=student).json()
    assert own["ends_by_reason"] == {"out of memory": 1, "stopped by the user": 1}, "a student counts their own"


@pytest.mark.integration
def test_the_fleet_page_lists_recent_stops(hub):
    page = hub.service("GET", "", validate=False)
    assert page.status_code == 200, page.text[-2000:]
    html = page.text
    assert '<section class="mb-4" id="workbench-stops">' in html
    assert "Recent stops" in html
    table = html[html.index('id="workbench-stops-table"') :]
    assert table.count('<tr data-user="') == 5
    assert '<tr data-user="carol" data-kind="stopped by the user">' in table, "newest first"
    assert "<td>node1</td>" in table
    assert ">2</td>" in table
    expected = "carol was told why" if HAS_MESSAGE else "stopped by the user"
    assert f'<td class="wb-message">{expected}</td>' in table
    assert 'data-kind="out of memory">out of memory 3</span>' in html


@pytest.mark.integration
def test_the_cli_counts_a_groups_ends(hub):
    done = hub.cli("usage", "--group", "ml-course")
    assert done.returncode == 0, done.stderr
    assert "(group ml-course)" in done.stdout
    assert "Servers ended in that window: 3 (2 out of memory, 1 reclaimed)" in done.stdout
    missing = hub.cli("usage", "--group", "nope")
    assert missing.returncode != 0
    assert 'no group named "nope"' in missing.stderr
