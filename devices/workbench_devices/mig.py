"""MIG profiles: which slices a GPU model can be cut into, and how much of the GPU each one is.

NVIDIA's Multi-Instance GPU splits an A100, H100 or H200 into up to seven
hardware-isolated slices. A profile is named ``<g>g.<memory>gb``: ``g`` of
the GPU's seven compute slices and that much memory (``1g.18gb`` is one
seventh of an H200's compute with 18 GB). The hub needs three facts about a
profile: that it exists on the model (to refuse a layout or a request that
cannot be), how many fit on one GPU, and its share of the GPU, which is what
GPU-hours charge: a slice counts ``g / 7`` of a GPU (a ``1g`` slice-hour is
1/7 of a GPU-hour, a ``7g`` slice is the whole GPU).

The tables are NVIDIA's (the MIG user guide, "Supported MIG Profiles"); a
layout is checked the way the driver checks it in the large: at most seven
compute slices and eight memory slices per GPU, and no profile more often
than the GPU allows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

COMPUTE_SLICES = 7  # a MIG GPU's compute slices: the denominator of a slice's share
MEMORY_SLICES = 8  # a MIG GPU's memory slices


class MigLayoutError(ValueError):
    """A MIG layout or profile that cannot exist on the GPU; str(err) says why."""


@dataclass(frozen=True)
class MigProfile:
    """One MIG profile of one GPU model (``1g.18gb`` of an H200-141GB)."""

    name: str
    compute: int  # compute slices out of 7
    memory: int  # memory slices out of 8
    per_gpu: int  # how many of this profile fit on one GPU

    @property
    def memory_gb(self) -> int:
        return int(self.name.split(".")[1].removesuffix("gb"))

    @property
    def share(self) -> float:
        """This slice's share of its GPU, as GPU-hours charge it."""
        return profile_share(self.name)


def _table(*rows: tuple[str, int, int, int]) -> dict[str, MigProfile]:
    return {name: MigProfile(name, compute, memory, per_gpu) for name, compute, memory, per_gpu in rows}


_GPU_80GB = _table(
    ("1g.10gb", 1, 1, 7),
    ("1g.20gb", 1, 2, 4),
    ("2g.20gb", 2, 2, 3),
    ("3g.40gb", 3, 4, 2),
    ("4g.40gb", 4, 4, 1),
    ("7g.80gb", 7, 8, 1),
)

# MIG-capable models (the inventory's short model key) and their profiles.
PROFILES: dict[str, dict[str, MigProfile]] = {
    "H200-141GB": _table(
        ("1g.18gb", 1, 1, 7),
        ("1g.35gb", 1, 2, 4),
        ("2g.35gb", 2, 2, 3),
        ("3g.71gb", 3, 4, 2),
        ("4g.71gb", 4, 4, 1),
        ("7g.141gb", 7, 8, 1),
    ),
    "H100-80GB": _GPU_80GB,
    "A100-80GB": _GPU_80GB,
    "A100-40GB": _table(
        ("1g.5gb", 1, 1, 7),
        ("1g.10gb", 1, 2, 4),
        ("2g.10gb", 2, 2, 3),
        ("3g.20gb", 3, 4, 2),
        ("4g.20gb", 4, 4, 1),
        ("7g.40gb", 7, 8, 1),
    ),
}

_PROFILE_NAME = re.compile(r"^([1-7])g\.(\d+)gb$")
_FOUND_IN_NAME = re.compile(r"\b([1-7]g\.\d+gb)\b", re.IGNORECASE)
_LAYOUT_ITEM = re.compile(r"^(?:(\d+)\s*[xX]\s*)?(\S+)$")


def is_profile_name(name: str) -> bool:
    """Whether ``name`` reads as a MIG profile (``1g.18gb``), known to a table or not."""
    return bool(_PROFILE_NAME.match(name))


def profile_size(name: str) -> tuple[int, int] | None:
    """A profile's compute slices and memory in GB (``1g.18gb`` -> (1, 18)); None for what is no profile name."""
    match = _PROFILE_NAME.match(name or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def profile_share(name: str) -> float:
    """The share of its GPU a slice of profile ``name`` is: compute slices / 7; 1.0 for a whole GPU ("")."""
    match = _PROFILE_NAME.match(name or "")
    return int(match.group(1)) / COMPUTE_SLICES if match else 1.0


def profile_in_name(name: str) -> str:
    """The profile in a MIG device's NVML name ("NVIDIA H100 80GB HBM3 MIG 1g.10gb" -> "1g.10gb"), or ""."""
    match = _FOUND_IN_NAME.search(name or "")
    return match.group(1).lower() if match else ""


def profiles_of(model: str) -> dict[str, MigProfile]:
    """The profiles of ``model`` (empty for a GPU without MIG)."""
    return PROFILES.get(model.upper(), {})


def parse_layout(model: str, text: str) -> list[MigProfile]:
    """A layout such as ``2x1g.18gb+1x2g.35gb+1x3g.71gb`` as the slices of one ``model`` GPU, in order.

    Raises MigLayoutError naming the model's profiles when a profile does
    not exist on it, or when the slices do not fit on one GPU."""
    known = profiles_of(model)
    if not known:
        capable = ", ".join(sorted(PROFILES))
        raise MigLayoutError(f"{model} cannot be cut into MIG slices; MIG layouts are known for {capable}")
    slices: list[MigProfile] = []
    for raw in text.split("+"):
        item = raw.strip().lower()
        match = _LAYOUT_ITEM.match(item)
        name = match.group(2) if match else item
        if not match or name not in known:
            raise MigLayoutError(
                f"{model} has no MIG profile {item[:30]!r}; its profiles are {', '.join(known)} "
                "(a layout reads like 7x1g.18gb or 2x1g.18gb+1x2g.35gb)"
            )
        count = int(match.group(1) or 1)
        profile = known[name]
        if count < 1 or count > profile.per_gpu:
            raise MigLayoutError(f"{model} fits 1 to {profile.per_gpu} slices of {name}, not {count}")
        slices.extend([profile] * count)
    for profile in {p.name: p for p in slices}.values():
        if slices.count(profile) > profile.per_gpu:
            many = "slice" if profile.per_gpu == 1 else "slices"
            raise MigLayoutError(f"{model} fits at most {profile.per_gpu} {many} of {profile.name}")
    compute = sum(p.compute for p in slices)
    memory = sum(p.memory for p in slices)
    if compute > COMPUTE_SLICES or memory > MEMORY_SLICES:
        raise MigLayoutError(
            f"the MIG layout {text.strip()!r} does not fit on one {model}: it needs {compute} of "
            f"{COMPUTE_SLICES} compute slices and {memory} of {MEMORY_SLICES} memory slices"
        )
    return slices
