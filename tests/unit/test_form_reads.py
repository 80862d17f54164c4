"""The spawn form's reads at a class start: one worker-thread hop, and SQL that does not grow with the hub.

200 students open the form within a minute; every render's database work runs on the default executor
beside every spawn's. So a render reads each table once, in one hop, and only what is about its user: the
number of statements is the same at 10 users as at 1,000 (with their leases, ledger rows, quotas, groups
and notices), and the ledger, the quotas and the notices are read by the user's name, never whole.
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import delete, event, insert

from tests.unit.fake_backends import FakeHostSpawner
from workbench_spawner.ledger.gpu_hours import gpu_hours_used
from workbench_spawner.ledger.notices import NoticeBook, NoticeRow
from workbench_spawner.ledger.reservation_book import ReservationBook, reservation_from_body
from workbench_spawner.ledger.store import LeaseRow, UsageRow, utcnow
from workbench_spawner.policy.clock import set_test_clock
from workbench_spawner.policy.gpu_policy import _policies
from workbench_spawner.rules.quota import Quota

USER = "alice"
# Tuesday 10:05 in Berlin: the reservation below is open (its lines read the leases too).
CLOCK = datetime(2026, 12, 8, 9, 5, tzinfo=UTC)
# The SELECTs one render may make: leases, drains, quotas, the user's ledger rows, reservations, notice.
MOST_SELECTS = 6


@pytest.fixture
def make_spawner(db_url, tmp_path):
    _policies.clear()
    clock = tmp_path / "clock"
    set_test_clock(clock, CLOCK)

    def make(user=USER, groups=("ml-course",)):
        user_obj = SimpleNamespace(
            name=user, url=f"/user/{user}/", escaped_name=user, groups=[SimpleNamespace(name=g) for g in groups]
        )
        hub = SimpleNamespace(public_host="", api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/")
        return FakeHostSpawner(
            user=user_obj,
            hub=hub,
            orm_spawner=SimpleNamespace(name="", server=None),
            gpu_db_url=db_url,
            simulated_gpus="4xH100-80GB",
            servers_per_gpu=16,  # time-sliced: up to 64 leases
            gpu_test_clock_file=str(clock),
            gpu_time_zone="Europe/Berlin",
        )

    yield make
    _policies.clear()


def fill(spawner, users: int, leases: int, rows_per_user: int = 5) -> None:
    """A hub with ``users`` users: their ledger rows over the last week, own and group quotas, a stop notice
    each, and ``leases`` servers holding a time-sliced GPU slot; one reservation for ml-course, open now."""
    policy = spawner.gpu_policy
    store, now = policy.store, utcnow()
    names = [f"student{i}" for i in range(users)]
    with store.writes().begin() as session:
        session.execute(
            insert(UsageRow),
            [
                {
                    "gpu_uuid": policy.devices[i % 4].uuid,
                    "user": name,
                    "server": "",
                    "started": now - timedelta(hours=3 + i + 20 * j),
                    "ended": now - timedelta(hours=2 + i + 20 * j),
                    "reason": "stopped",
                    "node": "",
                    "share": 1.0,
                }
                for i, name in enumerate([*names, USER])
                for j in range(rows_per_user)
            ],
        )
        session.execute(
            insert(NoticeRow),
            [
                {
                    "user": name,
                    "server": "",
                    "kind": "idle",
                    "state": "done",
                    "message": f"{name}'s server was stopped: GPU idle",
                    "hint": "",
                    "reason": "reclaimed: GPU idle 30 min",
                    "created": now,
                    "updated": now,
                }
                for name in names
            ],
        )
        session.execute(
            insert(LeaseRow),
            [
                {
                    "gpu_uuid": policy.devices[i % 4].uuid,
                    "slot": i // 4,
                    "user": names[i],
                    "server": "",
                    "since": now - timedelta(minutes=30),
                    "ref": "",
                    "node": "",
                    "groups": '["ml-course"]',
                    "share": 1.0,
                }
                for i in range(leases)
            ],
        )
    for i, name in enumerate(names):
        policy.quotas.set("user" if i % 2 else "group", name, Quota(max_gpus=1, gpu_hours_per_week=10))
    policy.quotas.set("group", "ml-course", Quota(max_gpus=2, gpu_hours_per_week=40))
    ReservationBook(store).create(
        reservation_from_body({"group": "ml-course", "gpus": 1, "window": "Tue 10:00-12:00"}, []),
        {"H100-80GB": 4},
        CLOCK - timedelta(hours=1),
        ZoneInfo("Europe/Berlin"),
    )


async def statements_of_render(spawner) -> tuple[str, list[tuple[str, str]]]:
    """The form's HTML and the SQL (statement, parameters) one render sends, the policy built already."""
    store = spawner.gpu_policy.store
    sent: list[tuple[str, str]] = []

    def record(_conn, _cursor, statement, parameters, _context, _many):
        sent.append((statement, repr(parameters)))

    engines = {store.engine, store.read_engine}
    for engine in engines:
        event.listen(engine, "before_cursor_execute", record)
    try:
        html = await spawner._render_options_form()
    finally:
        for engine in engines:
            event.remove(engine, "before_cursor_execute", record)
    return html, sent


def selects(sent):
    return [(s, p) for s, p in sent if s.lstrip().upper().startswith("SELECT")]


@pytest.mark.parametrize(("users", "leases"), [(10, 2), (1000, 60)])
async def test_a_render_reads_each_table_once_and_only_its_users_rows(make_spawner, users, leases):
    spawner = make_spawner()
    fill(spawner, users, leases)
    html, sent = await statements_of_render(spawner)
    assert "reserved for ml-course" in html
    assert "GPU-hours in the last 7 days" in html
    reads = selects(sent)
    assert len(reads) <= MOST_SELECTS, "\n".join(s for s, _ in reads)
    # The ledger, the quotas and the notices: read by the user's name (an index), never the whole table.
    for statement, parameters in reads:
        if any(table in statement for table in ("gpu_usage", "gpu_quotas", "workbench_notices")):
            assert USER in parameters, statement


async def test_the_statements_per_render_do_not_grow_with_users_leases_or_ledger_rows(make_spawner):
    counts = []
    for users, leases in ((10, 2), (1000, 60)):
        _policies.clear()
        spawner = make_spawner()
        store = spawner.gpu_policy.store
        with store.writes().begin() as session:  # a fresh hub each time, on the same database
            for table in (UsageRow, NoticeRow, LeaseRow):
                session.execute(delete(table))
        for stored in spawner.gpu_quota_book.all():
            spawner.gpu_quota_book.delete(stored.kind, stored.name)
        for stored in ReservationBook(store).all():
            ReservationBook(store).delete(stored.reservation.id)
        fill(spawner, users, leases)
        _html, sent = await statements_of_render(spawner)
        counts.append(len(sent))
    assert counts[0] == counts[1], f"statements per render: {counts[0]} at 10 users, {counts[1]} at 1,000"


async def test_one_worker_thread_hop_per_render(make_spawner, thread_hops):
    spawner = make_spawner()
    fill(spawner, 10, 2)
    await spawner._render_options_form()  # the policy is built and reconciled once per hub process
    thread_hops.clear()
    await spawner._render_options_form()
    assert len(thread_hops) == 1


async def test_the_form_shows_what_separate_reads_show(make_spawner):
    # The snapshot hands one read of the leases to every part; each part alone reads the same.
    spawner = make_spawner()
    fill(spawner, 30, 9)
    policy = spawner.gpu_policy
    policy.store.allocate(USER, "", 1, [d.uuid for d in policy.devices], 16, groups=["ml-course"])
    leases = policy.store.leases()
    assert policy.status(leases=leases) == policy.status()
    assert policy.held_by_user(USER, leases=leases) == policy.held_by_user(USER) == 1
    assert policy.reserved_now(["ml-course"], leases=leases) == policy.reserved_now(["ml-course"])
    now = utcnow()
    assert gpu_hours_used(policy.store, USER, now, leases=leases) == gpu_hours_used(policy.store, USER, now)
    began = time.monotonic()
    ctx, alone = spawner.gpu_admission_context(policy, leases=leases), spawner.gpu_admission_context()
    elapsed = time.monotonic() - began
    assert replace(ctx, gpu_hours_used=0.0) == replace(alone, gpu_hours_used=0.0)  # the hours go on with the clock
    # Each read takes its own "now" and the held GPU accrues between them: by at most the time the two took
    # (a fixed tolerance fails on a machine loaded enough to stall between the reads).
    assert 0 <= alone.gpu_hours_used - ctx.gpu_hours_used <= elapsed / 3600 + 1e-9
    assert ctx.held_elsewhere == 0
    assert ctx.quota.source == "group"
    assert ctx.quota.group == "ml-course"


def test_the_effective_quota_reads_only_the_users_and_their_groups_rows(store):
    from workbench_spawner.ledger.quota_book import QuotaBook

    book = QuotaBook(store)
    default = Quota(max_gpus=1)
    for i in range(50):
        book.set("group", f"course{i}", Quota(max_gpus=8))  # more generous, but not alice's groups
    book.set("group", "b-course", Quota(max_gpus=2, gpu_hours_per_week=10))
    book.set("group", "a-course", Quota(max_gpus=2, gpu_hours_per_week=10))
    assert book.effective(USER, [], default).source == "default"
    tie = book.effective(USER, ["b-course", "a-course", "nope"], default)
    assert (tie.source, tie.group, tie.quota.max_gpus) == ("group", "a-course", 2)  # ties: the first name
    book.set("user", "bob", Quota(max_gpus=5))
    assert book.effective(USER, ["b-course"], default).group == "b-course"
    book.set("user", USER, Quota(max_gpus=0))
    own = book.effective(USER, ["course1"], default)
    assert (own.source, own.quota.max_gpus) == ("user", 0)


def test_last_done_is_the_newest_of_the_user(store):
    book = NoticeBook(store)
    assert book.last_done(USER) is None
    book.done(USER, "", kind="idle", message="first")
    book.done(USER, "gpu", kind="preempt", message="second")
    book.done("bob", "", kind="idle", message="bob's")
    assert book.last_done(USER).message == "second"
    assert book.last_done(USER, "").message == "first"
    assert book.last_done(USER, "other") is None
    book.acknowledge(USER, "gpu")
    assert book.last_done(USER).message == "first"
