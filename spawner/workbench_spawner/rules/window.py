"""A reservation's window: weekly (``Tue 10:00-12:00``) or one-off (``2026-12-08 10:00-12:00``).

Wall-clock time in the hub's zone: a weekly window keeps its local time across
DST, and a window whose end is not after its start crosses midnight. Parsing
(``parse_window``) turns an admin's text into a ``Window`` or a
``ReservationError`` with one sentence; ``Window.occurrences`` lists its
instants in a span, which the reservation rules (``reservations.py``) use.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, tzinfo

DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
FULL_DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_WINDOW = re.compile(
    r"^\s*(?P<day>\d{4}-\d{2}-\d{2}|[A-Za-z]+)\s+(?P<start>\d{1,2}:\d{2})\s*[-\u2013\u2014]\s*(?P<end>\d{1,2}:\d{2})\s*$"
)


class ReservationError(ValueError):
    """A reservation that cannot be made; str(err) is one sentence for an admin."""


def utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Window:
    """A weekly (``weekday`` 0-6) or one-off (``day``) window of wall-clock time."""

    start: time
    end: time
    weekday: int | None = None
    day: date | None = None

    @property
    def weekly(self) -> bool:
        return self.weekday is not None

    @property
    def length(self) -> timedelta:
        a = self.start.hour * 60 + self.start.minute
        b = self.end.hour * 60 + self.end.minute
        return timedelta(minutes=(b - a) % (24 * 60) or 24 * 60)

    def text(self) -> str:
        when = DAYS[self.weekday] if self.weekday is not None else self.day.isoformat()  # type: ignore[union-attr]
        return f"{when} {self.start:%H:%M}-{self.end:%H:%M}"

    def _at(self, day: date, tz: tzinfo) -> tuple[datetime, datetime]:
        begin = datetime.combine(day, self.start).replace(tzinfo=tz)
        # The end is the same wall clock + length (crossing midnight if end <= start).
        end_day = day + timedelta(days=1) if self.end <= self.start else day
        finish = datetime.combine(end_day, self.end).replace(tzinfo=tz)
        return begin.astimezone(UTC), finish.astimezone(UTC)

    def occurrences(self, since: datetime, until: datetime, tz: tzinfo) -> list[tuple[datetime, datetime]]:
        """Every (start, end) in UTC that overlaps [since, until)."""
        since, until = utc(since), utc(until)
        if self.day is not None:
            days: Iterable[date] = [self.day]
        else:
            first = since.astimezone(tz).date() - timedelta(days=1)
            first += timedelta(days=(self.weekday - first.weekday()) % 7)  # type: ignore[operator]
            count = (until - since).days // 7 + 2
            days = [first + timedelta(weeks=i) for i in range(count)]
        result = []
        for day in days:
            begin, finish = self._at(day, tz)
            if begin < until and finish > since:
                result.append((begin, finish))
        return result

    def current(self, now: datetime, tz: tzinfo) -> tuple[datetime, datetime] | None:
        """The occurrence ``now`` is in, if any."""
        found = self.occurrences(now, now + timedelta(microseconds=1), tz)
        return found[0] if found else None

    def next_start(self, now: datetime, tz: tzinfo) -> tuple[datetime, datetime] | None:
        """The first occurrence that starts at or after ``now``."""
        for begin, finish in self.occurrences(now, now + timedelta(days=8), tz):
            if begin >= utc(now):
                return begin, finish
        return None


def _clock_time(text: str, what: str) -> time:
    hours, minutes = (int(p) for p in text.split(":"))
    if hours > 23 or minutes > 59:
        raise ReservationError(f"the window's {what} {text} is not a time of day (00:00 to 23:59)")
    return time(hours, minutes)


def parse_window(text: object, weekly: bool | None = None) -> Window:
    """``"Tue 10:00-12:00"`` (weekly) or ``"2026-12-08 10:00-12:00"`` (one-off).

    ``weekly`` True/False insists on one kind (the CLI's --weekly/--once)."""
    if not isinstance(text, str) or not text.strip():
        raise ReservationError(
            'the window is missing: give e.g. "Tue 10:00-12:00" (weekly) or "2026-12-08 10:00-12:00" (one-off)'
        )
    match = _WINDOW.match(text)
    if not match:
        raise ReservationError(
            f"the window {text.strip()[:60]!r} is malformed: write a weekday or a date, then "
            'start-end, e.g. "Tue 10:00-12:00" or "2026-12-08 10:00-12:00"'
        )
    start = _clock_time(match["start"], "start")
    end = _clock_time(match["end"], "end")
    if start == end:
        raise ReservationError(f"the window {text.strip()!r} is empty: its start and end are the same time")
    day_text = match["day"]
    if day_text[0].isdigit():
        try:
            day = date.fromisoformat(day_text)
        except ValueError:
            raise ReservationError(f"{day_text} is not a date (YYYY-MM-DD)") from None
        window = Window(start, end, day=day)
    else:
        name = day_text.lower()
        index = next((i for i, d in enumerate(FULL_DAYS) if name in (d, d[:3])), None)
        if index is None:
            raise ReservationError(f"{day_text!r} is not a weekday: use Mon, Tue, Wed, Thu, Fri, Sat or Sun")
        window = Window(start, end, weekday=index)
    if weekly is True and not window.weekly:
        raise ReservationError(f'--weekly needs a weekday, not a date: e.g. "Tue {start:%H:%M}-{end:%H:%M}"')
    if weekly is False and window.weekly:
        raise ReservationError(f'--once needs a date, not a weekday: e.g. "2026-12-08 {start:%H:%M}-{end:%H:%M}"')
    return window
