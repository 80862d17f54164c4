"""Resource profiles: named CPU and memory sizes a user picks on the spawn form.

A course wants "small" servers for the exercises and "large" ones for the
project weeks; GPUs are counted separately (the ``gpus`` option and the
quotas), so a profile only sizes the CPU cores and memory of the server.
Profiles are checked when the hub starts, so a typo in the configuration
stops the hub with a message instead of failing a student's spawn later.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jupyterhub.traitlets import ByteSpecification
from traitlets import TraitError

SLUG = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
_PROFILE_KEYS = {"slug", "display_name", "description", "cpu_limit", "mem_limit", "default"}


class ProfileError(ValueError):
    """A profile definition the hub cannot use; str(err) names the profile and the field."""


@dataclass(frozen=True)
class ResourceProfile:
    slug: str
    display_name: str
    cpu_limit: float | None = None
    mem_limit: int | None = None
    description: str = ""
    default: bool = False

    def summary(self) -> str:
        """What the form shows next to the name, e.g. "4 CPUs, 16 GiB memory"."""
        parts = []
        if self.cpu_limit is not None:
            parts.append(f"{self.cpu_limit:g} CPU{'' if self.cpu_limit == 1 else 's'}")
        if self.mem_limit is not None:
            parts.append(f"{format_bytes(self.mem_limit)} memory")
        return ", ".join(parts) or "the hub's default size"

    def limits(self, cpu_limit: float | None, mem_limit: int | None) -> tuple[float | None, int | None]:
        """(cpu, memory) for a start: this profile's, else the configured ones it leaves out."""
        return (
            self.cpu_limit if self.cpu_limit is not None else cpu_limit,
            self.mem_limit if self.mem_limit is not None else mem_limit,
        )


def format_bytes(value: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size:
            return f"{value / size:g} {unit}"
    return f"{value} bytes"


def parse_memory(value: Any, where: str) -> int:
    """JupyterHub's own spelling of sizes: bytes, or a number with K, M, G or T (powers of 1024)."""
    if isinstance(value, bool):
        raise ProfileError(f"{where}: mem_limit must be a size such as 16G or 512M, not {value}")
    try:
        parsed = ByteSpecification().validate(None, value.strip() if isinstance(value, str) else value)
    except (TraitError, TypeError, IndexError) as exc:
        raise ProfileError(f"{where}: mem_limit must be a size such as 16G or 512M, not {value!r}") from exc
    if parsed is None or parsed <= 0:
        raise ProfileError(f"{where}: mem_limit must be more than 0 bytes, not {value!r}")
    return int(parsed)


def parse_cpus(value: Any, where: str) -> float:
    if isinstance(value, bool):
        raise ProfileError(f"{where}: cpu_limit must be a number of cores such as 4 or 0.5, not {value}")
    try:
        cpus = float(value)
    except (TypeError, ValueError) as exc:
        raise ProfileError(f"{where}: cpu_limit must be a number of cores such as 4 or 0.5, not {value!r}") from exc
    if not 0 < cpus < float("inf"):  # also refuses nan
        raise ProfileError(f"{where}: cpu_limit must be more than 0 cores, not {value!r}")
    return cpus


def parse_profiles(raw: Iterable[Mapping[str, Any]]) -> list[ResourceProfile]:
    """Check every profile; the default is the one marked ``default``, else the first."""
    profiles: list[ResourceProfile] = []
    for position, entry in enumerate(raw, start=1):
        where = f"resource profile #{position}"
        if not isinstance(entry, Mapping):
            raise ProfileError(f"{where} must be a mapping with slug, cpu_limit and/or mem_limit")
        unknown = sorted(set(entry) - _PROFILE_KEYS)
        if unknown:
            raise ProfileError(
                f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; "
                f"known keys are {', '.join(sorted(_PROFILE_KEYS))}"
            )
        slug = entry.get("slug")
        if not isinstance(slug, str) or not SLUG.match(slug):
            raise ProfileError(
                f"{where}: slug must be 1-40 lower-case letters, digits, '-' or '_' "
                f"starting with a letter or digit, not {slug!r}"
            )
        where = f"resource profile {slug!r}"
        if any(p.slug == slug for p in profiles):
            raise ProfileError(f"{where} is defined twice")
        cpu = entry.get("cpu_limit")
        mem = entry.get("mem_limit")
        if cpu is None and mem is None:
            raise ProfileError(f"{where} sets neither cpu_limit nor mem_limit")
        profiles.append(
            ResourceProfile(
                slug=slug,
                display_name=str(entry.get("display_name") or slug),
                cpu_limit=None if cpu is None else parse_cpus(cpu, where),
                mem_limit=None if mem is None else parse_memory(mem, where),
                description=str(entry.get("description") or ""),
                default=bool(entry.get("default", False)),
            )
        )
    defaults = [p.slug for p in profiles if p.default]
    if len(defaults) > 1:
        raise ProfileError(f"only one resource profile can be the default, not {', '.join(defaults)}")
    return profiles


def default_profile(profiles: Sequence[ResourceProfile]) -> ResourceProfile | None:
    return next((p for p in profiles if p.default), profiles[0] if profiles else None)


def profiles_from_text(text: str) -> list[dict[str, Any]]:
    """The compact form of ``WORKBENCH_PROFILES``: ``slug:cpus:memory`` entries, comma-separated.

    ``small:2:8G,standard:4:16G,large:16:64G``; an empty field leaves that
    limit to the hub-wide default (``large::64G``); a ``*`` after the slug
    makes it the default (``standard*:4:16G``), else the first one is.
    """
    entries = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        fields = item.split(":")
        if len(fields) != 3:
            raise ProfileError(f"profile {item!r} must be slug:cpus:memory, e.g. standard:4:16G")
        slug, cpus, memory = (f.strip() for f in fields)
        entry: dict[str, Any] = {"slug": slug.rstrip("*"), "default": slug.endswith("*")}
        if cpus:
            entry["cpu_limit"] = cpus
        if memory:
            entry["mem_limit"] = memory
        entries.append(entry)
    return entries


def pick_profile(profiles: Sequence[ResourceProfile], slug: str | None) -> ResourceProfile | None:
    """The profile a start asked for, else the default one; None when none are offered."""
    return next((p for p in profiles if p.slug == slug), None) or default_profile(profiles)
