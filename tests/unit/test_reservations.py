"""Reservation rules as tables: windows (midnight, weeks, DST), grace, who may take what, preemption, overlaps."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest

from workbench_spawner.rules.reservations import (
    Holding,
    Reservation,
    check_feasible,
    held_for_members,
    preemption_phase,
    preemption_plan,
    remaining_needs,
    takeable,
)
from workbench_spawner.rules.window import ReservationError, parse_window

BERLIN = ZoneInfo("Europe/Berlin")
UTC = UTC


def local(text: str, tz=BERLIN) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=tz)


# 2026-12-08 is a Tuesday.
@pytest.mark.parametrize(
    ("window", "now", "inside"),
    [
        ("Tue 10:00-12:00", "2026-12-08 10:00", True),
        ("Tue 10:00-12:00", "2026-12-08 11:59", True),
        ("Tue 10:00-12:00", "2026-12-08 12:00", False),  # the end is not in the window
        ("Tue 10:00-12:00", "2026-12-08 09:59", False),
        ("Tue 10:00-12:00", "2026-12-15 10:30", True),  # next week
        ("Tue 10:00-12:00", "2026-12-09 10:30", False),  # Wednesday
        ("Tue 22:00-02:00", "2026-12-09 01:30", True),  # crosses midnight into Wednesday
        ("Tue 22:00-02:00", "2026-12-08 01:30", False),  # Tuesday early is Monday's night, not Tuesday's
        ("Sun 23:00-01:00", "2026-12-14 00:30", True),  # crosses the week: Sunday night into Monday
        ("Sun 23:00-01:00", "2026-12-13 23:30", True),
        ("Sun 23:00-01:00", "2026-12-15 00:30", False),
        ("2026-12-08 10:00-12:00", "2026-12-08 10:30", True),
        ("2026-12-08 10:00-12:00", "2026-12-15 10:30", False),  # one-off: not next week
        ("2026-12-08 23:30-00:30", "2026-12-09 00:15", True),
        ("tuesday 10:00\u201312:00", "2026-12-08 11:00", True),  # full day name, en dash
    ],
)
def test_window_contains(window, now, inside):
    assert (parse_window(window).current(local(now), BERLIN) is not None) is inside


def test_weekly_window_keeps_wall_clock_across_dst():
    window = parse_window("Sun 10:00-11:00")
    summer = window.current(local("2026-03-22 10:30"), BERLIN)  # CET (+1)
    after = window.current(local("2026-03-29 10:30"), BERLIN)  # CEST (+2) from that morning
    assert summer[0] == datetime(2026, 3, 22, 9, 0, tzinfo=UTC)
    assert after[0] == datetime(2026, 3, 29, 8, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "weekly", "words"),
    [
        ("", None, "missing"),
        ("Tue", None, "malformed"),
        ("Tue 10-12", None, "malformed"),
        ("Tue 10:00-10:00", None, "empty"),
        ("Tue 25:00-26:00", None, "not a time of day"),
        ("Tue 10:61-11:00", None, "not a time of day"),
        ("Tus 10:00-12:00", None, "not a weekday"),
        ("2026-02-30 10:00-12:00", None, "not a date"),
        ("2026-12-08 10:00-12:00", True, "--weekly needs a weekday"),
        ("Tue 10:00-12:00", False, "--once needs a date"),
        (42, None, "missing"),
    ],
)
def test_malformed_windows_are_refused_with_a_sentence(text, weekly, words):
    with pytest.raises(ReservationError, match=words):
        parse_window(text, weekly)


def test_window_text_round_trips():
    for text in ("Tue 10:00-12:00", "Sun 23:00-01:00", "2026-12-08 10:00-12:00"):
        assert parse_window(text).text() == text


COURSE = Reservation("ml-course", 3, parse_window("Tue 10:00-12:00"), grace_minutes=15, id=1)


@pytest.mark.parametrize(
    ("now", "demand", "held"),
    [
        ("2026-12-08 09:59", 0, 0),  # before the window
        ("2026-12-08 10:00", 0, 3),  # all of it at the start
        ("2026-12-08 10:14", 0, 3),  # still within the grace period
        ("2026-12-08 10:15", 0, 0),  # grace over, nobody asked: all released
        ("2026-12-08 10:15", 2, 2),  # grace over: what members hold or wait for
        ("2026-12-08 10:15", 5, 3),  # never more than reserved
        ("2026-12-08 12:00", 3, 0),  # after the window
    ],
)
def test_held_for_members_with_grace(now, demand, held):
    assert held_for_members(COURSE, local(now), BERLIN, demand) == held


GPUS = ["g0", "g1", "g2", "g3"]
MODELS = {"g0": "H100", "g1": "H100", "g2": "A100", "g3": "A100"}
T0 = local("2026-12-08 10:05")


def hold(user, gpus, groups=(), minutes=0):
    return Holding(user, "", tuple(gpus), frozenset(groups), T0 - timedelta(minutes=minutes))


@pytest.mark.parametrize(
    ("who", "held", "free", "count", "expect"),
    [
        # 3 of 4 reserved for ml-course: a non-member gets the 4th, not a second.
        ("outsider", [], GPUS, 1, ["g0"]),
        ("outsider", [], GPUS, 2, ["g0"]),
        ("outsider", [hold("o1", ["g0"])], GPUS[1:], 1, []),
        # A member may take any free GPU.
        ("member", [hold("o1", ["g0"])], GPUS[1:], 3, ["g1", "g2", "g3"]),
        # Members already hold 2: one more stays kept, the other may go.
        ("outsider", [hold("m1", ["g0", "g1"], ["ml-course"])], ["g2", "g3"], 2, ["g2"]),
        # A non-member kept a reserved GPU at the start (no preempt): GPUs that come free go to members.
        ("outsider", [hold("o1", ["g0"]), hold("o2", ["g1"])], ["g2", "g3"], 1, []),
    ],
)
def test_takeable_under_one_reservation(who, held, free, count, expect):
    groups = ["ml-course"] if who == "member" else []
    needs = remaining_needs([COURSE], held, MODELS, T0, BERLIN, exclude_groups=groups)
    assert takeable(free, MODELS, count, needs) == expect


def test_takeable_keeps_the_reserved_model():
    a100 = Reservation("vision", 2, parse_window("Tue 10:00-12:00"), model="A100", id=2)
    needs = remaining_needs([a100], [], MODELS, T0, BERLIN)
    # An outsider may take both H100s but no A100.
    assert takeable(GPUS, MODELS, 4, needs) == ["g0", "g1"]
    assert takeable(["g2", "g3"], MODELS, 1, needs) == []


def test_after_grace_unasked_gpus_go_to_everyone():
    later = local("2026-12-08 10:20")
    needs = remaining_needs([COURSE], [], MODELS, later, BERLIN)
    assert takeable(GPUS, MODELS, 4, needs) == GPUS
    # A member waiting for 2 counts as asking.
    needs = remaining_needs([COURSE], [], MODELS, later, BERLIN, waiting={"ml-course": 2})
    assert takeable(GPUS, MODELS, 4, needs) == ["g0", "g1"]


PREEMPT = Reservation(
    "ml-course", 2, parse_window("Tue 10:00-12:00"), preempt=True, warn_minutes=10, grace_minutes=15, id=3
)


@pytest.mark.parametrize(
    ("reservation", "now", "phase"),
    [
        (PREEMPT, "2026-12-08 09:49", None),
        (PREEMPT, "2026-12-08 09:50", "warn"),
        (PREEMPT, "2026-12-08 09:59", "warn"),
        (PREEMPT, "2026-12-08 10:00", "stop"),
        (PREEMPT, "2026-12-08 10:14", "stop"),
        (PREEMPT, "2026-12-08 10:16", None),  # past the grace period: no late surprise stops
        (COURSE, "2026-12-08 09:55", None),  # without preempt: never
        (COURSE, "2026-12-08 10:00", None),
    ],
)
def test_preemption_timing(reservation, now, phase):
    found = preemption_phase(reservation, local(now), BERLIN)
    assert (found[0] if found else None) == phase
    if found:
        assert found[1] == local("2026-12-08 10:00").astimezone(UTC)


def test_preemption_timing_across_midnight_and_weeks():
    night = Reservation("night", 1, parse_window("Mon 00:05-02:00"), preempt=True, warn_minutes=10, id=4)
    assert preemption_phase(night, local("2026-12-13 23:58"), BERLIN)[0] == "warn"  # Sunday evening
    assert preemption_phase(night, local("2026-12-14 00:05"), BERLIN)[0] == "stop"


def test_preemption_plan_stops_newest_non_members_for_the_shortfall_only():
    held = [
        hold("old", ["g0"], minutes=60),
        hold("new", ["g1"], minutes=5),
        hold("member", ["g2"], ["ml-course"], minutes=1),
    ]
    # 2 reserved: 1 free (g3) + 1 member-held = 2: nobody stopped.
    assert preemption_plan(PREEMPT, held, ["g3"], MODELS) == []
    # 3 reserved, g3 free, a member on g2: one non-member must go, the newest.
    three = Reservation("ml-course", 3, PREEMPT.window, preempt=True, id=5)
    assert [h.user for h in preemption_plan(three, held, ["g3"], MODELS)] == ["new"]
    four = Reservation("ml-course", 4, PREEMPT.window, preempt=True, id=6)
    assert [h.user for h in preemption_plan(four, held, ["g3"], MODELS)] == ["new", "old"]
    # A model reservation stops only holders of that model.
    a100 = Reservation("ml-course", 2, PREEMPT.window, model="A100", preempt=True, id=7)
    assert [h.user for h in preemption_plan(a100, held, [], MODELS)] == []
    assert [h.user for h in preemption_plan(a100, [hold("x", ["g3"])], [], MODELS)] == ["x"]


INVENTORY = {"H100": 2, "A100": 2}
NOW = local("2026-12-01 09:00")


def res(window, gpus, model=None, rid=0):
    return Reservation("g", gpus, parse_window(window), model=model, id=rid)


@pytest.mark.parametrize(
    ("new", "existing", "words"),
    [
        (res("Tue 10:00-12:00", 5), [], "more than this hub has"),
        (res("Tue 10:00-12:00", 3, "A100"), [], "more than this hub has"),
        (res("Tue 10:00-12:00", 3), [res("Tue 11:00-13:00", 2)], "together 5 GPUs"),
        (res("Tue 10:00-12:00", 2, "A100"), [res("Tue 11:00-12:00", 1, "A100")], "together 3 GPUs"),
        (res("2026-12-08 10:00-12:00", 3), [res("Tue 09:00-10:30", 2)], "overlaps"),  # one-off vs weekly
        (res("Mon 23:00-01:00", 3), [res("Tue 00:30-02:00", 2)], "overlaps"),  # across midnight
        (res("Sun 23:00-01:00", 3), [res("Mon 00:00-00:30", 2)], "overlaps"),  # across the week
        (res("2026-11-30 10:00-12:00", 1), [], "is past"),
    ],
)
def test_infeasible_reservations_are_refused(new, existing, words):
    with pytest.raises(ReservationError, match=words):
        check_feasible(new, existing, INVENTORY, NOW, BERLIN)


@pytest.mark.parametrize(
    ("new", "existing"),
    [
        (res("Tue 10:00-12:00", 4), [res("Tue 12:00-14:00", 4)]),  # touching, not overlapping
        (res("Tue 10:00-12:00", 2), [res("Tue 11:00-13:00", 2)]),  # together exactly the inventory
        (res("Tue 10:00-12:00", 2, "H100"), [res("Tue 10:00-12:00", 2, "A100")]),
        (res("Tue 10:00-12:00", 2, "H100"), [res("Tue 10:00-12:00", 2)]),  # the any-model two fit on A100s
        (res("2026-12-09 10:00-12:00", 4), [res("Tue 10:00-12:00", 4)]),  # a Wednesday
        (res("Tue 22:00-02:00", 4), [res("Wed 02:00-03:00", 4)]),
    ],
)
def test_feasible_reservations_pass(new, existing):
    check_feasible(new, existing, INVENTORY, NOW, BERLIN)


def test_any_model_plus_model_over_the_model_count_is_refused():
    with pytest.raises(ReservationError):
        check_feasible(res("Tue 10:00-12:00", 3, "H100"), [], INVENTORY, NOW, BERLIN)
    with pytest.raises(ReservationError, match="together 5"):
        check_feasible(res("Tue 10:00-12:00", 2, "H100"), [res("Tue 10:00-12:00", 3)], INVENTORY, NOW, BERLIN)


def test_window_start_and_end_times():
    window = parse_window("Tue 22:00-01:30")
    assert (window.start, window.end, window.length) == (time(22), time(1, 30), timedelta(hours=3, minutes=30))


def test_gpus_user_may_take_is_what_placement_does():
    from workbench_spawner.rules.reservations import gpus_user_may_take

    held = [hold("o1", ["g0"])]
    assert gpus_user_may_take(GPUS[1:], MODELS, 1, [], [COURSE], held, T0, BERLIN) == []
    assert gpus_user_may_take(GPUS[1:], MODELS, 2, ["ml-course"], [COURSE], held, T0, BERLIN) == ["g1", "g2"]
    # Outside the window anyone takes anything.
    assert gpus_user_may_take(GPUS, MODELS, 4, [], [COURSE], [], local("2026-12-08 13:00"), BERLIN) == GPUS


def test_spawn_form_sentences():
    from workbench_spawner.rules.reservations import reserved_now

    inventory = {"H100": 2, "A100": 2}
    assert reserved_now([COURSE], T0, BERLIN, inventory) == ["3 of 4 GPUs reserved for ml-course until 12:00"]
    assert reserved_now([COURSE], T0, BERLIN, inventory, ["ml-course"]) == [
        "3 of 4 GPUs reserved for ml-course until 12:00 (you are a member: you may use them)"
    ]
    night = Reservation("night", 1, parse_window("Tue 22:00-01:00"), model="A100", id=9)
    assert reserved_now([night], local("2026-12-08 22:05"), BERLIN, inventory) == [
        "1 of 2 A100 GPUs reserved for night until Wed 01:00"
    ]
    assert reserved_now([COURSE], local("2026-12-08 13:00"), BERLIN, inventory) == []


# After the grace period the form says what is held for members now, not the whole reservation.
@pytest.mark.parametrize(
    ("now", "held", "waiting", "groups", "sentence"),
    [
        ("10:14", [], {}, [], "3 of 4 GPUs reserved for ml-course until 12:00"),
        (
            "10:15",
            [],
            {},
            [],
            "0 of 4 GPUs reserved for ml-course until 12:00 (all 3 went back to everyone at 10:15: no member asked "
            "for them)",
        ),
        (
            "10:30",
            [hold("m1", ["g0"], ["ml-course"])],
            {},
            [],
            "1 of 4 GPUs reserved for ml-course until 12:00 (2 of its 3 went back to everyone at 10:15: no member "
            "asked for them)",
        ),
        (
            "10:30",
            [hold("m1", ["g0"], ["ml-course"])],
            {"ml-course": 1},
            ["ml-course"],
            "2 of 4 GPUs reserved for ml-course until 12:00 (1 of its 3 went back to everyone at 10:15: no member "
            "asked for them; you are a member: you may use them)",
        ),
        (
            "10:30",
            [hold("m1", ["g0", "g1"], ["ml-course"])],
            {"ml-course": 2},
            [],
            "3 of 4 GPUs reserved for ml-course until 12:00",
        ),
        # A non-member's GPUs do not count as asked for.
        (
            "10:30",
            [hold("o1", ["g0", "g1"])],
            {"research": 2},
            [],
            "0 of 4 GPUs reserved for ml-course until 12:00 (all 3 went back to everyone at 10:15: no member asked "
            "for them)",
        ),
    ],
)
def test_the_form_reports_what_is_held_after_the_grace_period(now, held, waiting, groups, sentence):
    from workbench_spawner.rules.reservations import reserved_now

    lines = reserved_now(
        [COURSE],
        local(f"2026-12-08 {now}"),
        BERLIN,
        {"H100": 2, "A100": 2},
        groups,
        holdings=held,
        models=MODELS,
        waiting=waiting,
    )
    assert lines == [sentence]


def test_without_the_demand_the_form_gives_the_bound_never_the_whole_reservation():
    from workbench_spawner.rules.reservations import reserved_now

    [line] = reserved_now([COURSE], local("2026-12-08 10:30"), BERLIN, {"H100": 2, "A100": 2})
    assert line == (
        "up to 3 of 4 GPUs reserved for ml-course until 12:00 (since 10:15 only as many as members use or wait for)"
    )
