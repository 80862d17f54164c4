"""``api/gpu/notices`` in a real ``jupyter server``: the hub's notices are stored, counted down, and bad
ones refused."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import requests


def put(server, body, auth: bool = True):
    headers = {"Authorization": f"token {server.token}"} if auth else {}
    return requests.put(server.url + "api/gpu/notices", json=body, headers=headers, timeout=10)


def idle_notice(minutes: float = 10.0, **over) -> dict:
    stop_at = (datetime.now(UTC) + timedelta(minutes=minutes)).isoformat()
    return {
        "id": 7,
        "kind": "idle",
        "message": "Your server will be stopped at 10:30 because its GPU is idle.",
        "hint": "Use the GPU to keep it.",
        "stop_at": stop_at,
        **over,
    }


def test_a_notice_is_kept_and_counted_down_by_the_server_clock(pinned_server):
    assert put(pinned_server, {"notices": [idle_notice(10)]}).status_code == 200
    body = pinned_server.get("api/gpu/notices").json()
    [notice] = body["notices"]
    assert notice["id"] == "7"
    assert notice["kind"] == "idle"
    assert notice["hint"] == "Use the GPU to keep it."
    assert 590 < notice["seconds_left"] <= 600
    assert datetime.fromisoformat(body["now"]).tzinfo is not None
    # An empty list withdraws it.
    assert put(pinned_server, {"notices": []}).status_code == 200
    assert pinned_server.get("api/gpu/notices").json()["notices"] == []


def test_a_stop_time_in_the_past_counts_zero_not_negative(pinned_server):
    assert put(pinned_server, {"notices": [idle_notice(-5)]}).status_code == 200
    assert pinned_server.get("api/gpu/notices").json()["notices"][0]["seconds_left"] == 0
    put(pinned_server, {"notices": []})


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (None, "notices"),
        ([], "notices"),
        ({"notices": "x"}, "notices"),
        ({"notices": [1]}, "JSON object"),
        ({"notices": [{"kind": "idle", "message": "m"}]}, "id"),
        ({"notices": [{"id": True, "kind": "idle", "message": "m"}]}, "id"),
        ({"notices": [{"id": 1, "kind": "", "message": "m"}]}, "kind"),
        ({"notices": [{"id": 1, "kind": "idle"}]}, "message"),
        ({"notices": [{"id": 1, "kind": "idle", "message": "m", "stop_at": "tomorrow"}]}, "ISO 8601"),
        ({"notices": [{"id": 1, "kind": "idle", "message": "m", "stop_at": "2026-12-03T10:00:00"}]}, "time zone"),
        ({"notices": [{"id": 1, "kind": "idle", "message": "m", "stop_at": 5}]}, "ISO 8601"),
        ({"notices": [{"id": 1, "kind": "idle", "message": "m", "colour": "red"}]}, "colour"),
        ({"notices": [{"id": 1, "kind": "idle", "message": "m" * 3000}]}, "2000"),
        ({"notices": [{"id": i, "kind": "idle", "message": "m"} for i in range(17)]}, "16"),
    ],
)
def test_bad_notices_are_refused_with_a_sentence_and_change_nothing(pinned_server, body, words):
    assert put(pinned_server, {"notices": [idle_notice(10)]}).status_code == 200
    before = pinned_server.get("api/gpu/notices").json()["notices"]
    r = put(pinned_server, body)
    assert r.status_code == 400
    assert words in r.json()["message"]
    after = pinned_server.get("api/gpu/notices").json()["notices"]
    assert [n["id"] for n in after] == [n["id"] for n in before] == ["7"]
    put(pinned_server, {"notices": []})


def test_a_body_that_is_not_json_is_refused(pinned_server):
    r = requests.put(
        pinned_server.url + "api/gpu/notices",
        data=b"{nope",
        headers={"Authorization": f"token {pinned_server.token}"},
        timeout=10,
    )
    assert r.status_code == 400
    assert "not JSON" in r.json()["message"]


def test_notices_need_the_server_s_authentication(pinned_server):
    assert pinned_server.get("api/gpu/notices", auth=False).status_code == 403
    assert put(pinned_server, {"notices": [idle_notice()]}, auth=False).status_code == 403
    assert pinned_server.get("api/gpu/notices").json()["notices"] == []


def test_the_hub_says_who_shares_a_time_sliced_gpu(pinned_server):
    sharing = [{"uuid": "GPU-sim-00-t4-16gb", "slots": 4, "others": 2}]
    assert put(pinned_server, {"notices": [], "sharing": sharing}).status_code == 200
    assert pinned_server.get("api/gpu/notices").json()["sharing"] == sharing
    # Sharing left out is none: a service that says nothing of it withdraws it.
    assert put(pinned_server, {"notices": []}).status_code == 200
    assert pinned_server.get("api/gpu/notices").json()["sharing"] == []


@pytest.mark.parametrize(
    ("sharing", "words"),
    [
        ("x", "sharing must be a list"),
        ([{"uuid": "GPU-a", "slots": 2}], '{"uuid": ..., "slots": ..., "others": ...}'),
        ([{"uuid": "", "slots": 2, "others": 0}], "uuid must be a GPU's UUID"),
        ([{"uuid": "GPU-a", "slots": "2", "others": 0}], "whole numbers"),
        ([{"uuid": "GPU-a", "slots": True, "others": 0}], "whole numbers"),
        ([{"uuid": "GPU-a", "slots": 1, "others": 0}], "at least 2 servers"),
        ([{"uuid": "GPU-a", "slots": 2, "others": 2}], "not slots=2, others=2"),
        ([{"uuid": "GPU-a", "slots": 2, "others": -1}], "others=-1"),
        ([{"uuid": f"GPU-{i}", "slots": 2, "others": 0} for i in range(65)], "at most 64"),
    ],
)
def test_bad_sharing_is_refused_with_a_sentence_and_changes_nothing(pinned_server, sharing, words):
    kept = [{"uuid": "GPU-kept", "slots": 2, "others": 1}]
    assert put(pinned_server, {"notices": [idle_notice(10)], "sharing": kept}).status_code == 200
    r = put(pinned_server, {"notices": [], "sharing": sharing})
    assert r.status_code == 400, r.text
    assert words in r.json()["message"], r.text
    body = pinned_server.get("api/gpu/notices").json()
    assert body["sharing"] == kept
    assert [n["id"] for n in body["notices"]] == ["7"]
    put(pinned_server, {"notices": []})
