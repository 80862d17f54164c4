"""What Slurm says, in our terms: job and node records from ``squeue --json`` and ``sinfo --json``.

Pure functions over Slurm's own output (Slurm 22.05 field names; the later
``{"set": true, "number": n}`` numbers read too), so the rules have table
tests and the spawner, the placement and the service read Slurm one way. The
commands that fetch the output are in ``jobs.py``; what a pending job's
state means, in ``job_states.py``; an ended one's, in ``ending.py``.

Why these sources: GPU indices come from Slurm's job detail (``gres_detail``,
the same ``gpu:type:N(IDX:0-1)`` that ``scontrol show job -d`` prints), never
from ``CUDA_VISIBLE_DEVICES``, which renumbers from 0 under cgroup device
confinement. Slurm never reports UUIDs: the job's start-up reports them
(``node_report.py``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from workbench_spawner.backends.slurm.tags import parse_tag, parse_tag_with_hub

_GRES = re.compile(r"^gpu(?::(?P<type>[^:(]+))?(?::(?P<count>\d+))?(?:\((?:IDX:)?(?P<idx>[^)]*)\))?$")


def expand_ranges(text: str) -> list[str]:
    """Slurm's range list: ``0-1,3`` -> ``0 1 3``; ``01-02,07`` -> ``01 02 07`` (zero padding kept).

    The one reader of Slurm's ranges: GRES indices here, node names and device
    files in gres.conf (``gres_map.expand``)."""
    out: list[str] = []
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        if not high:
            out.append(low)
            continue
        width = len(low) if low.startswith("0") else 0
        out.extend(f"{n:0{width}d}" for n in range(int(low), int(high) + 1))
    return out


def parse_index_list(text: str) -> list[int]:
    """``0-1,3`` -> [0, 1, 3]; ``N/A`` or empty -> []."""
    return [int(n) for n in expand_ranges(text or "") if n and n.upper() != "N/A"]


def parse_gres(entries: str | Iterable[str] | None) -> list[tuple[str, int, list[int]]]:
    """GPU entries of a GRES string: ``gpu:h100:2(IDX:0-1),shard:4`` -> [("h100", 2, [0, 1])].

    Accepts Slurm's comma-joined string or a list (``gres_detail``); entries
    that are not GPUs are left out. A bare count (``gpu:2``) has type "".
    """
    if entries is None:
        return []
    if isinstance(entries, str):
        # Split on commas outside the (IDX:...) parentheses.
        entries = re.findall(r"[^,(]+(?:\([^)]*\))?", entries)
    out = []
    for raw in entries:
        m = _GRES.match(raw.strip())
        if not m:
            continue
        kind = m.group("type") or ""
        if kind.isdigit() and not m.group("count"):  # gpu:2
            kind, count = "", int(kind)
        else:
            count = int(m.group("count") or 0)
        out.append((kind, count, parse_index_list(m.group("idx") or "")))
    return out


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    state: str
    reason: str = ""
    node: str = ""
    user: str = ""
    comment: str = ""
    gpu_indices: tuple[int, ...] = ()
    gpus_requested: int = 0
    priority: int = 0
    submit_time: int = 0
    partition: str = ""
    start_time: int = 0

    @property
    def tag(self) -> tuple[str, str] | None:
        return parse_tag(self.comment)

    def belongs_to(self, hub: str) -> bool:
        """A job of the hub with id ``hub`` (a tag without a hub id belongs to every hub)."""
        parsed = parse_tag_with_hub(self.comment)
        return parsed is not None and parsed[0] in ("", hub)

    @property
    def pending(self) -> bool:
        return self.state in ("PENDING", "CONFIGURING", "REQUEUED")

    @property
    def running(self) -> bool:
        return self.state in ("RUNNING", "COMPLETING")


def _number(value: Any) -> int:
    # Slurm 22.05 writes plain numbers; later versions {"set": true, "number": n}.
    if isinstance(value, Mapping):
        value = value.get("number", 0)
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _requested_gpus(job: Mapping[str, Any]) -> int:
    text = job.get("tres_per_node") or job.get("tres_req_str") or ""
    total = 0
    for part in str(text).split(","):
        bits = part.strip().split(":")
        if "gpu" in bits[:2] and bits[-1].isdigit():
            total += int(bits[-1])
        elif part.startswith("gres/gpu=") or part.startswith("gres:gpu="):
            total += int(part.split("=", 1)[1] or 0)
    return total


def parse_squeue_json(text: str) -> list[SlurmJob]:
    """Jobs from ``squeue --json`` (Slurm 22.05 field names)."""
    data = json.loads(text or "{}")
    jobs = []
    for job in data.get("jobs", []):
        state = job.get("job_state", "")
        if isinstance(state, list):  # later Slurm: a list of flags
            state = state[0] if state else ""
        indices = [i for _kind, _count, idx in parse_gres(job.get("gres_detail") or []) for i in idx]
        jobs.append(
            SlurmJob(
                job_id=str(job.get("job_id", "")),
                state=str(state),
                reason=str(job.get("state_reason", "") or ""),
                node=str(job.get("batch_host") or job.get("nodes") or ""),
                user=str(job.get("user_name", "")),
                comment=str(job.get("comment", "") or ""),
                gpu_indices=tuple(indices),
                gpus_requested=_requested_gpus(job),
                priority=_number(job.get("priority")),
                submit_time=_number(job.get("submit_time")),
                partition=str(job.get("partition", "")),
                start_time=_number(job.get("start_time")),
            )
        )
    return jobs


@dataclass(frozen=True)
class SlurmNode:
    name: str
    address: str
    state: str
    gpu_type: str = ""
    gpu_count: int = 0
    gpus_used: tuple[int, ...] = ()
    partitions: tuple[str, ...] = ()
    # Each GPU GRES line of the node as (type, count), in Slurm's order: a MIG slice's type is its profile.
    gres: tuple[tuple[str, int], ...] = ()
    # Why the node is in its state, as an admin or Slurm wrote it ("Not responding", "bad DIMM").
    reason: str = ""

    def gres_types(self) -> list[str]:
        """The GRES type of each of the node's GPUs by Slurm's index (``gpu:h100:2,gpu:1g.18gb:1`` -> 3 types).

        Slurm numbers a node's GPUs across its gres.conf lines in order, so index 2
        above is the ``1g.18gb`` slice. A node read without ``gres`` has ``gpu_type`` on every index."""
        if not self.gres:
            return [self.gpu_type] * self.gpu_count
        return [kind for kind, count in self.gres for _ in range(count)]

    @property
    def usable(self) -> bool:
        """Whether Slurm would start a new job here now (``unusable_because`` is None)."""
        return self.unusable_because() is None

    def unusable_because(self) -> str | None:
        """Why Slurm starts no new job on this node now, in words ("down, not responding (Not responding)");
        None for a node that takes jobs.

        The node's GPUs are then neither free nor in use for the spawn form and the wait sentence: a
        student should not wait for "all 4 GPUs" when 2 of them sit on a dead node."""
        return node_unusable(self.state, self.reason)


# A node's base state (``sinfo --json``'s ``state``) that takes no new job, in words.
_UNUSABLE_BASE = {
    "DOWN": "down",
    "FUTURE": "not in service yet (FUTURE)",
    "UNKNOWN": "not registered with Slurm yet",
    "ERROR": "in an error state",
}
# State flags (``state_flags``; Slurm writes some of them in two spellings) under which Slurm
# starts no new job on the node. Not REBOOT_REQUESTED (jobs still run until the reboot is issued), not
# RESERVED or PLANNED (an ordinary reservation or backfill plan), not POWERING_UP (jobs wait for the boot).
_UNUSABLE_FLAGS = {
    "NOT_RESPONDING": "not responding",
    "NO_RESPOND": "not responding",
    "POWERED_DOWN": "powered down",
    "POWER_DOWN": "powering down",
    "POWERING_DOWN": "powering down",
    "MAINTENANCE": "in a maintenance reservation",
    "MAINT": "in a maintenance reservation",
    "REBOOT_ISSUED": "rebooting",
    "INVALID_REG": "registered with a configuration Slurm refused",
}


def node_unusable(state: str, reason: str = "") -> str | None:
    """The rule behind ``SlurmNode.unusable_because`` for Slurm's state text and the node's reason.

    ``state`` is the base state and its flags joined by ``+`` (``IDLE+DRAIN``, ``DOWN+NOT_RESPONDING``,
    as ``parse_sinfo_json`` writes them); ``sinfo``'s compound words (``DRAINED``, ``DRAINING``,
    ``DOWN*``) read the same. A drain reads "drained" on a node with nothing left running, "draining"
    on one whose jobs still run."""
    tokens = [t.strip().rstrip("*~#!%$@^-") for t in state.upper().split("+") if t.strip()]
    if not tokens:
        return None
    base, flags = tokens[0], tokens[1:]
    words: list[str] = []
    if base in _UNUSABLE_BASE:
        words.append(_UNUSABLE_BASE[base])
    running = base in ("ALLOCATED", "ALLOC", "MIXED", "MIX", "COMPLETING", "DRAINING")
    if base.startswith("DRAIN") or any(f.startswith("DRAIN") for f in flags):
        words.append("draining" if running else "drained")
    if base in ("FAIL", "FAILING") or "FAIL" in flags:
        words.append("failing" if running or base == "FAILING" else "failed")
    for flag in flags:
        word = _UNUSABLE_FLAGS.get(flag)
        if word and word not in words:
            words.append(word)
    if not words:
        return None
    why = reason.strip()
    said = ", ".join(words)
    # Slurm's own reason for a node that stopped answering is "Not responding": not said twice.
    return said + (f" ({why})" if why and why.lower() not in words else "")


def parse_sinfo_json(text: str) -> list[SlurmNode]:
    """Nodes with their GPUs from ``sinfo --json``: GRES and GRES used."""
    data = json.loads(text or "{}")
    seen: dict[str, SlurmNode] = {}
    for node in data.get("nodes", []):
        name = str(node.get("name") or node.get("hostname") or "")
        if not name:
            continue
        declared = parse_gres(node.get("gres") or "")
        used = [i for _kind, _count, idx in parse_gres(node.get("gres_used") or "") for i in idx]
        # The base state and its flags as one text, "IDLE+DRAIN" (later Slurm writes the state as a list).
        base = node.get("state", "")
        state = "+".join(map(str, [*(base if isinstance(base, list) else [base]), *(node.get("state_flags") or [])]))
        prev = seen.get(name)
        parts = tuple(sorted({*(prev.partitions if prev else ()), *(node.get("partitions") or [])}))
        seen[name] = SlurmNode(
            name=name,
            address=str(node.get("address") or name),
            state=str(state).upper(),
            gpu_type=declared[0][0] if declared else "",
            gpu_count=sum(c for _k, c, _i in declared),
            gpus_used=tuple(sorted(set(used))),
            partitions=parts,
            gres=tuple((k, c) for k, c, _i in declared),
            reason=str(node.get("reason") or ""),
        )
    return sorted(seen.values(), key=lambda n: n.name)
