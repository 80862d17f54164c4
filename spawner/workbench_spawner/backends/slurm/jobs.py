"""What Slurm says, in our terms: job and node records, the tag, the job's start report.

Pure functions over Slurm's own output (``squeue --json``, ``sinfo --json``
of Slurm 22.05) plus the few commands that fetch it, so the rules have table
tests and the spawner, the placement and the service read Slurm one way. What we
say to sbatch is in ``sbatch.py``.

Why these sources: GPU indices come from Slurm's job detail (``gres_detail``,
the same ``gpu:type:N(IDX:0-1)`` that ``scontrol show job -d`` prints), never
from ``CUDA_VISIBLE_DEVICES``, which renumbers from 0 under cgroup device
confinement. Slurm never reports UUIDs: the job's start-up reports them.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

TAG_PREFIX = "workbench:"

# Slurm's pending reasons, in words a student understands. {what} is the request.
REASON_WORDS = {
    "Resources": "all {total} that fit are in use",
    "Priority": "jobs with higher priority are ahead",
    "Dependency": "it waits for another job",
    "QOSMaxGRESPerUser": "your Slurm QOS allows no more GPUs at once",
    "QOSGrpGRES": "your group's Slurm QOS has no GPUs left",
    "AssocGrpGRES": "your Slurm account has no GPUs left",
    "ReqNodeNotAvail": "the nodes it needs are unavailable (down, drained or reserved)",
    "PartitionDown": "the partition is down",
    "PartitionNodeLimit": "the partition cannot fit it",
    "BeginTime": "its start time has not come",
    "JobHeldAdmin": "an administrator holds it",
    "JobHeldUser": "it is held",
    "Reservation": "it waits for a reservation",
    "None": "Slurm has not looked at it yet",
}

# Pending reasons that no amount of waiting fixes: the spawn is cancelled at once. Not
# ReqNodeNotAvail: a drained or rebooting node comes back, so that job waits out the queue timeout.
HOPELESS_REASONS = (
    "PartitionConfig",
    "BadConstraints",
    "InvalidQOS",
    "InvalidAccount",
    "QOSMaxWallDurationPerJobLimit",
    "PartitionTimeLimit",
)


_HUB_ID = re.compile(r"^(?P<hub>[0-9a-f]{6,32}):")


def job_tag(user: str, server: str, hub: str = "") -> str:
    """The tag every job of ours carries (``--comment``): how a restarted hub finds its jobs.

    ``workbench:<hub>:<user>/<server>``, where ``hub`` is the hub's id (kept in
    its GPU database, ``settings.hub_id``): two hubs on one cluster each find
    their own jobs and leave the other's alone. User and server are
    percent-quoted, so neither can contain the ``:`` or ``/`` that separate them.
    """
    who = f"{quote(user, safe='')}/{quote(server, safe='')}"
    return f"{TAG_PREFIX}{hub}:{who}" if hub else f"{TAG_PREFIX}{who}"


def parse_tag_with_hub(comment: str | None) -> tuple[str, str, str] | None:
    """(hub id, user, server) from a job's comment (hub id "" for a tag without one), or None."""
    text = (comment or "").strip()
    if not text.startswith(TAG_PREFIX):
        return None
    rest = text[len(TAG_PREFIX) :]
    hub = ""
    found = _HUB_ID.match(rest)
    if found:
        hub, rest = found.group("hub"), rest[found.end() :]
    if "/" not in rest:
        return None
    user, _, server = rest.partition("/")
    return (hub, unquote(user), unquote(server)) if user else None


def parse_tag(comment: str | None) -> tuple[str, str] | None:
    """(user, server) from a job's comment, or None for a job that is not ours."""
    parsed = parse_tag_with_hub(comment)
    return parsed[1:] if parsed else None


_GRES = re.compile(r"^gpu(?::(?P<type>[^:(]+))?(?::(?P<count>\d+))?(?:\((?:IDX:)?(?P<idx>[^)]*)\))?$")


def parse_index_list(text: str) -> list[int]:
    """``0-1,3`` -> [0, 1, 3]; ``N/A`` or empty -> []."""
    out: list[int] = []
    for part in (text or "").split(","):
        part = part.strip()
        if not part or part.upper() == "N/A":
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


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
        text = raw.strip()
        if not text.startswith("gpu"):
            continue
        m = _GRES.match(text)
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
        indices: list[int] = []
        for _kind, _count, idx in parse_gres(job.get("gres_detail") or []):
            indices.extend(idx)
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

    def gres_types(self) -> list[str]:
        """The GRES type of each of the node's GPUs by Slurm's index (``gpu:h100:2,gpu:1g.18gb:1`` -> 3 types).

        Slurm numbers a node's GPUs across its gres.conf lines in order, so index 2
        above is the ``1g.18gb`` slice. A node read without ``gres`` has ``gpu_type`` on every index."""
        if not self.gres:
            return [self.gpu_type] * self.gpu_count
        return [kind for kind, count in self.gres for _ in range(count)]

    @property
    def usable(self) -> bool:
        return not any(s in self.state.upper() for s in ("DOWN", "DRAIN", "FAIL", "UNKNOWN", "NOT_RESPONDING"))


def parse_sinfo_json(text: str) -> list[SlurmNode]:
    """Nodes with their GPUs from ``sinfo --json``: GRES and GRES used."""
    data = json.loads(text or "{}")
    seen: dict[str, SlurmNode] = {}
    for node in data.get("nodes", []):
        name = str(node.get("name") or node.get("hostname") or "")
        if not name:
            continue
        declared = parse_gres(node.get("gres") or "")
        used: list[int] = []
        for _kind, _count, idx in parse_gres(node.get("gres_used") or ""):
            used.extend(idx)
        state = node.get("state", "")
        if isinstance(state, list):
            state = "+".join(state)
        flags = node.get("state_flags") or []
        if flags:
            state = "+".join([str(state), *map(str, flags)])
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
        )
    return sorted(seen.values(), key=lambda n: n.name)


def queue_position(jobs: Sequence[SlurmJob], job_id: str) -> int:
    """How many pending GPU jobs in the same partition Slurm would start before ``job_id``."""
    mine = next((j for j in jobs if j.job_id == job_id), None)
    if mine is None:
        return 0
    ahead = [
        j
        for j in jobs
        if j.pending
        and j.job_id != job_id
        and j.gpus_requested
        and j.partition == mine.partition
        and (j.priority, -j.submit_time, -int(j.job_id or 0))
        > (mine.priority, -mine.submit_time, -int(mine.job_id or 0))
    ]
    return len(ahead)


def pending_message(job: SlurmJob, ahead: int, total_gpus: int, what: str, noun: str = "GPUs") -> str:
    """The progress line for a pending job: Slurm's reason in words, and the position.

    ``total_gpus`` counts what the request asks for, ``noun`` names it: "GPUs", or "1g.18gb slices"
    for a slice request (a whole GPU does not fit a slice request, nor a slice a whole one)."""
    # "ReqNodeNotAvail, UnavailableNodes:n2" is a ReqNodeNotAvail: the words go by the first one.
    key = re.split(r"[ ,:(]", job.reason or "", maxsplit=1)[0]
    words = REASON_WORDS.get(key, "Slurm keeps it pending").format(total=f"{total_gpus} {noun}")
    position = f"{ahead} job{'s' if ahead != 1 else ''} ahead" if ahead else "next in line"
    return f"Waiting for {what}: {words} (Slurm: {job.reason or 'pending'}), {position}"


def is_hopeless(reason: str) -> bool:
    return any(reason.startswith(r) for r in HOPELESS_REASONS)


# -- the commands (blocking: call from a worker thread) -------------------------------------------


class SlurmUnavailable(RuntimeError):
    """Slurm's controller did not answer; str(err) says why."""


def run_slurm(args: list[str], timeout: float = 20) -> str:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmUnavailable(f"{args[0]} failed: {exc}") from None
    if done.returncode != 0:
        raise SlurmUnavailable(f"{' '.join(args[:2])}: {(done.stderr or done.stdout).strip()[:300]}")
    return done.stdout


def list_jobs() -> list[SlurmJob]:
    """Every job Slurm knows now (all users)."""
    return parse_squeue_json(run_slurm(["squeue", "--all", "--json"]))


def list_nodes() -> list[SlurmNode]:
    return parse_sinfo_json(run_slurm(["sinfo", "--json"]))


def partitions() -> list[str]:
    out = run_slurm(["sinfo", "-h", "-o", "%R"])
    return sorted({line.strip() for line in out.splitlines() if line.strip()})


def cancel(job_id: str) -> None:
    run_slurm(["scancel", str(job_id)])


def cancel_tagged(tag: str, user: str, jobs: Sequence[SlurmJob] | None = None) -> list[str]:
    """Cancel every pending or running job of ``user`` whose comment is ``tag``; their ids.

    For a spawn abandoned while ``sbatch`` still ran: the job may exist though
    the hub never learned its id. Only the user's own jobs: anyone can write
    a comment."""
    found = [
        j.job_id
        for j in (list_jobs() if jobs is None else jobs)
        if j.comment.strip() == tag and j.user == user and (j.pending or j.running)
    ]
    for job_id in found:
        cancel(job_id)
    return found


def set_priority(job_id: str, priority: int) -> None:
    """Slurm's priority of a pending job (the hub runs as Slurm's operator: root on the head node)."""
    run_slurm(["scontrol", "update", f"JobId={job_id}", f"Priority={int(priority)}"])


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
        gpus = tuple(dict(g) for g in data.get("gpus") or [] if isinstance(g, Mapping) and "uuid" in g)
        return cls(str(data["node"]), gpus, tuple(str(u) for u in data.get("job_gpus") or []))

    def uuids_for(self, indices: Iterable[int]) -> list[str] | None:
        by_index = {int(g.get("index", -1)): str(g["uuid"]) for g in self.gpus}
        out = [by_index.get(i) for i in indices]
        return None if any(u is None for u in out) else [u for u in out if u]
