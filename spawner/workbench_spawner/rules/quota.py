"""GPU quotas: what each user may hold, and how much they used this week.

A quota is set for a JupyterHub user or a JupyterHub group and has these parts:

* ``max_gpus``: devices held at once, over all the user's servers; a MIG
  slice counts 1 like a whole GPU;
* ``gpu_hours_per_week`` (optional): GPU-hours in the rolling last 7 days,
  counted from the usage ledger (finished leases) plus the leases held now;
  an hour of a MIG slice counts its share of the GPU (a ``1g`` slice 1/7,
  recorded with the lease: ``GPUDevice.share``);
* ``allowed_models`` (optional): the GPU models this user may get;
* ``whole_gpus`` (default true): whether whole (non-MIG) GPUs are allowed;
* ``allowed_profiles`` (optional): the MIG profiles (``1g.18gb``) this user
  may get; null: any, []: no slices (``Quota.allows_profile``);
* ``shared_gpus`` (default true): whether a time-sliced GPU (one that several
  servers share, ``servers_per_device``) may be this user's; false: only
  devices a server holds alone, for work that needs its memory to itself;
* ``max_session_hours`` (optional): how long one server may run;
* ``gpu_idle_minutes`` and ``gpu_idle_threshold`` (optional): stop a server
  whose GPUs all stayed under the threshold (percent) that long, so they go
  to the next in line (``workbench_spawner.rules.idle``). Null inherits the hub's
  ``WORKBENCH_GPU_IDLE_MINUTES`` / threshold; 0 minutes turns it off.

The effective quota of a user is (``effective_quota``):

1. the user's own quota, if an admin set one;
2. else the most generous quota among the user's groups, compared part by
   part in the order above (more GPUs wins; then more GPU-hours, no limit
   beating any limit; then any model beating a list, a longer list beating a
   shorter one; then whole GPUs allowed beating not; then any MIG profile
   beating a list, a longer list beating a shorter one; then shared GPUs
   allowed beating not; then the longer session; then idle reclaim); ties go to the group whose name sorts first;
3. else the default from the hub configuration.

Quotas live in the allocation store's database (table ``gpu_quotas``), so the
hub and the workbench service see the same numbers. Changes apply to the next
spawn: nothing here stops a running server.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Boolean,
    DateTime,
    Float,
    Integer,
    String,
    Text,
    UniqueConstraint,
    and_,
    bindparam,
    delete,
    or_,
    select,
    true,
)
from sqlalchemy.orm import Mapped, mapped_column

from workbench_devices.mig import is_profile_name
from workbench_spawner.ledger.store import AllocationStore, Base, _aware, utcnow

# Bounds that catch typos (a quota of 1e9 GPUs or 10 years of GPU-hours).
MAX_GPUS_LIMIT = 1024
MAX_GPU_HOURS_LIMIT = 1_000_000.0
MAX_SESSION_HOURS_LIMIT = 24.0 * 366
# The shortest session limit: 0.01 h = 36 s. A server needs tens of seconds
# to start, so anything shorter stops it before its owner could use it; it
# still lets a demo or a test watch the session stopper at work. Smaller
# values (1e-130) are typos, refused like the huge ones.
MIN_SESSION_HOURS = 0.01
MAX_MODELS = 64
MODEL_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+ -]{0,63}$")
MAX_PROFILES = 64
QUOTA_FIELDS = (
    "max_gpus",
    "gpu_hours_per_week",
    "allowed_models",
    "max_session_hours",
    "gpu_idle_minutes",
    "gpu_idle_threshold",
    "whole_gpus",
    "allowed_profiles",
    "shared_gpus",
)
KINDS = ("user", "group")


class QuotaError(ValueError):
    """A quota that cannot be stored; str(err) says why, for an admin."""


class QuotaRow(Base):
    """A quota an admin set for one user or one group."""

    __tablename__ = "gpu_quotas"
    __table_args__ = (UniqueConstraint("kind", "name", name="one_quota_per_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(8))  # "user" | "group"
    name: Mapped[str] = mapped_column(String(255))
    max_gpus: Mapped[int] = mapped_column(Integer)
    gpu_hours_per_week: Mapped[float | None] = mapped_column(Float, nullable=True)
    allowed_models: Mapped[str | None] = mapped_column(Text, nullable=True)  # JSON list
    max_session_hours: Mapped[float | None] = mapped_column(Float, nullable=True)
    gpu_idle_minutes: Mapped[float | None] = mapped_column(Float, nullable=True)  # migration 0003
    gpu_idle_threshold: Mapped[float | None] = mapped_column(Float, nullable=True)  # percent
    whole_gpus: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())  # migration 0005
    allowed_profiles: Mapped[str | None] = mapped_column(Text, nullable=True)  # JSON list; null: any
    shared_gpus: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())  # migration 0006
    updated: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_by: Mapped[str] = mapped_column(String(255), default="")


class SessionLimitRow(Base):
    """The session length in force when a server started (for the service to enforce)."""

    __tablename__ = "gpu_session_limits"
    __table_args__ = (UniqueConstraint("user", "server", name="one_limit_per_server"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user: Mapped[str] = mapped_column(String(255), index=True)
    server: Mapped[str] = mapped_column(String(255), default="")
    max_session_hours: Mapped[float] = mapped_column(Float)
    recorded: Mapped[datetime] = mapped_column(DateTime(timezone=True))


@dataclass(frozen=True)
class Quota:
    max_gpus: int
    gpu_hours_per_week: float | None = None
    allowed_models: tuple[str, ...] | None = None
    max_session_hours: float | None = None
    gpu_idle_minutes: float | None = None  # None: the hub's default; 0: never reclaimed
    gpu_idle_threshold: float | None = None  # percent; None: the hub's default
    whole_gpus: bool = True  # whole (non-MIG) GPUs allowed
    allowed_profiles: tuple[str, ...] | None = None  # MIG profiles, lower case; None: any, (): no slices
    shared_gpus: bool = True  # time-sliced GPUs allowed (False: only devices a server holds alone)

    def to_json(self) -> dict[str, Any]:
        return {
            "max_gpus": self.max_gpus,
            "gpu_hours_per_week": self.gpu_hours_per_week,
            "allowed_models": list(self.allowed_models) if self.allowed_models is not None else None,
            "max_session_hours": self.max_session_hours,
            "gpu_idle_minutes": self.gpu_idle_minutes,
            "gpu_idle_threshold": self.gpu_idle_threshold,
            "whole_gpus": self.whole_gpus,
            "allowed_profiles": list(self.allowed_profiles) if self.allowed_profiles is not None else None,
            "shared_gpus": self.shared_gpus,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Quota:
        """The quota ``to_json`` wrote (a part it lacks gets its default)."""
        models, profiles = data.get("allowed_models"), data.get("allowed_profiles")
        return cls(
            max_gpus=int(data.get("max_gpus", 1)),
            gpu_hours_per_week=data.get("gpu_hours_per_week"),
            allowed_models=tuple(models) if models is not None else None,
            max_session_hours=data.get("max_session_hours"),
            gpu_idle_minutes=data.get("gpu_idle_minutes"),
            gpu_idle_threshold=data.get("gpu_idle_threshold"),
            whole_gpus=bool(data.get("whole_gpus", True)),
            allowed_profiles=tuple(profiles) if profiles is not None else None,
            shared_gpus=bool(data.get("shared_gpus", True)),
        )

    def generosity(self) -> tuple:
        inf = math.inf
        return (
            self.max_gpus,
            inf if self.gpu_hours_per_week is None else self.gpu_hours_per_week,
            inf if self.allowed_models is None else len(self.allowed_models),
            self.whole_gpus,
            inf if self.allowed_profiles is None else len(self.allowed_profiles),
            self.shared_gpus,
            inf if self.max_session_hours is None else self.max_session_hours,
            # Idle reclaim last: off (0) beats any limit, a longer one a shorter; no opinion (None) is least.
            -inf if self.gpu_idle_minutes is None else (inf if self.gpu_idle_minutes == 0 else self.gpu_idle_minutes),
        )

    def allows_model(self, model: str | None) -> bool:
        if self.allowed_models is None or model is None:
            return True
        return model.lower() in {m.lower() for m in self.allowed_models}

    def allows_profile(self, profile: str) -> bool:
        """Whether this quota allows a device of MIG ``profile`` ("": a whole GPU, allowed by ``whole_gpus``)."""
        if not profile:
            return self.whole_gpus
        return self.allowed_profiles is None or profile.lower() in self.allowed_profiles


@dataclass(frozen=True)
class EffectiveQuota:
    quota: Quota
    source: str  # "user" | "group" | "default"
    group: str | None = None

    @property
    def describe(self) -> str:
        """Where the quota comes from, in words for a message."""
        if self.source == "user":
            return "your own GPU quota"
        if self.source == "group":
            return f"the GPU quota of group {self.group}"
        return "the default quota"

    @property
    def origin(self) -> str:
        """Where the quota comes from, for the admin page."""
        if self.source == "user":
            return "own quota"
        if self.source == "group":
            return f"from group {self.group}"
        return "default"

    def to_json(self) -> dict[str, Any]:
        return {**self.quota.to_json(), "source": self.source, "group": self.group, "origin": self.origin}


def quota_from_body(body: Mapping[str, Any], known_models: Iterable[str] | None = None) -> Quota:
    """The quota a request body asks for; raise QuotaError (a sentence) for what its schema cannot say.

    ``body`` has passed the service's ``QuotaBody`` schema (``openapi.validate_body``: fields,
    types and bounds). Here: model names are trimmed, matched to the inventory without regard to
    case (``known_models``; None: any) and written as the inventory writes them, once each.
    """

    def number(key: str) -> float | None:
        value = body.get(key)
        return None if value is None else float(value)

    models = body.get("allowed_models")
    if models is not None:
        cleaned: list[str] = []
        known = {m.lower(): m for m in (known_models or ())}
        for model in models:
            model = model.strip()
            if known_models is not None:
                if model.lower() not in known:
                    shown = ", ".join(sorted(known.values())) or "none"
                    raise QuotaError(f"unknown GPU model {json.dumps(model)}; this hub has: {shown}")
                model = known[model.lower()]
            if model not in cleaned:
                cleaned.append(model)
        models = tuple(cleaned)
    quota = Quota(
        max_gpus=int(body["max_gpus"]),
        gpu_hours_per_week=number("gpu_hours_per_week"),
        allowed_models=models,
        max_session_hours=number("max_session_hours"),
        gpu_idle_minutes=number("gpu_idle_minutes"),
        gpu_idle_threshold=number("gpu_idle_threshold"),
        whole_gpus=bool(body.get("whole_gpus", True)),
        allowed_profiles=_profiles(body.get("allowed_profiles")),
        shared_gpus=bool(body.get("shared_gpus", True)),
    )
    if quota.max_gpus > 0 and not quota.whole_gpus and quota.allowed_profiles == ():
        raise QuotaError(
            "whole_gpus is false and allowed_profiles is [], so this quota allows neither whole GPUs nor any "
            "MIG slice; set max_gpus to 0 for CPU only, or allow a profile"
        )
    return quota


def _profiles(names: Iterable[str] | None) -> tuple[str, ...] | None:
    """MIG profile names trimmed, lower-cased and once each; QuotaError for a name that is not one."""
    if names is None:
        return None
    cleaned: list[str] = []
    for raw in names:
        name = raw.strip().lower()
        if not is_profile_name(name):
            shown = raw if len(raw) <= 40 else raw[:39] + "…"
            raise QuotaError(f"allowed_profiles: {shown!r} is not a MIG profile; profiles read like 1g.18gb or 3g.71gb")
        if name not in cleaned:
            cleaned.append(name)
    return tuple(cleaned)


def _row_to_quota(row: QuotaRow) -> Quota:
    models = json.loads(row.allowed_models) if row.allowed_models is not None else None
    profiles = json.loads(row.allowed_profiles) if row.allowed_profiles is not None else None
    return Quota(
        max_gpus=row.max_gpus,
        gpu_hours_per_week=row.gpu_hours_per_week,
        allowed_models=tuple(models) if models is not None else None,
        max_session_hours=row.max_session_hours,
        gpu_idle_minutes=row.gpu_idle_minutes,
        gpu_idle_threshold=row.gpu_idle_threshold,
        whole_gpus=bool(row.whole_gpus) if row.whole_gpus is not None else True,
        allowed_profiles=tuple(profiles) if profiles is not None else None,
        shared_gpus=bool(row.shared_gpus) if row.shared_gpus is not None else True,
    )


@dataclass(frozen=True)
class StoredQuota:
    kind: str
    name: str
    quota: Quota
    updated: datetime
    updated_by: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            **self.quota.to_json(),
            "updated": self.updated.isoformat(),
            "updated_by": self.updated_by,
        }


class QuotaBook:
    """Quotas in the allocation store's database; every call one transaction."""

    def __init__(self, store: AllocationStore):
        self.store = store
        self._sessions = store.writes()
        self._reads = store.reads()

    def get(self, kind: str, name: str) -> StoredQuota | None:
        with self._reads() as session:
            row = session.scalar(select(QuotaRow).where(QuotaRow.kind == kind, QuotaRow.name == name))
            return self._stored(row) if row else None

    def all(self, kind: str | None = None) -> list[StoredQuota]:
        with self._reads() as session:
            query = select(QuotaRow).order_by(QuotaRow.kind, QuotaRow.name)
            if kind:
                query = query.where(QuotaRow.kind == kind)
            return [self._stored(r) for r in session.scalars(query)]

    def set(self, kind: str, name: str, quota: Quota, by: str = "") -> StoredQuota:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}")
        with self._sessions.begin() as session:
            row = session.scalar(select(QuotaRow).where(QuotaRow.kind == kind, QuotaRow.name == name))
            if row is None:
                row = QuotaRow(kind=kind, name=name)
                session.add(row)
            row.max_gpus = quota.max_gpus
            row.gpu_hours_per_week = quota.gpu_hours_per_week
            row.allowed_models = json.dumps(list(quota.allowed_models)) if quota.allowed_models is not None else None
            row.max_session_hours = quota.max_session_hours
            row.gpu_idle_minutes = quota.gpu_idle_minutes
            row.gpu_idle_threshold = quota.gpu_idle_threshold
            row.whole_gpus = quota.whole_gpus
            row.allowed_profiles = (
                json.dumps(list(quota.allowed_profiles)) if quota.allowed_profiles is not None else None
            )
            row.shared_gpus = quota.shared_gpus
            row.updated = utcnow()
            row.updated_by = by[:255]
            session.flush()
            return self._stored(row)

    def delete(self, kind: str, name: str) -> bool:
        with self._sessions.begin() as session:
            result = session.execute(delete(QuotaRow).where(QuotaRow.kind == kind, QuotaRow.name == name))
            return bool(result.rowcount)

    def effective(self, user: str, groups: Iterable[str], default: Quota) -> EffectiveQuota:
        """The quota in force for ``user`` in ``groups``: one read of the rows that may apply, the user's
        own and those of the user's groups, never every group's (a hub may have a group per course).
        Every spawn form and every spawn asks: a statement built once, plain rows, no ORM session."""
        groups = list(groups)
        own: Quota | None = None
        group_rows: dict[str, Quota] = {}
        with self.store.read_engine.connect() as conn:
            for row in conn.execute(_QUOTAS_OF_USER, {"user": user, "groups": sorted(set(groups))}):
                if row.kind == "user":
                    own = _row_to_quota(row)
                else:
                    group_rows[row.name] = _row_to_quota(row)
        return effective_quota(own, {g: group_rows[g] for g in groups if g in group_rows}, default)

    def effective_many(self, users: Mapping[str, Iterable[str]], default: Quota) -> dict[str, EffectiveQuota]:
        """The effective quota of many users (name -> their groups) from ONE query.

        The admin page, ``api/usage`` and the metrics show every user: one
        read of ``gpu_quotas`` for all of them, not two per user.
        """
        own: dict[str, Quota] = {}
        group_rows: dict[str, Quota] = {}
        for stored in self.all():
            (own if stored.kind == "user" else group_rows)[stored.name] = stored.quota
        return {
            name: effective_quota(own.get(name), {g: group_rows[g] for g in groups if g in group_rows}, default)
            for name, groups in users.items()
        }

    # -- session limits ---------------------------------------------------------

    def record_session_limit(self, user: str, server: str, hours: float | None) -> None:
        """Remember the session length in force for this start (None: no limit)."""
        with self._sessions.begin() as session:
            session.execute(
                delete(SessionLimitRow).where(SessionLimitRow.user == user, SessionLimitRow.server == server)
            )
            if hours is not None:
                session.add(SessionLimitRow(user=user, server=server, max_session_hours=hours, recorded=utcnow()))

    def session_limits(self) -> dict[tuple[str, str], float]:
        with self._reads() as session:
            return {(r.user, r.server): r.max_session_hours for r in session.scalars(select(SessionLimitRow))}

    @staticmethod
    def _stored(row: QuotaRow) -> StoredQuota:
        return StoredQuota(row.kind, row.name, _row_to_quota(row), _aware(row.updated), row.updated_by or "")


# The quota rows that may apply to one user (``QuotaBook.effective``): their own and their groups'.
_QUOTAS_OF_USER = select(QuotaRow).where(
    or_(
        and_(QuotaRow.kind == "user", QuotaRow.name == bindparam("user")),
        and_(QuotaRow.kind == "group", QuotaRow.name.in_(bindparam("groups", expanding=True))),
    )
)


def effective_quota(own: Quota | None, group_quotas: Mapping[str, Quota], default: Quota) -> EffectiveQuota:
    """The rule: own quota, else the most generous group quota, else the default."""
    if own is not None:
        return EffectiveQuota(own, "user")
    if group_quotas:
        # Most generous first; among equals, the group name that sorts first.
        best = sorted(group_quotas.items(), key=lambda item: item[0])
        name, quota = max(best, key=lambda item: item[1].generosity())
        return EffectiveQuota(quota, "group", name)
    return EffectiveQuota(default, "default")
