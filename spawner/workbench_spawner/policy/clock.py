"""The hub's clock and time zone, as reservations and the wait list see them.

Reservation windows are wall-clock times in the hub's time zone
(``WORKBENCH_TIME_ZONE``, an IANA name such as ``Europe/Berlin``; default
``$TZ``, else ``/etc/timezone``, else UTC). The zone is resolved once by the
hub and stored with the policy settings, so the workbench service (another
process) reads windows the same way.

**Test clock** (off by default): ``WORKBENCH_TEST_CLOCK_FILE`` names a file
holding one ISO 8601 instant, e.g. ``2026-12-08T10:05:00+01:00``. While that
file exists, "now" for reservations and preemption, in the hub and the
service alike, is that instant plus the seconds since the file was last
written: time keeps flowing, so grace periods and warnings still elapse. A
test writes the file to jump to a window's start. Leave the variable unset
in production (the stored policy settings show ``test_clock_file`` when it
is set). Leases, GPU-hours and session limits always use the real clock.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, tzinfo
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

Clock = Callable[[], datetime]


class ClockError(ValueError):
    """A time zone or test clock that cannot be used; str(err) is one sentence."""


def default_time_zone() -> str:
    if os.environ.get("TZ", "").strip(":"):
        return os.environ["TZ"].strip(":")
    try:
        name = Path("/etc/timezone").read_text().strip()
        if name:
            return name
    except OSError:
        pass
    return "UTC"


def zone(name: str) -> tzinfo:
    """The zone of an IANA name, or ClockError naming the setting."""
    try:
        return ZoneInfo(name or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        raise ClockError(
            f"WORKBENCH_TIME_ZONE={name!r} is not a time zone; use an IANA name such as "
            f"Europe/Berlin, America/New_York or UTC"
        ) from None


def real_now() -> datetime:
    return datetime.now(UTC)


def hub_clock(clock_file: str = "") -> Clock:
    """The real clock, or the test clock read from ``clock_file`` (see the module docstring)."""
    if not clock_file:
        return real_now
    path = Path(clock_file)

    def now() -> datetime:
        try:
            text = path.read_text().strip()
            written = path.stat().st_mtime
        except OSError:
            return real_now()
        try:
            base = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            return real_now()
        if base.tzinfo is None:
            base = base.replace(tzinfo=UTC)
        return base.astimezone(UTC) + timedelta(seconds=max(0.0, time.time() - written))

    return now


def set_test_clock(clock_file: str | os.PathLike, instant: datetime) -> None:
    """Jump the test clock to ``instant`` (for tests and demos)."""
    Path(clock_file).write_text(instant.isoformat())
