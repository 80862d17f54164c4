"""Courses' rules (rules/course.py, rules/roster.py) as tables; the course and invite books on real SQLite."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from workbench_spawner.ledger.course_book import CourseBook
from workbench_spawner.ledger.idle_book import IdleBook
from workbench_spawner.ledger.invite_book import InviteBook
from workbench_spawner.ledger.reservation_book import ReservationBook
from workbench_spawner.ledger.store import AllocationStore
from workbench_spawner.rules.course import (
    ENDED,
    RUNNING,
    UPCOMING,
    Course,
    CourseError,
    course_from_body,
    is_staff,
    over_ceiling,
    phase,
    reservation_refusal,
    staff_quota_from_body,
    staff_refusal,
)
from workbench_spawner.rules.quota import Quota
from workbench_spawner.rules.reservations import Reservation
from workbench_spawner.rules.roster import RosterError, RosterRow, parse_roster
from workbench_spawner.rules.window import parse_window

MODELS = ["H100-80GB", "A100-40GB"]
ML = Course(
    name="ml-101",
    title="Machine learning 101",
    ceiling=Quota(max_gpus=2, gpu_hours_per_week=10.0, allowed_models=("A100-40GB",)),
    starts=date(2027, 1, 11),
    ends=date(2027, 3, 12),
    staff_group="ml-101-staff",
    staff=("prof-lee",),
)
OPEN = Course(name="lab", title="Lab", ceiling=Quota(max_gpus=1))


@pytest.mark.parametrize(
    ("course", "today", "expected"),
    [
        (ML, date(2027, 1, 10), UPCOMING),
        (ML, date(2027, 1, 11), RUNNING),  # the first day is a course day
        (ML, date(2027, 3, 12), RUNNING),  # and so is the last
        (ML, date(2027, 3, 13), ENDED),
        (OPEN, date(1999, 1, 1), RUNNING),  # no dates: always running
    ],
)
def test_a_courses_phase_follows_its_dates(course, today, expected):
    assert phase(course, today) == expected


@pytest.mark.parametrize(
    ("user", "groups", "expected"),
    [
        ("prof-lee", [], True),  # named by the admin
        ("ta-kim", ["ml-101-staff"], True),  # in the staff group
        ("ann", ["ml-101"], False),  # a student
        ("ann", ["other-staff"], False),
    ],
)
def test_staff_are_named_or_in_the_staff_group(user, groups, expected):
    assert is_staff(ML, user, groups) is expected


def test_staff_may_act_until_the_end_day_and_not_after():
    assert staff_refusal(ML, date(2027, 3, 12), "stop a student's server") is None
    assert staff_refusal(ML, date(2027, 1, 1), "stop a student's server") is None  # before the start: setting up
    assert staff_refusal(ML, date(2027, 3, 13), "stop a student's server") == (
        "the course ml-101 ended on 2027-03-12, so its staff may no longer stop a student's server; "
        "a hub admin may change its end date"
    )


@pytest.mark.parametrize(
    ("quota", "sentence"),
    [
        (Quota(max_gpus=2, gpu_hours_per_week=10, allowed_models=("A100-40GB",)), None),
        (Quota(max_gpus=0, gpu_hours_per_week=0, allowed_models=()), None),
        (
            Quota(max_gpus=3, gpu_hours_per_week=10, allowed_models=("A100-40GB",)),
            "the course ml-101 may give a student at most 2 GPUs at once, not 3; ask a hub admin to raise the "
            "course's ceiling",
        ),
        (
            Quota(max_gpus=1, gpu_hours_per_week=None, allowed_models=("A100-40GB",)),
            "the course ml-101 may give a student at most 10 GPU-hours a week, so a student's quota must give a "
            "weekly budget of 10 GPU-hours or less (gpu_hours_per_week)",
        ),
        (
            Quota(max_gpus=1, gpu_hours_per_week=12.5, allowed_models=("A100-40GB",)),
            "the course ml-101 may give a student at most 10 GPU-hours a week, not 12.5; ask a hub admin to raise "
            "the course's ceiling",
        ),
        (
            Quota(max_gpus=1, gpu_hours_per_week=5, allowed_models=None),
            "the course ml-101 may hand out only these GPU models: A100-40GB; name them in allowed_models",
        ),
        (
            Quota(max_gpus=1, gpu_hours_per_week=5, allowed_models=("A100-40GB", "H100-80GB")),
            "the course ml-101 may hand out only these GPU models: A100-40GB, not H100-80GB",
        ),
    ],
)
def test_a_staff_quota_is_held_to_the_ceiling(quota, sentence):
    assert over_ceiling(ML, quota) == sentence


def test_an_open_ceiling_limits_only_the_gpus():
    assert over_ceiling(OPEN, Quota(max_gpus=1, gpu_hours_per_week=None, allowed_models=None)) is None
    assert "at most 1 GPU at once, not 2" in (over_ceiling(OPEN, Quota(max_gpus=2)) or "")


def test_a_course_body_becomes_a_course():
    body = {
        "title": "  Machine learning 101 ",
        "starts": "2027-01-11",
        "ends": "2027-03-12",
        "ceiling": {"max_gpus": 2, "gpu_hours_per_week": 10, "allowed_models": ["a100-40gb"]},
        "staff_group": "ml-101-staff",
        "staff": ["prof-lee", " prof-lee ", ""],
    }
    assert course_from_body("ml-101", body, MODELS) == ML  # the model as the inventory writes it, staff once


@pytest.mark.parametrize(
    ("body", "sentence"),
    [
        (
            {"title": "x", "starts": "2027-03-12", "ends": "2027-01-11", "ceiling": {"max_gpus": 1}},
            "the course ends (2027-01-11) before it starts (2027-03-12)",
        ),
        (
            {"title": "x", "starts": "12 March", "ceiling": {"max_gpus": 1}},
            'starts must be a date like 2027-03-12, not "12 March"',
        ),
        (
            {"title": "x", "ceiling": {"max_gpus": 1, "allowed_models": ["V100"]}},
            'ceiling: unknown GPU model "V100"; this hub has: A100-40GB, H100-80GB',
        ),
        (
            {"title": "x", "ceiling": {"max_gpus": 1}, "staff_group": "ml-101"},
            'the staff group must not be the course\'s own group "ml-101" (its students); name a group of its '
            'instructors and TAs, such as "ml-101-staff"',
        ),
    ],
)
def test_a_bad_course_body_is_refused_with_a_sentence(body, sentence):
    with pytest.raises(CourseError) as refused:
        course_from_body("ml-101", body, MODELS)
    assert str(refused.value) == sentence


def test_a_staff_quota_body_takes_the_ceiling_for_what_it_leaves_out_and_the_hubs_defaults_for_the_rest():
    assert staff_quota_from_body(ML, {"max_gpus": 1}, MODELS) == Quota(
        max_gpus=1, gpu_hours_per_week=10.0, allowed_models=("A100-40GB",)
    )
    asked = staff_quota_from_body(OPEN, {"max_gpus": 1, "allowed_models": ["h100-80gb"]}, MODELS)
    assert asked == Quota(max_gpus=1, allowed_models=("H100-80GB",))
    # Said out loud, "no limit" is still more than the ceiling allows.
    unlimited = staff_quota_from_body(ML, {"max_gpus": 1, "gpu_hours_per_week": None}, MODELS)
    assert "weekly budget of 10 GPU-hours or less" in (over_ceiling(ML, unlimited) or "")
    with pytest.raises(CourseError, match='unknown GPU model "B200"'):
        staff_quota_from_body(ML, {"max_gpus": 1, "allowed_models": ["B200"]}, MODELS)


def test_the_course_book_stores_replaces_finds_staff_and_deletes(tmp_path):
    store = AllocationStore(f"sqlite:///{tmp_path / 'gpu.sqlite'}")
    try:
        book = CourseBook(store)
        assert book.all() == []
        book.set(ML, by="user:admin")
        book.set(OPEN, by="user:admin")
        assert book.get("ml-101") == ML
        assert [c.name for c in book.all()] == ["lab", "ml-101"]
        assert [c.name for c in book.staffed_by("ta-kim", ["ml-101-staff"])] == ["ml-101"]
        assert book.staffed_by("ann", ["ml-101"]) == []
        renamed = Course(name="ml-101", title="ML 101 (spring)", ceiling=Quota(max_gpus=1))
        book.set(renamed)
        assert book.get("ml-101") == renamed  # replaced whole: dates and staff gone with the old settings
        assert book.delete("ml-101") is True
        assert book.delete("ml-101") is False
        assert book.get("ml-101") is None
    finally:
        store.dispose()


def test_a_roster_is_read_with_its_roles_and_names_as_logins_have_them():
    text = "\ufeffUsername,Name,Role\nAnn ,Ann Lee,\nben,Ben,student\n\nprof-lee,Prof,Instructor\nkim,Kim,ta\n"
    assert parse_roster(text) == [
        RosterRow(2, "ann", "student"),
        RosterRow(3, "ben", "student"),
        RosterRow(5, "prof-lee", "instructor"),
        RosterRow(6, "kim", "ta"),
    ]


@pytest.mark.parametrize(
    ("text", "problems"),
    [
        (
            "name,email\nann,a@x\n",
            ["line 1: the first line must name the columns, one of them username (found ['name', 'email'])"],
        ),
        ("", ["the file is empty: its first line must name the columns, one of them username"]),
        ("username\n", ["the file names no one: add a line per student under the header"]),
        (
            "username,role\nann,student\n,student\nann lee,ta\nben,prof\nann,student\n-rf,student\n",
            [
                "line 3: no username",
                "line 4: 'ann lee' cannot be a login name (no spaces, commas or slashes)",
                "line 5: role 'prof' is not one of student, ta, instructor",
                "line 6: ann is on line 2 already",
                "line 7: '-rf' cannot be a login name (no spaces, commas or slashes)",
            ],
        ),
    ],
)
def test_a_bad_roster_names_every_bad_line(text, problems):
    with pytest.raises(RosterError) as refused:
        parse_roster(text)
    assert refused.value.problems == problems


def test_the_invite_book_issues_once_checks_the_name_and_is_used_once(tmp_path):
    store = AllocationStore(f"sqlite:///{tmp_path / 'gpu.sqlite'}")
    try:
        book = InviteBook(store)
        tokens = book.issue(["ann", "ben"], "ml-101", "user:prof")
        assert sorted(tokens) == ["ann", "ben"]
        assert book.issue(["ann", "cat"], "ml-101").keys() == {"cat"}  # ann keeps her link
        assert sorted(book.pending(["ann", "ben", "cat", "dan"])) == ["ann", "ben", "cat"]
        assert not book.valid("ben", tokens["ann"])  # another's link
        assert book.valid("ann", tokens["ann"])
        assert book.use("ann", tokens["ann"])
        assert not book.use("ann", tokens["ann"])  # once
        assert sorted(book.pending(["ann", "ben"])) == ["ben"]
    finally:
        store.dispose()


def test_a_courses_reservations_count_only_while_it_runs(tmp_path):
    store = AllocationStore(f"sqlite:///{tmp_path / 'gpu.sqlite'}")
    try:
        CourseBook(store).set(ML)  # 11 January to 12 March 2027
        book = ReservationBook(store)
        monday = datetime(2027, 1, 4, 9, tzinfo=UTC)
        for group in ("ml-101", "research"):
            book.create(Reservation(group, 1, parse_window("Mon 08:00-12:00")), {"H100-80GB": 4}, monday, UTC)
        groups = lambda now: [r.group for r in book.open_at(now, UTC)]  # noqa: E731
        assert groups(monday) == ["research"]  # before the course starts
        assert groups(datetime(2027, 1, 11, 9, tzinfo=UTC)) == ["ml-101", "research"]  # its first day
        assert groups(datetime(2027, 3, 15, 9, tzinfo=UTC)) == ["research"]  # after it ended
        assert [r.group for r in book.in_force(monday, UTC)] == ["research"]
    finally:
        store.dispose()


@pytest.mark.parametrize(
    ("allowance", "gpus", "preempt", "sentence"),
    [
        (2, 2, False, None),
        (0, 1, False, "the course ml-101 has no reservation allowance, so only a hub admin books GPUs for it; ask one "
         "to set its reservation_gpus"),
        (2, 3, False, "the course ml-101 may reserve at most 2 GPUs at once, not 3; ask a hub admin for more"),
        (1, 2, False, "the course ml-101 may reserve at most 1 GPU at once, not 2; ask a hub admin for more"),
        (2, 1, True, "a course's staff may not book a reservation that stops other users' servers (preempt); ask a "
         "hub admin"),
    ],
)  # fmt: skip
def test_staff_book_within_the_courses_allowance_and_never_preempt(allowance, gpus, preempt, sentence):
    course = Course(name="ml-101", title="ML", ceiling=Quota(max_gpus=1), reservation_gpus=allowance)
    assert reservation_refusal(course, gpus, preempt) == sentence


def test_an_exemption_with_an_end_counts_until_then(tmp_path):
    store = AllocationStore(f"sqlite:///{tmp_path / 'gpu.sqlite'}")
    try:
        book = IdleBook(store)
        now = datetime(2027, 1, 14, 14, tzinfo=UTC)
        book.exempt("ml-101", "lab", "user:prof", now, until=now + timedelta(hours=3))
        book.exempt("research", "long runs", "user:admin", now)
        assert sorted(book.exempt_groups(now + timedelta(hours=2))) == ["ml-101", "research"]
        assert sorted(book.exempt_groups(now + timedelta(hours=3, seconds=1))) == ["research"]
    finally:
        store.dispose()
