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
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

from workbench_spawner.ledger import reasons

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
            reason=str(node.get("reason") or ""),
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


def pending_message(
    job: SlurmJob,
    ahead: int,
    total_gpus: int,
    what: str,
    noun: str = "GPUs",
    unavailable: Mapping[str, tuple[int, str]] | None = None,
) -> str:
    """The progress line for a pending job: Slurm's reason in words, and the position.

    ``total_gpus`` counts what the request asks for on nodes that take jobs now, ``noun`` names it:
    "GPUs", or "1g.18gb slices" for a slice request (a whole GPU does not fit a slice request, nor a
    slice a whole one). ``unavailable``: node -> (how many of those are on it, why it takes no job),
    for nodes that are down, drained or not responding; said after the position, so "all 2 GPUs that
    fit are in use" is not read as a cluster of 2."""
    # "ReqNodeNotAvail, UnavailableNodes:n2" is a ReqNodeNotAvail: the words go by the first one.
    key = re.split(r"[ ,:(]", job.reason or "", maxsplit=1)[0]
    words = REASON_WORDS.get(key, "Slurm keeps it pending").format(total=f"{total_gpus} {noun}")
    position = f"{ahead} job{'s' if ahead != 1 else ''} ahead" if ahead else "next in line"
    text = f"Waiting for {what}: {words} (Slurm: {job.reason or 'pending'}), {position}"
    return text + unavailable_note(unavailable or {}, noun)


def unavailable_note(unavailable: Mapping[str, tuple[int, str]], noun: str = "GPUs") -> str:
    """ "; 2 more GPUs are on wbnode1, which takes no jobs now: down, not responding", or "" (none)."""
    counted = {node: (n, why) for node, (n, why) in unavailable.items() if n > 0}
    if not counted:
        return ""
    total = sum(n for n, _why in counted.values())
    what = f"{total} more {noun[:-1] if total == 1 and noun.endswith('s') else noun} {'is' if total == 1 else 'are'}"
    if len(counted) == 1:
        ((node, (_n, why)),) = counted.items()
        return f"; {what} on {node}, which takes no jobs now: {why}"
    where = "; ".join(f"{node} {why}" for node, (_n, why) in sorted(counted.items()))
    return f"; {what} on nodes that take no jobs now: {where}"


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


# Job ids this hub process cancelled (a stop, a queue timeout, a failed start), newest last, so a job
# that ends CANCELLED is told apart from one an admin or the user cancelled with scancel. Bounded: a
# job's final state is read within a poll or two of the cancel.
_HUB_CANCELLED: OrderedDict[str, None] = OrderedDict()
_HUB_CANCELLED_MAX = 10_000
_hub_cancelled_lock = threading.Lock()


def note_hub_cancel(job_id: str) -> None:
    """Remember that this hub cancels ``job_id`` (before the scancel, so no poll sees it unannounced)."""
    with _hub_cancelled_lock:
        _HUB_CANCELLED[str(job_id)] = None
        _HUB_CANCELLED.move_to_end(str(job_id))
        while len(_HUB_CANCELLED) > _HUB_CANCELLED_MAX:
            _HUB_CANCELLED.popitem(last=False)


def cancelled_by_hub(job_id: str) -> bool:
    """Whether this hub process cancelled ``job_id`` (``note_hub_cancel``)."""
    with _hub_cancelled_lock:
        return str(job_id) in _HUB_CANCELLED


def cancel(job_id: str) -> None:
    note_hub_cancel(job_id)
    run_slurm(["scancel", str(job_id)])


# A job's final state (squeue's %T, ``job_state``) -> why its server ended, in the ledger's words. Not
# here, so None (the server exited): COMPLETED, FAILED (the server's process ended with an error),
# TIMEOUT and DEADLINE (its time limit, the session length the hub set, ran out).
_END_REASONS = {
    "NODE_FAIL": reasons.NODE_FAILED,
    "BOOT_FAIL": reasons.NODE_FAILED,  # the node failed to boot for the job: a node failure
    "OUT_OF_MEMORY": reasons.OUT_OF_MEMORY,
    "PREEMPTED": reasons.EVICTED,
    "CANCELLED": reasons.JOB_CANCELLED,
}


def end_reason(state: str, hub_cancelled: bool = False) -> str | None:
    """Why a job that left the running states ended, in the ledger's words (``ledger.reasons``); None
    where Slurm's state says nothing beyond "the server exited".

    ``hub_cancelled``: this hub cancelled the job (``cancelled_by_hub``): a CANCELLED job was then
    stopped through the hub, never "cancelled outside the hub". ``state`` may carry more words
    (``CANCELLED by 0``, ``NODE_FAIL wbnode1``): the first one counts."""
    word = (state or "").strip().split(" ", 1)[0].upper()
    if word == "CANCELLED" and hub_cancelled:
        return reasons.STOPPED
    return _END_REASONS.get(word)


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
