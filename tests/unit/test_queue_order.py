"""The wait list's order as tables (fifo, fair share, aging), and placement under reservations with a test clock."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from tests.unit.test_waitlist_threads import run_debug
from workbench_devices import DeviceInventory, parse_simulated_spec
from workbench_hub.service.openapi import BodyError, load_document, validate_body
from workbench_spawner.ledger.reservation_book import ReservationBook, reservation_from_body
from workbench_spawner.ledger.store import AllocationStore
from workbench_spawner.placement.host import HostAllocator, NoGPUAvailableError
from workbench_spawner.policy.clock import hub_clock, set_test_clock
from workbench_spawner.rules.queue_order import QueueOrderError, Waiting, explain, order, parse_queue_order
from workbench_spawner.rules.window import ReservationError

DOC = load_document()  # the service's API document: what request bodies are checked against


def read_reservation(body, models):
    """What POST api/reservations does with a body: check it against ``ReservationBody``, then read it."""
    validate_body(DOC, "ReservationBody", body)
    return reservation_from_body(body, models)


def w(user, joined, hours):
    return Waiting(f"{user}/", user, joined, hours)


A, B, C = w("ann", 0, 12.0), w("bob", 60, 2.0), w("cid", 120, 2.0)


@pytest.mark.parametrize(
    ("mode", "now", "aging", "expect"),
    [
        ("fifo", 200, 30, ["ann", "bob", "cid"]),
        ("fair-share", 200, 30, ["bob", "cid", "ann"]),  # fewest GPU-hours first, ties by arrival
        ("fair-share", 1800, 30, ["ann", "bob", "cid"]),  # ann waited 30 min: aged, goes first
        ("fair-share", 1860, 30, ["ann", "bob", "cid"]),  # bob aged too: aged ones by arrival
        ("fair-share", 1799, 30, ["bob", "cid", "ann"]),  # a second short of the bound
        ("fair-share", 200, 0, ["ann", "bob", "cid"]),  # a 0 bound is first come, first served
    ],
)
def test_order(mode, now, aging, expect):
    assert [x.user for x in order([A, B, C], mode, now, aging)] == expect


def test_nobody_who_came_later_passes_an_aged_request():
    late_light = [w(f"u{i}", 1000 + i, 0.0) for i in range(20)]
    ordered = order([A, *late_light], "fair-share", 1800, 30)
    assert ordered[0] is A


def test_explain_says_how_many_who_used_less_are_ahead():
    ordered = order([A, B, C], "fair-share", 200, 30)
    assert (
        explain(A, ordered, "fair-share", 200, 30)
        == "you used 12.0 GPU-hours this week; 2 users who used less are ahead"
    )
    assert explain(B, ordered, "fair-share", 200, 30) == "you used 2.0 GPU-hours this week"
    assert explain(A, order([A, B], "fifo", 200), "fifo", 200) == ""
    assert "nobody who came after you" in explain(A, order([A, B], "fair-share", 1900), "fair-share", 1900)


@pytest.mark.parametrize(
    ("value", "expect"), [(None, "fifo"), ("", "fifo"), ("FIFO", "fifo"), (" fair-share ", "fair-share")]
)
def test_parse_queue_order(value, expect):
    assert parse_queue_order(value) == expect


@pytest.mark.parametrize("value", ["fairshare", "lifo", "fair_share", "1"])
def test_unknown_queue_order_is_a_sentence(value):
    with pytest.raises(QueueOrderError, match="use 'fifo'"):
        parse_queue_order(value)


BERLIN = ZoneInfo("Europe/Berlin")


@pytest.fixture
def allocator(tmp_path, db_url):
    store = AllocationStore(db_url)
    clock_file = tmp_path / "clock"
    inventory = DeviceInventory("simulated", parse_simulated_spec("4"), "test")
    alloc = HostAllocator(store, inventory, "n1", recheck_interval=0.05, tz=BERLIN, clock=hub_clock(str(clock_file)))
    yield alloc, store, clock_file
    store.dispose()


def reserve_for_class(alloc, store, clock_file, gpus: int, inventory: dict[str, int], models=(), **extra) -> None:
    """At 9:00 on Tuesday 8 December (Berlin), reserve ``gpus`` for ml-course, Tuesdays 10:00-12:00."""
    set_test_clock(clock_file, datetime(2026, 12, 8, 9, 0, tzinfo=BERLIN))
    body = {"group": "ml-course", "gpus": gpus, "window": "Tue 10:00-12:00", **extra}
    ReservationBook(store).create(read_reservation(body, list(models)), inventory, alloc.clock(), BERLIN)


def test_placement_keeps_reserved_gpus_for_members(allocator):
    alloc, store, clock_file = allocator
    reserve_for_class(alloc, store, clock_file, 3, {"H100-80GB": 4}, models=["H100-80GB"])

    async def main():
        # Before the window anyone takes anything.
        early = await alloc.place("early", "", 2, None, 1)
        await asyncio.to_thread(alloc.release, "early", "", "stopped")
        set_test_clock(clock_file, datetime(2026, 12, 8, 10, 1, tzinfo=BERLIN))
        await alloc.place("out1", "", 1, None, 1)  # holds the one GPU outside the reservation
        out2 = asyncio.create_task(alloc.place("out2", "", 1, None, 10))
        await asyncio.sleep(0.3)
        assert not out2.done()  # waits: the other 3 are reserved
        member = await alloc.place("stud", "", 2, None, 2, groups=("ml-course",))  # passes the waiting outsider
        assert not out2.done()
        await asyncio.to_thread(alloc.release, "out1", "", "stopped")
        assert len((await asyncio.wait_for(out2, 5)).gpu_uuids) == 1
        return early, member

    early, member = run_debug(main)
    assert len(early.gpu_uuids) == 2
    assert len(member.gpu_uuids) == 2
    assert store.lease_of("stud", "").groups == ("ml-course",)


def test_after_the_grace_period_unasked_gpus_are_released(allocator):
    alloc, store, clock_file = allocator
    reserve_for_class(alloc, store, clock_file, 4, {"": 4}, grace_minutes=5)
    set_test_clock(clock_file, datetime(2026, 12, 8, 10, 1, tzinfo=BERLIN))
    assert run_debug(lambda: _try(alloc, "out")) is None
    with pytest.raises(NoGPUAvailableError, match="4 of 4 GPUs reserved for ml-course until 12:00"):
        run_debug(lambda: alloc.place("out", "", 1, None, 0.2))
    set_test_clock(clock_file, datetime(2026, 12, 8, 10, 6, tzinfo=BERLIN))
    assert run_debug(lambda: _try(alloc, "out")) is not None


async def _try(alloc, user):
    try:
        return await alloc.place(user, "", 1, None, 0.2)
    except NoGPUAvailableError:
        return None


def test_fair_share_serves_the_lighter_user_first(tmp_path):
    url = f"sqlite:///{tmp_path / 'wb.sqlite'}"
    store = AllocationStore(url)
    alloc = HostAllocator(
        store,
        DeviceInventory("simulated", parse_simulated_spec("1"), "t"),
        "n1",
        recheck_interval=0.05,
        queue_order="fair-share",
    )
    # heavy used the GPU before (a finished lease in the ledger).
    from datetime import timedelta

    from workbench_spawner.ledger.store import UsageRow, utcnow

    with store.writes().begin() as session:
        session.add(
            UsageRow(
                gpu_uuid="x",
                user="heavy",
                server="",
                started=utcnow() - timedelta(hours=12),
                ended=utcnow(),
                reason="stopped",
                node="n1",
            )
        )
    reports: list[tuple[int, str]] = []

    async def main():
        await alloc.place("holder", "", 1, None, 1)
        heavy = asyncio.create_task(alloc.place("heavy", "", 1, None, 10, lambda a, why="": reports.append((a, why))))
        await asyncio.sleep(0.2)
        light = asyncio.create_task(alloc.place("light", "", 1, None, 10))
        await asyncio.sleep(0.3)
        await asyncio.to_thread(alloc.release, "holder", "", "stopped")
        done, _ = await asyncio.wait([heavy, light], return_when=asyncio.FIRST_COMPLETED)
        first = done.pop().result().user
        await asyncio.to_thread(alloc.release, first, "", "stopped")
        await asyncio.wait_for(heavy, 5)
        return first

    assert run_debug(main) == "light"
    assert (1, "you used 12.0 GPU-hours this week; 1 user who used less is ahead") in reports
    store.dispose()


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ([], "the body must be a JSON object"),
        ({"group": "g", "gpus": 1}, "window is missing"),
        ({"group": "", "gpus": 1, "window": "Tue 10:00-11:00"}, "group must not be empty"),
        ({"group": "  ", "gpus": 1, "window": "Tue 10:00-11:00"}, "group must be the name of a JupyterHub group"),
        ({"group": "x" * 256, "gpus": 1, "window": "Tue 10:00-11:00"}, "group must be at most 255 characters long"),
        ({"group": "g", "gpus": "8", "window": "Tue 10:00-11:00"}, 'gpus must be a whole number, not "8"'),
        ({"group": "g", "gpus": True, "window": "Tue 10:00-11:00"}, "gpus must be a whole number, not true"),
        ({"group": "g", "gpus": 0, "window": "Tue 10:00-11:00"}, "gpus must be between 1 and 1024, not 0"),
        ({"group": "g", "gpus": 1, "window": "Tue 10:00-11:00", "model": "B200"}, "this hub has no B200 GPUs"),
        ({"group": "g", "gpus": 1, "window": "Tue 10:00-11:00", "model": "<b>"}, "model must be a GPU model name"),
        (
            {"group": "g", "gpus": 1, "window": "Tue 10:00-11:00", "grace_minutes": -1},
            "grace_minutes must be between 0 and 1440, not -1",
        ),
        (
            {"group": "g", "gpus": 1, "window": "Tue 10:00-11:00", "grace_minutes": float("nan")},
            "grace_minutes must be a finite number, not NaN",
        ),
        ({"group": "g", "gpus": 1, "window": "Tue 10:00-11:00", "warn_minutes": "5"}, "warn_minutes must be a number"),
        ({"group": "g", "gpus": 1, "window": "Tue 10:00-11:00", "preempt": "yes"}, "preempt must be true or false"),
        (
            {"group": "g", "gpus": 1, "window": "Tue 10:00-11:00", "colour": 1},
            "unknown field 'colour'; a reservation has",
        ),
        (
            {"group": "g", "gpus": 1, "window": "Tue 10:00-11:00" + " " * 60},
            "window must be at most 64 characters long",
        ),
        ({"group": "g", "gpus": 1, "window": 42}, "window must be text, not 42"),
        ({"group": "g", "gpus": 1, "window": "Tue 10-11"}, "is malformed"),
    ],
)
def test_bad_reservation_bodies(body, words):
    # The schema's refusals are BodyError, the window's and the inventory's ReservationError.
    with pytest.raises((BodyError, ReservationError)) as refused:
        read_reservation(body, ["H100-80GB"])
    assert words in str(refused.value)


def test_a_good_reservation_body_takes_the_defaults_and_the_inventorys_spelling():
    body = {"group": "ml-course", "gpus": 2.0, "window": "Tue 10:00-12:00", "model": "h100-80gb", "grace_minutes": None}
    reservation = read_reservation(body, ["H100-80GB"])
    assert (
        reservation.gpus,
        reservation.model,
        reservation.grace_minutes,
        reservation.warn_minutes,
        reservation.preempt,
    ) == (2, "H100-80GB", 15.0, 10.0, False)
    assert isinstance(reservation.gpus, int)


def test_a_refused_reservation_stores_nothing(db_url):
    store = AllocationStore(db_url)
    book = ReservationBook(store)
    now = datetime(2026, 12, 1, tzinfo=UTC)
    book.create(read_reservation({"group": "a", "gpus": 3, "window": "Tue 10:00-12:00"}, []), {"": 4}, now, BERLIN)
    with pytest.raises(ReservationError, match="together 5"):
        book.create(read_reservation({"group": "b", "gpus": 2, "window": "Tue 11:00-13:00"}, []), {"": 4}, now, BERLIN)
    assert [s.reservation.group for s in book.all()] == ["a"]
    store.dispose()


@pytest.mark.parametrize("now", [200, 1799, 1800, 1900, 5000])
def test_explain_all_says_what_explain_says_for_each(now):
    """The wait list explains the whole line in one pass; it must say what ``explain`` says for each."""
    import random

    from workbench_spawner.rules.queue_order import explain_all

    rng = random.Random(now)
    line = [
        Waiting(
            f"u{i}/s{i % 2}",
            f"u{i % 7}",
            rng.choice([0, 60, 300, 900, 1700, 1800]) + i,
            rng.choice([0.0, 0.0, 2.0, 2.0000001, 12.0, 40.5]),
        )
        for i in range(40)
    ]
    ordered = order(line, "fair-share", now, 30)
    assert explain_all(ordered, "fair-share", now, 30) == [explain(w, ordered, "fair-share", now, 30) for w in ordered]
    assert explain_all(ordered, "fifo", now, 30) == [""] * len(ordered)


def test_a_member_who_joined_before_the_window_is_not_stuck_behind_a_non_member(allocator):
    """Classes are taken again when a window opens: the member may take the reserved GPU at once."""
    alloc, store, clock_file = allocator
    reserve_for_class(alloc, store, clock_file, 1, {"H100-80GB": 4})
    set_test_clock(clock_file, datetime(2026, 12, 8, 9, 50, tzinfo=BERLIN))
    reads = []
    real = alloc.active_reservations
    alloc.active_reservations = lambda: reads.append(1) or real()

    async def main():
        for i in range(4):
            await alloc.place(f"h{i}", "", 1, None, 1)
        # Timeouts with room for a loaded CI machine (three lanes on two cores): the order is the test, not the speed.
        out = asyncio.create_task(alloc.place("out", "", 1, None, 60))  # first in line, not a member
        await asyncio.sleep(0.2)
        stud = asyncio.create_task(alloc.place("stud", "", 1, None, 60, groups=("ml-course",)))
        await asyncio.sleep(0.2)
        set_test_clock(clock_file, datetime(2026, 12, 8, 10, 1, tzinfo=BERLIN))  # the window opens
        await asyncio.to_thread(alloc.release, "h0", "", "stopped")  # its GPU is the one kept for members
        lease = await asyncio.wait_for(stud, 30)
        assert not out.done(), "the reserved GPU is not the non-member's"
        tries = len(reads)
        await asyncio.sleep(0.5)  # out waits on; only its own tries read reservations (every 0.05 s)
        out.cancel()
        return lease, len(reads) - tries

    lease, later_reads = run_debug(main)
    assert lease.user == "stud"
    assert later_reads <= 0.5 / 0.05 + 2, "no database read per wake-up of every waiter"


def test_after_the_grace_period_a_refusal_names_what_is_held_not_what_was_reserved(allocator):
    alloc, store, clock_file = allocator
    reserve_for_class(alloc, store, clock_file, 3, {"": 4})
    set_test_clock(clock_file, datetime(2026, 12, 8, 10, 30, tzinfo=BERLIN))

    async def main():
        await alloc.place("stud", "", 1, None, 1, groups=("ml-course",))
        await alloc.place("out1", "", 3, None, 1)
        with pytest.raises(NoGPUAvailableError) as refused:
            await alloc.place("out2", "", 1, None, 0.2)
        return str(refused.value)

    message = run_debug(main)
    assert "1 of 4 GPUs reserved for ml-course until 12:00 (2 of its 3 went back to everyone at 10:15" in message
    assert alloc.reserved_lines(["ml-course"]) == [
        "1 of 4 GPUs reserved for ml-course until 12:00 (2 of its 3 went back to everyone at 10:15: no member "
        "asked for them; you are a member: you may use them)"
    ]
