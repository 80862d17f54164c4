"""A job's start report as the hub reads it: the node's GPUs by Slurm's index, and the job's own UUIDs.

Slurm never reports UUIDs, so the job's start-up does (``singleuser.py``
writes it, ``report_api.py`` receives it). It comes from a process the user
controls: the hub checks it against Slurm's job record and what it learned
of the node before it believes it (``SlurmPlacement``, ``NodeGPUMap``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class NodeReport:
    """What a job's start-up reported about its node: every GPU by index, and the job's own."""

    node: str
    gpus: tuple[dict, ...] = field(default_factory=tuple)
    job_gpus: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> NodeReport | None:
        if not isinstance(data, Mapping) or not data.get("node"):
            return None
        if not all(isinstance(data.get(name) or [], list) for name in ("gpus", "job_gpus")):
            return None
        gpus = tuple(dict(g) for g in data.get("gpus") or [] if isinstance(g, Mapping) and "uuid" in g)
        return cls(str(data["node"]), gpus, tuple(str(u) for u in data.get("job_gpus") or []))

    def uuids_for(self, indices: Iterable[int]) -> list[str] | None:
        by_index = {int(g.get("index", -1)): str(g["uuid"]) for g in self.gpus}
        out = [by_index.get(i) for i in indices]
        return None if any(u is None for u in out) else [u for u in out if u]
