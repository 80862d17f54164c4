"""The idle-GPU rules: when a server's GPUs count as idle, when its owner is warned, when it is stopped.

Pure functions of readings and a clock (no database, no I/O), so a table of
cases with a test clock pins them and the day-of-class benchmark replays the
same rules the workbench service enforces.

The rules, for one server holding one or more GPUs:

* a GPU is **idle** while its utilization reading is under the threshold
  (percent, default 5); its idle clock starts at the first idle reading and
  stops at the first busy one;
* the server is idle while **all** its GPUs are idle; it has been idle since
  the latest of their idle clocks. One busy GPU keeps the whole server;
* a **missing reading** never counts as idle: the GPU's clock is reset, and
  a server with any GPU whose last reading is older than ``stale_after`` is
  left alone (verdict ``unknown``, which the service logs). Readings that
  come back start the clock from zero;
* **time nobody watched is not idle time**: when a reading arrives after a
  gap longer than ``stale_after`` since the previous one (the service was
  down, a pass was delayed, the server was unreachable), the GPU's idle
  clock starts again at this reading, even if both readings were idle. So
  at most ``stale_after`` of unobserved time between two idle readings ever
  counts toward the limit;
* after ``minutes - lead`` idle minutes the owner is **warned** (the lead is
  ``warn_minutes``, default 10, but at most half the idle limit, so a short
  limit still gives half its length as notice); after ``minutes`` the server
  is **stopped** and its GPUs go to the next in line;
* ``minutes`` 0 turns reclaim off; a server whose owner is in an exempt group
  is never reclaimed.

A kernel busy on the CPU leaves the GPU idle, and so is idle here: the
warning says so and points to a CPU-only server.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

DEFAULT_THRESHOLD = 5.0
DEFAULT_WARN_MINUTES = 10.0
# Bounds that catch typos; the shortest limit lets a demo or a test watch it (0.05 min = 3 s).
MIN_IDLE_MINUTES = 0.05
MAX_IDLE_MINUTES = 7 * 24 * 60.0
# A reading older than this is no reading (the service passes three check intervals).
DEFAULT_STALE_AFTER = timedelta(minutes=2)

OFF, EXEMPT, UNKNOWN, BUSY, IDLE, WARN, STOP = "off", "exempt", "unknown", "busy", "idle", "warn", "stop"


@dataclass(frozen=True)
class IdleRule:
    """The idle rule in force for one user: from their quota, else the hub's default."""

    minutes: float = 0.0
    threshold: float = DEFAULT_THRESHOLD
    warn_minutes: float = DEFAULT_WARN_MINUTES

    @property
    def enabled(self) -> bool:
        return self.minutes > 0

    @property
    def limit(self) -> timedelta:
        return timedelta(minutes=self.minutes)

    @property
    def lead(self) -> timedelta:
        """How long before the stop the owner is warned."""
        return timedelta(minutes=min(self.warn_minutes, self.minutes / 2))

    def describe(self) -> str:
        if not self.enabled:
            return "off"
        return f"after {format_minutes(self.minutes)} under {self.threshold:g} % utilization"


def format_minutes(minutes: float) -> str:
    """'30 min', '1.5 min', '12 s': the words the ledger and the notices use."""
    if minutes < 1:
        return f"{minutes * 60:.0f} s"
    return f"{minutes:.0f} min" if float(minutes).is_integer() else f"{minutes:.1f} min"


def rule_for(
    quota_minutes: float | None,
    quota_threshold: float | None,
    hub_minutes: float,
    hub_threshold: float = DEFAULT_THRESHOLD,
    warn_minutes: float = DEFAULT_WARN_MINUTES,
) -> IdleRule:
    """A quota's idle fields override the hub's; None inherits them."""
    minutes = hub_minutes if quota_minutes is None else quota_minutes
    threshold = hub_threshold if quota_threshold is None else quota_threshold
    return IdleRule(minutes=float(minutes or 0), threshold=float(threshold), warn_minutes=float(warn_minutes))


@dataclass(frozen=True)
class GpuTrack:
    """One held GPU's idle clock, carried from one pass to the next."""

    node: str
    gpu_uuid: str
    user: str
    server: str
    idle_since: datetime | None = None
    last_reading: datetime | None = None
    utilization: float | None = None
    source: str = ""

    def idle_for(self, now: datetime) -> timedelta | None:
        return None if self.idle_since is None else max(timedelta(0), now - self.idle_since)


def advance(
    track: GpuTrack,
    reading: float | None,
    threshold: float,
    now: datetime,
    source: str = "",
    stale_after: timedelta = DEFAULT_STALE_AFTER,
) -> GpuTrack:
    """The track after one reading (None: no reading this pass).

    ``stale_after`` is the same bound ``judge`` uses: an idle reading that
    follows a gap longer than it restarts the idle clock, because nobody
    knows what the GPU did in the gap (the module docstring)."""
    if reading is None:
        # Not knowing is not idle: the clock starts again from the next real reading.
        return replace(track, idle_since=None, utilization=None, source=source or track.source)
    idle = reading < threshold
    watched = track.last_reading is not None and now - track.last_reading <= stale_after
    since = (track.idle_since if watched and track.idle_since is not None else now) if idle else None
    return replace(track, idle_since=since, last_reading=now, utilization=float(reading), source=source or track.source)


@dataclass(frozen=True)
class Verdict:
    """What to do with one server now."""

    action: str  # off | exempt | unknown | busy | idle | warn | stop
    idle_for: timedelta | None = None
    stop_at: datetime | None = None
    detail: str = ""


def judge(
    tracks: Iterable[GpuTrack],
    rule: IdleRule,
    now: datetime,
    *,
    exempt: bool = False,
    stale_after: timedelta = DEFAULT_STALE_AFTER,
) -> Verdict:
    """The verdict for one server from the tracks of all its GPUs."""
    tracks = list(tracks)
    if not rule.enabled:
        return Verdict(OFF, detail="idle reclaim is off for this user")
    if exempt:
        return Verdict(EXEMPT, detail="the user's group is exempt from idle reclaim")
    if not tracks:
        return Verdict(UNKNOWN, detail="no GPU readings yet")
    missing = [
        t.gpu_uuid
        for t in tracks
        if t.last_reading is None or t.utilization is None or now - t.last_reading > stale_after
    ]
    if missing:
        return Verdict(UNKNOWN, detail=f"no recent utilization reading for {', '.join(missing)}")
    idle_since = [t.idle_since for t in tracks if t.idle_since is not None]
    if len(idle_since) < len(tracks):
        return Verdict(BUSY)
    since = max(idle_since)
    idle_for = max(timedelta(0), now - since)
    stop_at = since + rule.limit
    if idle_for >= rule.limit:
        return Verdict(STOP, idle_for, stop_at)
    if idle_for >= rule.limit - rule.lead:
        return Verdict(WARN, idle_for, stop_at)
    return Verdict(IDLE, idle_for, stop_at)


def is_exempt(groups: Iterable[str], exempt_groups: Mapping[str, object] | Iterable[str]) -> bool:
    exempt = set(exempt_groups)
    return any(g in exempt for g in groups)


def ledger_reason(rule: IdleRule) -> str:
    return f"reclaimed: GPU idle {format_minutes(rule.minutes)}"


def warning_text(rule: IdleRule, stop_at: datetime, gpus: int, clock: str) -> tuple[str, str]:
    """The notice a user sees: (message, hint). ``clock`` is stop_at as the user reads it (HH:MM)."""
    what = "its GPU has" if gpus == 1 else f"its {gpus} GPUs have"
    # Short enough for a JupyterLab notification (140 characters); the hint has the rest.
    message = f"Your server will be stopped at {clock}: {what} been idle (under {rule.threshold:g} % use)."
    hint = (
        f"GPUs idle for {format_minutes(rule.minutes)} go to the next person waiting. To keep it, use the "
        f"GPU (run GPU work). A kernel busy on the CPU still leaves the GPU idle: for CPU work, start a "
        f"CPU-only server (0 GPUs). Your files stay either way."
    )
    return message, hint
