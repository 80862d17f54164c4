"""An upgrade keeps every row: GPU databases made by older releases, opened by this one.

The fixtures (``tests/fixtures/releases/<day>.sql`` for SQLite,
``<day>.postgresql.sql`` for PostgreSQL) were made by the releases of
2026-12-04 and 2026-12-06 themselves: their own migrations on a new database
and a row in every table written by their own books
(``make_release_db.py`` says how, and remakes them from git history; this
test needs no history). Each test loads one into a new database, reads every row
with plain SQL, opens it with this release's ``AllocationStore`` (which
migrates it), and checks that every row is still there with its values, that
the columns added since hold their documented defaults, and that this
release's own books read the rows as the operator set them: quotas in force,
reservations listed, the ledger's hours, the servers' leases, notices, idle
clocks, drains, the reconciler's counts, the published settings and the
hub's id.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.pool import NullPool

from tests.postgres.server import fresh_database
from workbench_spawner.ledger.drain_book import DrainBook
from workbench_spawner.ledger.gpu_hours import gpu_hours_by_user
from workbench_spawner.ledger.hub_identity import hub_id
from workbench_spawner.ledger.idle_book import IdleBook
from workbench_spawner.ledger.migrations import HEAD, current
from workbench_spawner.ledger.notices import NoticeBook
from workbench_spawner.ledger.quota_book import QuotaBook
from workbench_spawner.ledger.reconcile_book import ReconcileBook
from workbench_spawner.ledger.release_book import releases
from workbench_spawner.ledger.reservation_book import ReservationBook
from workbench_spawner.ledger.store import AllocationStore
from workbench_spawner.policy.settings import load_policy_settings
from workbench_spawner.release import version
from workbench_spawner.rules.quota import Quota

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "releases"
# Each release's fixture and the schema revision that release left its database at.
RELEASES = {"2026-12-04": "0004", "2026-12-06": "0008"}
# The fixtures' fixed clock (release_rows.T0) and their GPUs.
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
GPUS = [f"GPU-sim-0{i}-h100-80gb" for i in range(4)]
SLICE = "MIG-sim-04-h200-141gb-1g.18gb-0"


def fixture(day: str, engine: str) -> Path:
    return FIXTURES / (f"{day}.sql" if engine == "sqlite" else f"{day}.{engine}.sql")


def load(day: str, tmp_path: Path) -> Path:
    """The SQLite fixture of ``day`` as a new file (a copy: the fixture itself is never opened for writing)."""
    path = tmp_path / f"gpu-{day}.sqlite"
    connection = sqlite3.connect(path)
    try:
        connection.executescript(fixture(day, "sqlite").read_text(encoding="utf-8"))
    finally:
        connection.close()
    return path


def run_script(url: str, script: str) -> None:
    """A pg_dump's plain SQL on the database at ``url``, as one script on a connection of its own
    (the dump empties ``search_path`` for its session)."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        connection = engine.raw_connection()
        try:
            connection.cursor().execute(script)
            connection.commit()
        finally:
            connection.close()
    finally:
        engine.dispose()


def every_row(url: str) -> dict[str, list[dict]]:
    """Every table's rows as column -> value, in a stable order, read with plain SQL."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            return {
                table: sorted(
                    (dict(row) for row in connection.execute(text(f'SELECT * FROM "{table}"')).mappings()),
                    key=lambda row: repr(sorted(row.items())),
                )
                for table in sorted(inspect(connection).get_table_names())
            }
    finally:
        engine.dispose()


@pytest.fixture(params=sorted(RELEASES))
def release(request) -> str:
    return request.param


@pytest.fixture(params=["sqlite", "postgresql"])
def old_database(request, release: str, tmp_path: Path) -> Iterator[str]:
    """The URL of a new database holding the fixture of ``release`` on each engine."""
    if request.param == "sqlite":
        yield f"sqlite:///{load(release, tmp_path)}"
        return
    with fresh_database() as url:
        run_script(url, fixture(release, "postgresql").read_text(encoding="utf-8"))
        yield url


@pytest.fixture
def upgraded(old_database: str):
    """(rows before, rows after, the store) for a release's database, opened by this release."""
    before = every_row(old_database)
    store = AllocationStore(old_database)
    try:
        yield before, every_row(old_database), store
    finally:
        store.dispose()


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_the_fixtures_are_the_releases_own(release, engine):
    """Each fixture is at the revision its release left, with a row in every table that release had."""
    header = fixture(release, engine).read_text(encoding="utf-8").splitlines()[0]
    assert re.fullmatch(rf"-- The GPU database of the release of {release}: commit [0-9a-f]{{40}}", header)


def test_the_fixtures_hold_a_row_in_every_table(release, old_database):
    rows = every_row(old_database)
    assert rows.pop("alembic_version") == [{"version_num": RELEASES[release]}]
    assert [table for table, found in rows.items() if not found] == []
    assert "gpu_drains" in rows if release >= "2026-12-05" else "gpu_drains" not in rows


def test_every_row_survives_with_its_values(upgraded):
    before, after, store = upgraded
    assert current(store.engine) == HEAD
    before.pop("alembic_version")
    for table, rows in before.items():
        kept = [{column: row[column] for column in rows[0]} for row in after[table]]
        assert kept == rows, table


def test_the_columns_added_since_hold_their_defaults(upgraded, release):
    before, after, _ = upgraded
    added = {
        (table, column): {row[column] for row in after[table]}
        for table in before
        if table != "alembic_version"
        for column in after[table][0]
        if column not in before[table][0]
    }
    if release == "2026-12-04":  # 0005-0008 came later: whole GPUs, any MIG profile, shared GPUs allowed
        assert added == {
            ("gpu_leases", "share"): {1.0},
            ("gpu_usage", "share"): {1.0},
            ("gpu_usage", "message"): {""},
            ("gpu_quotas", "whole_gpus"): {1},
            ("gpu_quotas", "allowed_profiles"): {None},
            ("gpu_quotas", "shared_gpus"): {1},
            ("gpu_quotas", "course"): {None},
            ("gpu_idle_exemptions", "until"): {None},
        }
    else:  # 0010: an admin's quotas belong to no course, an admin's exemptions have no end
        assert added == {("gpu_quotas", "course"): {None}, ("gpu_idle_exemptions", "until"): {None}}
    new_tables = set(after) - set(before)
    expected = {"workbench_releases", "workbench_courses", "workbench_invites"} | (
        {"gpu_drains", "workbench_reconcile_fixes"} if release == "2026-12-04" else set()
    )
    assert new_tables == expected


def test_this_release_is_recorded_as_the_one_that_migrated_it(upgraded):
    _, _, store = upgraded
    with store.engine.connect() as connection:
        recorded = releases(connection)
    assert [(r.version, r.revision) for r in recorded] == [(version(), HEAD)]


def test_quotas_and_session_limits_are_in_force(upgraded, release):
    _, _, store = upgraded
    book = QuotaBook(store)
    default = Quota(max_gpus=1)
    alice = book.effective("alice", ["ml-course"], default)  # her own quota wins over her group's
    assert (alice.source, alice.quota.max_gpus, alice.quota.gpu_hours_per_week) == ("user", 2, 10.0)
    assert alice.quota.allowed_models == ("H100-80GB",)
    assert (alice.quota.max_session_hours, alice.quota.gpu_idle_minutes, alice.quota.gpu_idle_threshold) == (
        4.0,
        30.0,
        7.0,
    )
    member = book.effective("frank", ["ml-course"], default)
    assert (member.source, member.group, member.quota.max_gpus, member.quota.gpu_hours_per_week) == (
        "group",
        "ml-course",
        1,
        5.0,
    )
    if release == "2026-12-04":  # before MIG quotas: what an older quota meant
        assert (member.quota.whole_gpus, member.quota.allowed_profiles, member.quota.shared_gpus) == (True, None, True)
    else:
        assert (member.quota.whole_gpus, member.quota.allowed_profiles, member.quota.shared_gpus) == (
            False,
            ("1g.18gb",),
            False,
        )
    assert book.effective("grace", [], default).source == "default"
    assert book.session_limits() == {("alice", ""): 4.0}


def test_reservations_are_listed(upgraded):
    _, _, store = upgraded
    listed = sorted(ReservationBook(store).all(), key=lambda r: r.reservation.group)
    assert [
        (
            r.reservation.group,
            r.reservation.gpus,
            r.reservation.window.text(),
            r.reservation.model,
            r.reservation.grace_minutes,
            r.reservation.preempt,
            r.reservation.warn_minutes,
            r.created_by,
        )
        for r in listed
    ] == [
        ("ml-course", 2, "Tue 10:00-12:00", "H100-80GB", 10.0, False, 10.0, "admin"),
        ("research", 1, "2026-12-08 14:00-16:00", None, 15.0, True, 15.0, "admin"),
    ]


def test_the_ledger_and_the_running_servers_leases_count(upgraded, release):
    _, _, store = upgraded
    leases = {(lease.user, lease.server): lease for lease in store.leases()}
    alice, bob = leases[("alice", "")], leases[("bob", "big")]
    assert (alice.gpu_uuids, alice.ref, alice.node, alice.groups, alice.since) == (
        (GPUS[0],),
        "4242",
        "wbhost",
        ("ml-course",),
        T0,
    )
    assert (bob.gpu_uuids, bob.ref, bob.groups) == ((GPUS[1],), "4343", ("research",))
    hours = gpu_hours_by_user(store, now=T0 + timedelta(hours=1))
    expected = {"carol": 3.0, "dave": 2.0, "alice": 1.0, "bob": 1.0}
    if release >= "2026-12-05":  # MIG slices: erin's lease of a seventh of a GPU
        assert leases[("erin", "")].shares == (pytest.approx(1 / 7),)
        expected["erin"] = 1 / 7
    assert set(leases) == {(user, "big" if user == "bob" else "") for user in expected} - {("carol", ""), ("dave", "")}
    assert hours == pytest.approx(expected)
    ledger = {(row.user, row.server): row for row in store.usage()}
    assert ledger[("dave", "train")].reason == "exited: exit code 1"
    assert ledger[("dave", "train")].message == (
        "This server exited on its own (exit code 1)." if release >= "2026-12-06" else ""
    )
    # This release writes to the old database as to its own.
    assert store.allocate("frank", "", 1, [GPUS[2]], node="wbhost") is not None


def test_notices_idle_clocks_drains_and_counts_are_read(upgraded, release):
    _, _, store = upgraded
    notices = NoticeBook(store, clock=lambda: T0)
    [pending] = notices.pending("alice")
    assert (pending.kind, pending.message, pending.stop_at) == (
        "idle",
        "Your GPU has been idle for 20 minutes; this server stops in 10 minutes.",
        T0 + timedelta(minutes=10),
    )
    done = notices.last_done("carol", "")
    assert done is not None
    assert done.message == "This server was stopped: its GPU was idle for 30 minutes."
    idle = IdleBook(store)
    [track] = idle.tracks()
    assert (track.gpu_uuid, track.user, track.idle_since, track.utilization) == (
        GPUS[0],
        "alice",
        T0 - timedelta(minutes=20),
        1.5,
    )
    assert list(idle.exempt_groups()) == ["research"]
    if release >= "2026-12-05":
        assert DrainBook(store).drained() == {GPUS[3]}
        counted = {kind: n for kind, n in ReconcileBook(store).counts().items() if n}
        assert counted == {"lease_closed": 2, "server_adopted": 1}
    else:
        assert DrainBook(store).drained() == set()


def test_the_published_settings_and_the_hub_id_are_read(upgraded, release):
    before, _, store = upgraded
    loaded = load_policy_settings(store)
    assert loaded is not None
    settings, _ = loaded
    assert len(settings.inventory.devices) == 4
    keys = {row["key"]: row["value"] for row in before["workbench_settings"]}
    if "hub-id" in keys:  # the hub keeps its id across the upgrade: its containers and jobs stay its own
        assert hub_id(store) == keys["hub-id"].strip('"')


def test_the_fixture_is_never_written(release, tmp_path):
    """The test works on copies: the fixture files stay as their release made them."""
    before = fixture(release, "sqlite").read_bytes()
    path = load(release, tmp_path)
    AllocationStore(f"sqlite:///{path}").dispose()
    assert fixture(release, "sqlite").read_bytes() == before
    engine = create_engine(f"sqlite:///{path}")
    try:
        assert current(engine) == HEAD
    finally:
        engine.dispose()
