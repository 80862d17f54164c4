"""The idle-GPU rules (workbench_spawner.rules.idle) as tables, with a test clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from workbench_spawner.rules.idle import (
    BUSY,
    EXEMPT,
    IDLE,
    OFF,
    STOP,
    UNKNOWN,
    WARN,
    GpuTrack,
    IdleRule,
    advance,
    format_minutes,
    is_exempt,
    judge,
    ledger_reason,
    rule_for,
    warning_text,
)

T0 = datetime(2026, 12, 8, 10, 0, tzinfo=UTC)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def track(uuid: str = "GPU-a") -> GpuTrack:
    return GpuTrack(node="n1", gpu_uuid=uuid, user="alice", server="")


def replay(
    readings: list[tuple[float, float | None]], threshold: float = 5.0, uuid: str = "GPU-a", stale_after: float = 2.0
) -> GpuTrack:
    """Feed (minute, reading) pairs through ``advance``; ``stale_after`` in minutes."""
    t = track(uuid)
    for minute, value in readings:
        t = advance(t, value, threshold, at(minute), "host", stale_after=timedelta(minutes=stale_after))
    return t


# -- one GPU's idle clock -------------------------------------------------------------


@pytest.mark.parametrize(
    ("readings", "idle_since"),
    [
        ([(0, 0.0)], 0),  # first idle reading starts the clock
        ([(0, 0.0), (5, 3.0), (10, 4.9)], 0),  # under the threshold all along
        ([(0, 0.0), (5, 50.0), (10, 0.0)], 10),  # one busy reading restarts it
        ([(0, 0.0), (5, 5.0)], None),  # exactly the threshold is busy
        ([(0, 80.0)], None),
        ([(0, 0.0), (5, None), (10, 0.0)], 10),  # a missing reading restarts it: not knowing is not idle
        ([(0, 0.0), (5, None)], None),
    ],
)
def test_the_idle_clock_of_one_gpu(readings, idle_since):
    # Readings 5 minutes apart, fresh under a 10-minute staleness bound.
    t = replay(readings, stale_after=10)
    assert t.idle_since == (None if idle_since is None else at(idle_since))


# Time with no readings is not idle time: a gap longer than the staleness bound (2 min here)
# between two idle readings restarts the clock at the reading after the gap.
@pytest.mark.parametrize(
    ("case", "readings", "idle_since"),
    [
        ("readings every minute", [(0, 0.0), (1, 0.0), (2, 0.0), (3, 0.0)], 0),
        ("a gap of exactly the bound still counts", [(0, 0.0), (2, 0.0), (3, 0.0)], 0),
        ("the service was down 35 min", [(0, 0.0), (1, 0.0), (36, 0.0)], 36),
        ("a delayed pass, 2.5 min", [(0, 0.0), (1, 0.0), (3.5, 0.0), (4, 0.0)], 3.5),
        ("idle again after a gap, then steady", [(0, 0.0), (30, 0.0), (31, 0.0), (32, 0.0)], 30),
        ("busy before the gap, idle after", [(0, 90.0), (30, 0.0)], 30),
        ("a gap ends in a busy reading", [(0, 0.0), (30, 80.0)], None),
    ],
)
def test_a_gap_in_readings_restarts_the_idle_clock(case, readings, idle_since):
    t = replay(readings, stale_after=2)
    assert t.idle_since == (None if idle_since is None else at(idle_since)), case


def test_after_a_gap_the_server_is_judged_from_the_reading_after_it():
    """The service down from 10:01 to 10:36 with a 30-minute limit: idle 1 minute then, not 36."""
    t = replay([(0, 0.0), (1, 0.0), (36, 0.0)], stale_after=2)
    verdict = judge([t], RULE, at(36), stale_after=timedelta(minutes=2))
    assert verdict.action == IDLE
    assert verdict.idle_for == timedelta(0)
    assert verdict.stop_at == at(66)


def test_a_missing_reading_keeps_the_time_of_the_last_real_one():
    t = replay([(0, 0.0), (5, None)])
    assert t.last_reading == at(0)
    assert t.utilization is None


@pytest.mark.parametrize(
    ("threshold", "value", "idle"), [(5, 4.99, True), (5, 5, False), (20, 19, True), (1, 0.5, True), (1, 1, False)]
)
def test_thresholds(threshold, value, idle):
    assert (replay([(0, value)], threshold=threshold).idle_since is not None) is idle


# -- the verdict for a server --------------------------------------------------------

RULE = IdleRule(minutes=30, threshold=5, warn_minutes=10)


@pytest.mark.parametrize(
    ("idle_minutes", "action"),
    [
        (0, IDLE),
        (19.9, IDLE),
        (20, WARN),
        (29.9, WARN),
        (30, STOP),
        (45, STOP),
    ],
)
def test_warning_comes_warn_minutes_before_the_stop(idle_minutes, action):
    t = replay([(m / 2, 0.0) for m in range(0, int(idle_minutes * 2) + 1)] + [(idle_minutes, 0.0)])
    verdict = judge([t], RULE, at(idle_minutes))
    assert verdict.action == action
    assert verdict.stop_at == at(30)
    assert verdict.idle_for == timedelta(minutes=idle_minutes)


@pytest.mark.parametrize(
    ("minutes", "warn", "lead"), [(30, 10, 10), (10, 10, 5), (1, 10, 0.5), (60, 0, 0), (0.2, 10, 0.1)]
)
def test_the_warning_lead_is_at_most_half_the_limit(minutes, warn, lead):
    assert IdleRule(minutes=minutes, warn_minutes=warn).lead == timedelta(minutes=lead)


def test_all_gpus_of_a_server_must_be_idle_and_the_latest_clock_counts():
    a = replay([(0, 0.0), (25, 0.0)], uuid="GPU-a", stale_after=30)
    b = replay([(0, 90.0), (10, 0.0), (25, 0.0)], uuid="GPU-b", stale_after=30)
    verdict = judge([a, b], RULE, at(25))
    assert verdict.action == IDLE
    assert verdict.idle_for == timedelta(minutes=15)
    assert verdict.stop_at == at(40)
    busy = replay([(0, 0.0), (25, 60.0)], uuid="GPU-b", stale_after=30)
    assert judge([a, busy], RULE, at(25)).action == BUSY


@pytest.mark.parametrize(
    ("case", "tracks_at", "now", "action"),
    [
        ("no readings at all", [], 5, UNKNOWN),
        ("never read", [None], 5, UNKNOWN),
        ("last reading is stale", [(0, 0.0)], 40, UNKNOWN),
        ("reading just missing this pass", [(0, 0.0), (1, None)], 1, UNKNOWN),
        ("fresh enough", [(m, 0.0) for m in range(40)], 40, STOP),
    ],
)
def test_missing_readings_never_count_as_idle(case, tracks_at, now, action):
    if tracks_at == []:
        tracks = []
    elif tracks_at == [None]:
        tracks = [track()]
    else:
        tracks = [replay(tracks_at)]
    assert judge(tracks, RULE, at(now), stale_after=timedelta(minutes=2)).action == action, case


def test_off_and_exempt_win_over_everything():
    t = replay([(0, 0.0), (60, 0.0)], stale_after=60)
    assert judge([t], IdleRule(minutes=0), at(60)).action == OFF
    assert judge([t], RULE, at(60), exempt=True).action == EXEMPT
    assert judge([], RULE, at(60), exempt=True).action == EXEMPT


@pytest.mark.parametrize(
    ("groups", "exempt", "expected"),
    [
        (["ml-course"], {"research": {}}, False),
        (["ml-course", "research"], {"research": {}}, True),
        ([], {"research": {}}, False),
        (["research"], [], False),
    ],
)
def test_exemption_by_group(groups, exempt, expected):
    assert is_exempt(groups, exempt) is expected


# -- which rule applies ------------------------------------------------------------


@pytest.mark.parametrize(
    ("quota_minutes", "quota_threshold", "hub_minutes", "hub_threshold", "minutes", "threshold"),
    [
        (None, None, 30, 5, 30, 5),  # inherit the hub
        (None, None, 0, 5, 0, 5),  # hub off
        (60, None, 30, 5, 60, 5),  # the quota's own minutes
        (0, None, 30, 5, 0, 5),  # 0 in a quota: never reclaimed
        (None, 15, 30, 5, 30, 15),
        (20, 2, 0, 5, 20, 2),  # a quota turns it on where the hub has it off
    ],
)
def test_quota_fields_override_the_hub(quota_minutes, quota_threshold, hub_minutes, hub_threshold, minutes, threshold):
    rule = rule_for(quota_minutes, quota_threshold, hub_minutes, hub_threshold, 10)
    assert (rule.minutes, rule.threshold, rule.enabled) == (minutes, threshold, minutes > 0)


# -- words ----------------------------------------------------------------------------


@pytest.mark.parametrize(("minutes", "text"), [(30, "30 min"), (1.5, "1.5 min"), (0.2, "12 s"), (90, "90 min")])
def test_minutes_in_words(minutes, text):
    assert format_minutes(minutes) == text


def test_the_ledger_reason_and_the_messages():
    assert ledger_reason(RULE) == "reclaimed: GPU idle 30 min"
    assert len(ledger_reason(IdleRule(minutes=7 * 24 * 60 - 0.5))) <= 64
    message, hint = warning_text(RULE, at(30), 1, "10:30")
    assert message.startswith("Your server will be stopped at 10:30")
    assert len(message) <= 140
    assert "CPU-only server" in hint
    assert "use the GPU" in hint
    assert "files stay" in hint
    assert "2 GPUs" in warning_text(RULE, at(30), 2, "10:30")[0]
