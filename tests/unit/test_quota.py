"""The effective-quota rule, quota bodies (checked against the service's document, then read) and the
GPU-hours ledger; quotas by kind (whole GPUs, MIG profiles). A slice-hour's share: test_slice_hours."""

from __future__ import annotations

import math
import socket
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import create_engine, inspect, text

from workbench_hub.service.openapi import BodyError, load_document, validate_body
from workbench_spawner.ledger.gpu_hours import gpu_hours_by_user, gpu_hours_used
from workbench_spawner.ledger.migrations import HEAD, current, downgrade, upgrade
from workbench_spawner.ledger.quota_book import QuotaBook
from workbench_spawner.ledger.store import AllocationStore, UsageRow
from workbench_spawner.rules.quota import (
    Quota,
    QuotaError,
    effective_quota,
    quota_from_body,
)

DEFAULT = Quota(max_gpus=1)
MODELS = ["A100-40GB", "H100-80GB"]
DOC = load_document()


def read_quota(body, models=None) -> Quota:
    """What PUT api/quotas/... does with a body: check it against the document (``QuotaBody``), then read it."""
    validate_body(DOC, "QuotaBody", body)
    return quota_from_body(body, models)


# -- the rule -------------------------------------------------------------------------


def test_own_quota_wins_even_when_a_group_is_more_generous():
    eff = effective_quota(Quota(0), {"ml-course": Quota(4)}, DEFAULT)
    assert eff.quota.max_gpus == 0
    assert eff.source == "user"
    assert eff.origin == "own quota"
    assert eff.describe == "your own GPU quota"


def test_most_generous_group_wins_part_by_part():
    groups = {
        "intro": Quota(1, gpu_hours_per_week=None),
        "ml-course": Quota(2, gpu_hours_per_week=10),
        "thesis": Quota(2, gpu_hours_per_week=20),
    }
    eff = effective_quota(None, groups, DEFAULT)
    assert (eff.source, eff.group, eff.origin) == ("group", "thesis", "from group thesis")
    # No limit beats any limit; any model beats a list.
    eff = effective_quota(None, {"a": Quota(2, 20), "b": Quota(2, None)}, DEFAULT)
    assert eff.group == "b"
    eff = effective_quota(None, {"a": Quota(1, allowed_models=("A100-40GB",)), "b": Quota(1)}, DEFAULT)
    assert eff.group == "b"
    assert eff.describe == "the GPU quota of group b"


def test_ties_go_to_the_group_name_that_sorts_first():
    eff = effective_quota(None, {"zeta": Quota(1), "alpha": Quota(1)}, DEFAULT)
    assert eff.group == "alpha"


def test_default_when_nothing_is_set():
    eff = effective_quota(None, {}, DEFAULT)
    assert eff.quota == DEFAULT
    assert eff.source == "default"
    assert eff.describe == "the default quota"


def test_the_book_applies_the_rule_and_ignores_other_groups(store):
    book = QuotaBook(store)
    book.set("group", "ml-course", Quota(2, 10.0, ("H100-80GB",)), by="user:admin")
    book.set("group", "other", Quota(4))
    eff = book.effective("alice", ["ml-course"], DEFAULT)
    assert eff.origin == "from group ml-course"
    assert eff.quota == Quota(2, 10.0, ("H100-80GB",))
    book.set("user", "alice", Quota(0))
    assert book.effective("alice", ["ml-course"], DEFAULT).quota.max_gpus == 0
    assert book.delete("user", "alice")
    assert not book.delete("user", "alice")
    assert book.effective("bob", [], DEFAULT).source == "default"
    assert book.get("group", "ml-course").updated_by == "user:admin"


def test_effective_many_applies_the_rule_to_every_user_in_one_query(store):
    from sqlalchemy import event

    book = QuotaBook(store)
    book.set("group", "ml-course", Quota(2))
    book.set("group", "thesis", Quota(3, 40.0))
    book.set("user", "carol", Quota(0))
    users = {
        "alice": ["ml-course"],
        "bob": ["ml-course", "thesis"],
        "carol": ["thesis"],
        "dave": [],
        "erin": ["nobody-set-this"],
    }
    statements = []

    def listener(*args) -> None:
        statements.append(args[2])

    event.listen(store.read_engine, "before_cursor_execute", listener)
    try:
        many = book.effective_many(users, DEFAULT)
    finally:
        event.remove(store.read_engine, "before_cursor_execute", listener)
    assert len([s for s in statements if "gpu_quotas" in s]) == 1, statements
    assert many == {name: book.effective(name, groups, DEFAULT) for name, groups in users.items()}
    assert (many["bob"].group, many["carol"].source, many["dave"].source) == ("thesis", "user", "default")


def test_the_shortest_session_limit_is_accepted():
    assert read_quota({"max_gpus": 1, "max_session_hours": 0.01}).max_session_hours == 0.01


# -- validation -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"max_gpus": -1}, "max_gpus must be between 0 and 1024, not -1"),
        ({"max_gpus": 1.5}, "max_gpus must be a whole number, not 1.5"),
        ({"max_gpus": 10**12}, "max_gpus must be between 0 and 1024, not 1000000000000"),
        ({"max_gpus": "two"}, 'max_gpus must be a whole number, not "two"'),
        ({"max_gpus": True}, "max_gpus must be a whole number, not true"),
        ({"max_gpus": math.inf}, "max_gpus must be a finite number, not Infinity"),
        ({"max_gpus": math.nan}, "max_gpus must be a finite number, not NaN"),
        ({}, "max_gpus is missing"),
        ({"max_gpus": None}, "max_gpus must be a whole number, not null"),
        ({"max_gpus": 1, "gpu_hours_per_week": -2}, "gpu_hours_per_week must be between 0 and 1000000, not -2"),
        ({"max_gpus": 1, "gpu_hours_per_week": "ten"}, "gpu_hours_per_week must be a number or null"),
        ({"max_gpus": 1, "gpu_hours_per_week": 1e300}, "gpu_hours_per_week must be between 0 and 1000000, not 1e+300"),
        ({"max_gpus": 1, "max_session_hours": 0}, "max_session_hours must be between 0.01 and 8784, not 0"),
        ({"max_gpus": 1, "max_session_hours": 1e-130}, "max_session_hours must be between 0.01 and 8784, not 1e-130"),
        ({"max_gpus": 1, "max_session_hours": 0.009}, "max_session_hours must be between 0.01 and 8784, not 0.009"),
        ({"max_gpus": 1, "allowed_models": "H100-80GB"}, "allowed_models must be a list or null"),
        ({"max_gpus": 1, "allowed_models": ["<script>"]}, "allowed_models[0] must be a GPU model name"),
        ({"max_gpus": 1, "allowed_models": [" H100-80GB"]}, "allowed_models[0] must be a GPU model name"),
        ({"max_gpus": 1, "allowed_models": ["H100-80GB"] * 65}, "allowed_models may have at most 64 items, not 65"),
        ({"max_gpus": 1, "allowed_models": ["V100"]}, 'unknown GPU model "V100"; this hub has: A100-40GB, H100-80GB'),
        ({"max_gpus": 1, "colour": "red"}, "unknown field 'colour'; a quota has max_gpus, "),
        ({"max_gpus": 1, "whole_gpus": "yes"}, 'whole_gpus must be true or false, not "yes"'),
        ({"max_gpus": 1, "whole_gpus": None}, "whole_gpus must be true or false, not null"),
        ({"max_gpus": 1, "allowed_profiles": "1g.18gb"}, 'allowed_profiles must be a list or null, not "1g.18gb"'),
        ({"max_gpus": 1, "allowed_profiles": [7]}, "allowed_profiles[0] must be text, not 7"),
        ({"max_gpus": 1, "allowed_profiles": ["1g.18gb"] * 65}, "allowed_profiles may have at most 64 items, not 65"),
        (
            {"max_gpus": 1, "allowed_profiles": ["1x.5gb"]},
            "allowed_profiles: '1x.5gb' is not a MIG profile; profiles read like 1g.18gb or 3g.71gb",
        ),
        (
            {"max_gpus": 1, "allowed_profiles": ["1g.18gb", "H100-80GB"]},
            "allowed_profiles: 'H100-80GB' is not a MIG profile; profiles read like 1g.18gb or 3g.71gb",
        ),
        ({"max_gpus": 1, "allowed_profiles": ["8g.99gb"]}, "allowed_profiles: '8g.99gb' is not a MIG profile"),
        (
            {"max_gpus": 1, "whole_gpus": False, "allowed_profiles": []},
            "whole_gpus is false and allowed_profiles is [], so this quota allows neither whole GPUs nor any MIG "
            "slice; set max_gpus to 0 for CPU only, or allow a profile",
        ),
        ([1, 2], "the body must be a JSON object"),
        ("max_gpus=1", "the body must be a JSON object"),
    ],
)
def test_bad_quotas_are_refused_with_a_reason(body, message):
    # The schema's refusals are BodyError, the inventory's QuotaError: both a sentence naming the field.
    with pytest.raises((BodyError, QuotaError)) as refused:
        read_quota(body, MODELS)
    assert message in str(refused.value)


def test_a_good_quota_is_normalised():
    quota = read_quota(
        {
            "max_gpus": 2.0,
            "gpu_hours_per_week": 10,
            "allowed_models": ["h100-80gb ", "H100-80GB"],
            "max_session_hours": 4,
        },
        MODELS,
    )
    assert quota == Quota(2, 10.0, ("H100-80GB",), 4.0)
    assert isinstance(quota.max_gpus, int)
    assert isinstance(quota.gpu_hours_per_week, float)
    assert read_quota({"max_gpus": 0, "allowed_models": []}, MODELS).allowed_models == ()
    assert read_quota({"max_gpus": 1, "allowed_models": ["V100"]}).allowed_models == ("V100",)  # no inventory: any


# -- quotas by kind: whole GPUs and MIG profiles ---------------------------------------------------


def test_kind_parts_are_normalised_and_missing_ones_keep_their_defaults():
    assert read_quota({"max_gpus": 1}) == Quota(1, whole_gpus=True, allowed_profiles=None)
    student = read_quota({"max_gpus": 1, "whole_gpus": False, "allowed_profiles": [" 1G.18GB", "1g.18gb", "3g.71gb"]})
    assert student == Quota(1, whole_gpus=False, allowed_profiles=("1g.18gb", "3g.71gb"))
    research = read_quota({"max_gpus": 4, "allowed_profiles": []})
    assert research == Quota(4, whole_gpus=True, allowed_profiles=())
    assert read_quota({"max_gpus": 1, "allowed_profiles": None}).allowed_profiles is None
    # CPU only may say so with the kind parts too.
    assert read_quota({"max_gpus": 0, "whole_gpus": False, "allowed_profiles": []}).max_gpus == 0
    assert student.to_json()["allowed_profiles"] == ["1g.18gb", "3g.71gb"]
    assert student.to_json()["whole_gpus"] is False
    assert Quota.from_json(student.to_json()) == student
    assert Quota.from_json({"max_gpus": 2}) == Quota(2), "a quota written before MIG: whole GPUs and any slice"


@pytest.mark.parametrize(
    ("quota", "profile", "allowed"),
    [
        (Quota(1), "", True),
        (Quota(1), "1g.18gb", True),
        (Quota(1, whole_gpus=False), "", False),
        (Quota(1, whole_gpus=False), "3g.71gb", True),
        (Quota(1, whole_gpus=False, allowed_profiles=("1g.18gb",)), "1g.18gb", True),
        (Quota(1, whole_gpus=False, allowed_profiles=("1g.18gb",)), "1G.18GB", True),
        (Quota(1, whole_gpus=False, allowed_profiles=("1g.18gb",)), "2g.35gb", False),
        (Quota(1, whole_gpus=False, allowed_profiles=("1g.18gb",)), "", False),
        (Quota(4, allowed_profiles=()), "1g.18gb", False),
        (Quota(4, allowed_profiles=()), "", True),
    ],
)
def test_allows_profile(quota, profile, allowed):
    assert quota.allows_profile(profile) is allowed


def test_the_most_generous_group_compares_the_kind_parts_after_the_models():
    slices_only = Quota(1, whole_gpus=False)
    assert effective_quota(None, {"a": slices_only, "b": Quota(1)}, DEFAULT).group == "b", "whole GPUs beat none"
    one = Quota(1, allowed_profiles=("1g.18gb",))
    two = Quota(1, allowed_profiles=("1g.18gb", "2g.35gb"))
    assert effective_quota(None, {"a": one, "b": Quota(1)}, DEFAULT).group == "b", "any profile beats a list"
    assert effective_quota(None, {"a": one, "b": two}, DEFAULT).group == "b", "a longer list beats a shorter"
    assert effective_quota(None, {"a": Quota(1, allowed_profiles=()), "b": one}, DEFAULT).group == "b"
    # Whole GPUs come before profiles: a list with whole GPUs beats any slice without them.
    assert effective_quota(None, {"a": Quota(1, whole_gpus=False), "b": one}, DEFAULT).group == "b"
    # ... and after the models: any model wins even without whole GPUs.
    models = Quota(1, allowed_models=("H100-80GB",))
    assert effective_quota(None, {"a": models, "b": Quota(1, whole_gpus=False)}, DEFAULT).group == "b"
    # ... and before the session length.
    longer = Quota(1, whole_gpus=False, max_session_hours=None)
    assert effective_quota(None, {"a": longer, "b": Quota(1, max_session_hours=1.0)}, DEFAULT).group == "b"


def test_the_book_stores_the_kind_parts(store):
    book = QuotaBook(store)
    book.set("group", "students", Quota(1, whole_gpus=False, allowed_profiles=("1g.18gb",)))
    book.set("group", "research", Quota(4, allowed_profiles=()))
    assert book.get("group", "students").quota == Quota(1, whole_gpus=False, allowed_profiles=("1g.18gb",))
    assert book.get("group", "research").quota.allowed_profiles == ()
    book.set("group", "research", Quota(4))
    assert book.get("group", "research").quota.allowed_profiles is None


# -- the ledger ----------------------------------------------------------------------------

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def _usage(store, user, started, ended, gpu="GPU-sim-00-h100-80gb"):
    with store._sessions.begin() as session:
        session.add(UsageRow(gpu_uuid=gpu, user=user, server="", started=started, ended=ended, reason="stopped"))


def test_usage_is_clipped_at_the_start_of_the_rolling_week(store):
    # 10 hours, of which the last 4 are inside the week ending NOW.
    week_start = NOW - timedelta(days=7)
    _usage(store, "alice", week_start - timedelta(hours=6), week_start + timedelta(hours=4))
    # Entirely before the window: not counted.
    _usage(store, "alice", week_start - timedelta(days=2), week_start - timedelta(days=1))
    # Two GPUs for 1.5 hours yesterday: 3 GPU-hours.
    for gpu in ("GPU-sim-00-h100-80gb", "GPU-sim-01-h100-80gb"):
        _usage(store, "alice", NOW - timedelta(days=1), NOW - timedelta(days=1) + timedelta(hours=1.5), gpu)
    _usage(store, "bob", NOW - timedelta(hours=2), NOW - timedelta(hours=1))
    assert gpu_hours_used(store, "alice", now=NOW) == pytest.approx(7.0)
    assert gpu_hours_by_user(store, now=NOW) == pytest.approx({"alice": 7.0, "bob": 1.0})
    # A day later the 4 hours at the old boundary have left the window.
    assert gpu_hours_used(store, "alice", now=NOW + timedelta(days=1)) == pytest.approx(3.0)
    # Eight days later nothing is left.
    assert gpu_hours_used(store, "alice", now=NOW + timedelta(days=8)) == 0.0


def test_running_leases_count_until_now_and_survive_a_restart(db_url):
    url = db_url
    first = AllocationStore(url)
    first.allocate("alice", "", 2, ["GPU-a", "GPU-b", "GPU-c"])
    lease = first.lease_of("alice", "")
    QuotaBook(first).set("user", "alice", Quota(2, 5.0))
    first.dispose()

    # The hub restarts: a new store on the same database sees the same lease and quota.
    second = AllocationStore(url)
    later = lease.since + timedelta(hours=1)
    assert gpu_hours_used(second, "alice", now=later) == pytest.approx(2.0)
    assert QuotaBook(second).get("user", "alice").quota == Quota(2, 5.0)
    second.release("alice", "", "stopped")
    used = gpu_hours_used(second, "alice")
    assert 0 <= used < 0.01  # released seconds after allocation
    second.dispose()
    third = AllocationStore(url)
    assert gpu_hours_used(third, "alice") == pytest.approx(used, abs=1e-6)
    third.dispose()


def test_session_limits_are_recorded_per_server(store):
    book = QuotaBook(store)
    book.record_session_limit("alice", "", 2.0)
    book.record_session_limit("alice", "", 3.0)
    book.record_session_limit("bob", "big", None)
    assert book.session_limits() == {("alice", ""): 3.0}


# -- migrations -------------------------------------------------------------------------


def test_a_new_database_is_migrated_to_head(db_url):
    store = AllocationStore(db_url)
    tables = set(inspect(store.engine).get_table_names())
    assert {"gpu_leases", "gpu_usage", "gpu_quotas", "gpu_session_limits", "alembic_version"} <= tables
    assert current(store.engine) == HEAD
    store.dispose()


def test_a_database_made_by_create_all_before_migrations_is_adopted(db_url):
    url = db_url
    engine = create_engine(url)
    # The tables as create_all made them before migrations (no node column), in each engine's words:
    # an autoincrementing key is INTEGER PRIMARY KEY on SQLite, SERIAL on PostgreSQL; "user" is
    # quoted because it is a reserved word on PostgreSQL.
    if engine.dialect.name == "postgresql":
        key, stamp = "SERIAL PRIMARY KEY", "TIMESTAMP WITH TIME ZONE"
    else:
        key, stamp = "INTEGER PRIMARY KEY", "DATETIME"
    with engine.begin() as conn:
        conn.execute(
            text(
                f"CREATE TABLE gpu_leases (id {key}, gpu_uuid VARCHAR(128), slot INTEGER, "
                f'"user" VARCHAR(255), server VARCHAR(255), since {stamp}, ref VARCHAR(255), '
                "CONSTRAINT one_holder_per_slot UNIQUE (gpu_uuid, slot))"
            )
        )
        conn.execute(
            text(
                f'CREATE TABLE gpu_usage (id {key}, gpu_uuid VARCHAR(128), "user" VARCHAR(255), '
                f"server VARCHAR(255), started {stamp}, ended {stamp}, reason VARCHAR(64))"
            )
        )
    with engine.begin() as conn:
        conn.execute(
            text(
                'INSERT INTO gpu_usage (gpu_uuid, "user", server, started, ended, reason) VALUES '
                "('GPU-a', 'alice', '', '2026-12-01 10:00:00', '2026-12-01 12:00:00', 'stopped')"
            )
        )
    engine.dispose()
    store = AllocationStore(url)
    assert current(store.engine) == HEAD
    assert "gpu_quotas" in inspect(store.engine).get_table_names()
    assert len(store.usage(user="alice")) == 1
    assert store.usage(user="alice")[0].node == socket.gethostname(), "old rows came from this host"
    QuotaBook(store).set("user", "alice", Quota(1))
    store.dispose()
    # Opening it again is a no-op.
    again = AllocationStore(url)
    assert QuotaBook(again).get("user", "alice").quota == Quota(1)
    again.dispose()


def insert_old_group_quota(conn) -> None:
    """A group quota as a release before the kind parts stored it (only the columns it had)."""
    conn.execute(
        text(
            "INSERT INTO gpu_quotas (kind, name, max_gpus, updated, updated_by) VALUES "
            "('group', 'old', 2, '2026-12-01 10:00:00', '')"
        )
    )


def test_migration_0005_gives_old_rows_whole_gpu_shares_and_old_quotas_every_kind(store):
    downgrade(store.engine, "0004")
    assert current(store.engine) == "0004"
    assert "share" not in {c["name"] for c in inspect(store.engine).get_columns("gpu_leases")}
    assert "whole_gpus" not in {c["name"] for c in inspect(store.engine).get_columns("gpu_quotas")}
    with store.engine.begin() as conn:
        conn.execute(
            text(
                'INSERT INTO gpu_leases (gpu_uuid, slot, "user", server, since, ref, node, groups) VALUES '
                "('GPU-a', 0, 'alice', '', '2026-12-02 05:00:00', '', 'n', '[]')"
            )
        )
        conn.execute(
            text(
                'INSERT INTO gpu_usage (gpu_uuid, "user", server, started, ended, reason, node) VALUES '
                "('GPU-a', 'bob', '', '2026-12-02 08:00:00', '2026-12-02 10:00:00', 'stopped', 'n')"
            )
        )
        insert_old_group_quota(conn)
    upgrade(store.engine)
    assert current(store.engine) == HEAD
    assert store.lease_of("alice", "").shares == (1.0,)
    assert store.usage(user="bob")[0].share == 1.0
    assert gpu_hours_by_user(store, now=NOW) == pytest.approx({"alice": 7.0, "bob": 2.0})
    assert QuotaBook(store).get("group", "old").quota == Quota(2, whole_gpus=True, allowed_profiles=None)


def test_migration_0006_lets_old_quotas_have_time_sliced_gpus(store):
    downgrade(store.engine, "0005")
    assert "shared_gpus" not in {c["name"] for c in inspect(store.engine).get_columns("gpu_quotas")}
    with store.engine.begin() as conn:
        insert_old_group_quota(conn)
    upgrade(store.engine)
    assert current(store.engine) == HEAD
    book = QuotaBook(store)
    assert book.get("group", "old").quota.shared_gpus is True
    book.set("group", "thesis", Quota(1, shared_gpus=False))
    assert book.get("group", "thesis").quota == Quota(1, shared_gpus=False)


def test_allowing_shared_gpus_is_the_more_generous_group_quota():
    strict, lenient = Quota(1, shared_gpus=False), Quota(1)
    chosen = effective_quota(None, {"a-thesis": strict, "b-intro": lenient}, DEFAULT)
    assert (chosen.group, chosen.quota.shared_gpus) == ("b-intro", True)
    assert Quota.from_json(strict.to_json()) == strict
    assert quota_from_body({"max_gpus": 1, "shared_gpus": False}) == strict
