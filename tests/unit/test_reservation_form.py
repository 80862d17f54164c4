"""The spawn form says what is reserved and until when, read through the spawner as the hub renders it."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from zoneinfo import ZoneInfo

from tests.unit.test_spawner_lifecycle import make_spawner as make_spawner  # the fixture, for pytest to find
from workbench_spawner.ledger.reservation_book import ReservationBook, reservation_from_body
from workbench_spawner.policy.clock import set_test_clock


async def test_the_form_names_the_open_reservation(make_spawner, tmp_path):
    clock = tmp_path / "clock"
    set_test_clock(clock, datetime(2026, 12, 8, 8, 30, tzinfo=UTC))
    spawner = make_spawner(gpu_test_clock_file=str(clock), gpu_time_zone="Europe/Berlin")
    spawner.user.groups = [SimpleNamespace(name="ml-course")]
    book = ReservationBook(spawner.gpu_policy.store)
    book.create(
        reservation_from_body({"group": "ml-course", "gpus": 1, "window": "Tue 10:00-12:00"}, []),
        {"H100-80GB": 2},
        datetime(2026, 12, 8, 9, 0, tzinfo=UTC),
        ZoneInfo("Europe/Berlin"),
    )
    assert 'id="workbench-reservations"' not in await spawner._render_options_form()  # 09:30 in Berlin: not yet
    set_test_clock(clock, datetime(2026, 12, 8, 9, 5, tzinfo=UTC))  # 10:05, within the grace period
    html = await spawner._render_options_form()
    assert "1 of 2 GPUs reserved for ml-course until 12:00 (you are a member: you may use them)." in html
    # After the grace period nothing is promised beyond what members use or wait for.
    set_test_clock(clock, datetime(2026, 12, 8, 9, 30, tzinfo=UTC))
    html = await spawner._render_options_form()
    assert "1 of 2 GPUs reserved for ml-course until 12:00 (you" not in html
    # No member holds or waits for one: the form says it went back to everyone, not "up to".
    assert (
        "0 of 2 GPUs reserved for ml-course until 12:00 (all 1 went back to everyone at 10:15: no member "
        "asked for them; you are a member: you may use them)." in html
    )
