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

Quotas live in the allocation store's database (table ``gpu_quotas``, kept by
``workbench_spawner.ledger.quota_book.QuotaBook``), so the hub and the
workbench service see the same numbers; this module is the rules alone (no
I/O), as all of ``rules/``. Changes apply to the next spawn: nothing here
stops a running server.

The sentences that refuse a spawn over its quota are built here
(``over_max_gpus``, ``budget_spent``), once: admission (before anything
starts) and the check where the lease is written (``ledger.lease_limits``,
which catches two spawns of one user that passed admission together) refuse
in the same words, naming the user's other servers that hold the quota.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workbench_devices.mig import is_profile_name

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
    # The running course it comes from (its group's quota, or one its staff set for the user), and its title.
    course: str | None = None
    course_title: str = ""

    @property
    def describe(self) -> str:
        """Where the quota comes from, in words for a message."""
        if self.course and self.source == "user":
            return f"your GPU quota for the course {self.course_title} ({self.course}), set by its staff"
        if self.course:
            return f"the GPU quota of your course {self.course_title} ({self.course})"
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
        return {
            **self.quota.to_json(),
            "source": self.source,
            "group": self.group,
            "origin": self.origin,
            "course": self.course,
        }


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


@dataclass(frozen=True)
class ServerHolding:
    """What one of a user's other servers holds now, as a refusal over quota names it."""

    server: str  # JupyterHub's server name; "" is the default server
    devices: int  # devices held: a whole GPU, a MIG slice and a time-sliced share each count 1
    kinds: tuple[str, ...] = ()  # what they are ("H100-80GB", "H200-141GB 1g.18gb"), once each, in order

    @property
    def name(self) -> str:
        """The server as a sentence names it: "r1", or "your default server"."""
        return self.server or "your default server"

    @property
    def what(self) -> str:
        """ "1 (H100-80GB)": how many devices, and which kinds where known."""
        return f"{self.devices} ({', '.join(self.kinds)})" if self.kinds else str(self.devices)

    @property
    def listed(self) -> str:
        """ "big: 2 H100-80GB": the server, how many devices and which kinds, as a list of several names it."""
        return f"{self.name}: {' '.join([str(self.devices), ' and '.join(self.kinds)]).strip()}"


def _counted(count: int, slices: bool) -> str:
    noun = "slice" if slices else "GPU"
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _either(names: Sequence[str], word: str) -> str:
    """ "r1", "r1 or r2", "r1, r2 or your default server" (``word``: "or", "and")."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {word} {names[-1]}"


def over_max_gpus(
    asked: int, slices: bool, source: str, max_gpus: int, others: Sequence[ServerHolding], contact: str
) -> str:
    """The refusal of a spawn that would hold more devices at once than ``max_gpus`` allows.

    ``asked``: the devices this spawn asks for (``slices``: MIG slices); ``source``: the quota's words
    (``EffectiveQuota.describe``); ``others``: what the user's other servers hold now. The sentence names
    those servers, and which of them to stop where stopping one would make room: the student decides which
    of their servers gives way, so both checks say the same (admission, ``ledger.lease_limits``)."""
    held = sum(o.devices for o in others if o.devices)
    holding = [o for o in others if o.devices]
    if not holding:
        where = ""
    elif len(holding) == 1:
        one = holding[0]
        where = f" and your {'other server ' + one.server if one.server else 'default server'} holds {one.what}"
    else:
        where = f" and your other servers hold {held} ({'; '.join(o.listed for o in holding)})"
    advice = ""
    need = held + asked - max_gpus  # devices to free for this spawn to fit
    if holding and asked <= max_gpus:
        enough = [o.name for o in holding if o.devices >= need]
        advice = f"Stop {_either(enough, 'or') if enough else _either([o.name for o in holding], 'and')} first, "
    ask = f"ask {contact} to raise your GPU quota"
    return (
        f"Cannot start the server: you asked for {_counted(asked, slices)}, but {source} allows {max_gpus} at once"
        f"{where}. {advice + 'ask for fewer, or ' if advice else 'Ask for fewer, or '}{ask}."
    )


def budget_spent(source: str, budget: float, used: float, contact: str) -> str:
    """The refusal of a GPU server once the week's GPU-hours (``budget``) are spent (``used``)."""
    return (
        f"Cannot start the server: {source} allows {budget:g} GPU-hours per week and you used {used:.1f} in the "
        "last 7 days. Start a CPU-only server (0 GPUs), wait until older use leaves the 7-day window, or "
        f"ask {contact} to raise your GPU quota."
    )
