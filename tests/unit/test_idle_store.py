"""Notices, idle clocks, exemptions, the quota's idle fields and the hub's idle settings, with their refusals."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import inspect

from workbench_hub.configurer import ConfigError, proxy_url, update_idle
from workbench_hub.service.openapi import BodyError, load_document, validate_body
from workbench_spawner.ledger.idle_book import ExemptionError, IdleBook
from workbench_spawner.ledger.migrations import current, downgrade, upgrade
from workbench_spawner.ledger.notices import NoticeBook, render_stop_notice
from workbench_spawner.ledger.quota_book import QuotaBook
from workbench_spawner.rules.idle import GpuTrack
from workbench_spawner.rules.quota import Quota, quota_from_body

T0 = datetime(2026, 12, 8, 10, 0, tzinfo=UTC)
DOC = load_document()  # the service's API document: what request bodies are checked against


# -- notices ----------------------------------------------------------------------------


def test_a_warning_is_one_live_notice_per_server_and_kind(store):
    clock = [T0]
    book = NoticeBook(store, clock=lambda: clock[0])
    first = book.warn("alice", "", kind="idle", message="m1", stop_at=T0 + timedelta(minutes=10))
    again = book.warn("alice", "", kind="idle", message="m2", stop_at=T0 + timedelta(minutes=12))
    book.warn("alice", "", kind="preempt", message="p", stop_at=T0 + timedelta(minutes=5))
    book.warn("alice", "big", kind="idle", message="other server")
    assert again.id == first.id
    assert [(n.server, n.kind, n.message) for n in book.pending("alice")] == [
        ("", "idle", "m2"),
        ("", "preempt", "p"),
        ("big", "idle", "other server"),
    ]
    assert book.pending("alice", "")[0].to_json(T0)["seconds_left"] == 720
    assert book.clear("alice", "", kind="idle") is True
    assert book.clear("alice", "", kind="idle") is False
    assert [n.kind for n in book.pending("alice", "")] == ["preempt"]


def test_done_records_why_for_the_spawn_page_and_the_ledger(store):
    clock = [T0]
    book = NoticeBook(store, clock=lambda: clock[0])
    book.warn("alice", "", kind="idle", message="will stop", stop_at=T0)
    book.done("alice", "", kind="idle", message="stopped <because>", reason="reclaimed: GPU idle 30 min")
    assert book.pending("alice") == []
    assert book.announced("alice", "", since=T0 - timedelta(hours=1)).reason == "reclaimed: GPU idle 30 min"
    # A stop announced before this lease began is not this stop's reason.
    assert book.announced("alice", "", since=T0 + timedelta(seconds=1)) is None
    html = render_stop_notice(book.last_done("alice", ""))
    assert "stopped &lt;because&gt;" in html
    assert "<because>" not in html
    assert book.acknowledge("alice", "") == 1
    assert book.last_done("alice", "") is None
    assert render_stop_notice(None) == ""
    assert book.prune(T0 + timedelta(seconds=1)) == 2


@pytest.mark.parametrize("kind", ["", "x" * 33])
def test_a_notice_needs_a_short_kind(store, kind):
    with pytest.raises(ValueError, match="kind must be 1 to 32 characters"):
        NoticeBook(store).warn("alice", "", kind=kind, message="m")
    assert NoticeBook(store).pending() == []


# -- idle clocks and exemptions ------------------------------------------------------------


def test_saving_tracks_replaces_the_set(store):
    book = IdleBook(store)
    a = GpuTrack("n", "GPU-a", "alice", "", idle_since=T0, last_reading=T0, utilization=0.0, source="host")
    b = GpuTrack("n", "GPU-b", "bob", "", last_reading=T0, utilization=80.0, source="server")
    book.save([a, b])
    assert sorted(t.gpu_uuid for t in book.tracks()) == ["GPU-a", "GPU-b"]
    book.save([b])
    assert book.tracks() == [b]
    book.forget("bob", "")
    assert book.tracks() == []


@pytest.mark.parametrize("group", ["", "a/b", " pad", "x" * 256, None])
def test_bad_exemptions_are_refused_and_change_nothing(store, group):
    book = IdleBook(store)
    book.exempt("research", "long runs", by="user:admin")
    with pytest.raises(ExemptionError):
        book.exempt(group, "")
    assert list(book.exempt_groups()) == ["research"]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"reason": "r" * 501}, "reason must be at most 500 characters long, not 501"),
        ({"reason": 5}, "reason must be text or null, not 5"),
        ({"why": "x"}, "unknown field 'why'; an idle exemption has reason"),
        (["reason"], "the body must be a JSON object"),
    ],
)
def test_bad_exemption_bodies_are_refused_by_the_document(body, words):
    with pytest.raises(BodyError) as refused:
        validate_body(DOC, "IdleExemptionBody", body)
    assert words in str(refused.value)


def test_exempt_and_unexempt(store):
    book = IdleBook(store)
    row = book.exempt("research", "long runs", by="user:admin")
    assert row["reason"] == "long runs"
    assert row["created_by"] == "user:admin"
    assert book.exempt("research", "other")["reason"] == "other"
    assert book.unexempt("research") is True
    assert book.unexempt("research") is False


# -- the quota's idle fields ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "quota"),
    [
        ({"max_gpus": 1}, Quota(1)),
        ({"max_gpus": 1, "gpu_idle_minutes": 30}, Quota(1, gpu_idle_minutes=30.0)),
        ({"max_gpus": 1, "gpu_idle_minutes": 0}, Quota(1, gpu_idle_minutes=0.0)),
        (
            {"max_gpus": 1, "gpu_idle_minutes": 0.1, "gpu_idle_threshold": 12.5},
            Quota(1, gpu_idle_minutes=0.1, gpu_idle_threshold=12.5),
        ),
        ({"max_gpus": 1, "gpu_idle_minutes": None, "gpu_idle_threshold": None}, Quota(1)),
    ],
)
def test_idle_fields_of_a_quota(body, quota):
    validate_body(DOC, "QuotaBody", body)
    assert quota_from_body(body) == quota


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"max_gpus": 1, "gpu_idle_minutes": -1}, "gpu_idle_minutes must be between 0 and 10080, not -1"),
        ({"max_gpus": 1, "gpu_idle_minutes": 0.01}, "gpu_idle_minutes must be 0 or between 0.05 and 10080, not 0.01"),
        ({"max_gpus": 1, "gpu_idle_minutes": 1e9}, "gpu_idle_minutes must be between 0 and 10080, not 1000000000"),
        ({"max_gpus": 1, "gpu_idle_minutes": "30"}, 'gpu_idle_minutes must be a number or null, not "30"'),
        ({"max_gpus": 1, "gpu_idle_minutes": True}, "gpu_idle_minutes must be a number or null, not true"),
        ({"max_gpus": 1, "gpu_idle_threshold": 0}, "gpu_idle_threshold must be more than 0 and at most 100, not 0"),
        ({"max_gpus": 1, "gpu_idle_threshold": 101}, "gpu_idle_threshold must be more than 0 and at most 100, not 101"),
        ({"max_gpus": 1, "gpu_idle_threshold": float("nan")}, "gpu_idle_threshold must be a finite number, not NaN"),
    ],
)
def test_bad_idle_fields_are_refused(store, body, words):
    book = QuotaBook(store)
    book.set("user", "alice", Quota(1, gpu_idle_minutes=30.0))
    with pytest.raises(BodyError) as refused:
        validate_body(DOC, "QuotaBody", body)
    assert str(refused.value) == words
    assert book.get("user", "alice").quota == Quota(1, gpu_idle_minutes=30.0)


def test_idle_fields_are_stored_and_the_most_generous_group_wins(store):
    book = QuotaBook(store)
    book.set("group", "a", Quota(1, gpu_idle_minutes=30.0, gpu_idle_threshold=5.0))
    book.set("group", "b", Quota(1, gpu_idle_minutes=0.0))
    book.set("group", "c", Quota(1))
    assert book.get("group", "a").quota.gpu_idle_threshold == 5.0
    assert book.effective("x", ["a", "c"], Quota(1)).group == "a", "a limit beats no opinion"
    assert book.effective("x", ["a", "b", "c"], Quota(1)).group == "b", "never reclaimed beats a limit"


# -- migration 0003 ---------------------------------------------------------------------------


def test_migration_0003_adds_and_removes_its_tables_and_columns(store):
    tables = set(inspect(store.engine).get_table_names())
    assert {"gpu_idle_tracks", "workbench_notices", "gpu_idle_exemptions"} <= tables
    downgrade(store.engine, "0002")
    assert current(store.engine) == "0002"
    assert "workbench_notices" not in inspect(store.engine).get_table_names()
    assert "gpu_idle_minutes" not in {c["name"] for c in inspect(store.engine).get_columns("gpu_quotas")}
    upgrade(store.engine)
    assert "gpu_idle_minutes" in {c["name"] for c in inspect(store.engine).get_columns("gpu_quotas")}


# -- the hub's settings ---------------------------------------------------------------------


class Traits:
    pass


@pytest.mark.parametrize(
    ("env", "minutes", "threshold", "warn"),
    [
        ({}, 0.0, 5.0, 10.0),
        ({"WORKBENCH_GPU_IDLE_MINUTES": "30"}, 30.0, 5.0, 10.0),
        (
            {
                "WORKBENCH_GPU_IDLE_MINUTES": "0.2",
                "WORKBENCH_GPU_IDLE_THRESHOLD": "10",
                "WORKBENCH_GPU_IDLE_WARN_MINUTES": "5",
            },
            0.2,
            10.0,
            5.0,
        ),
    ],
)
def test_idle_environment_becomes_traits(env, minutes, threshold, warn):
    mixin = Traits()
    update_idle(mixin, env)
    assert (mixin.gpu_idle_minutes, mixin.gpu_idle_threshold, mixin.gpu_idle_warn_minutes) == (minutes, threshold, warn)


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"WORKBENCH_GPU_IDLE_MINUTES": "soon"}, "WORKBENCH_GPU_IDLE_MINUTES"),
        ({"WORKBENCH_GPU_IDLE_MINUTES": "-5"}, "non-negative"),
        ({"WORKBENCH_GPU_IDLE_MINUTES": "0.01"}, "between"),
        ({"WORKBENCH_GPU_IDLE_MINUTES": "nan"}, "between"),
        ({"WORKBENCH_GPU_IDLE_THRESHOLD": "0"}, "percentage"),
        ({"WORKBENCH_GPU_IDLE_THRESHOLD": "150"}, "percentage"),
        ({"WORKBENCH_GPU_IDLE_WARN_MINUTES": "inf"}, "WORKBENCH_GPU_IDLE_WARN_MINUTES"),
    ],
)
def test_bad_idle_environment_stops_the_hub_with_a_sentence(env, words):
    with pytest.raises(ConfigError, match=words):
        update_idle(Traits(), env)


@pytest.mark.parametrize(
    ("bind", "url"),
    [
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("http://0.0.0.0:9000", "http://127.0.0.1:9000"),
        ("https://:443", "https://127.0.0.1:443"),
        ("http://[::]:8000", "http://[::1]:8000"),
        ("http://hub.example.edu:8000", "http://hub.example.edu:8000"),
    ],
)
def test_the_service_reaches_user_servers_through_the_proxy(bind, url):
    from traitlets.config import Config

    c = Config()
    c.JupyterHub.bind_url = bind
    assert proxy_url(c) == url
