"""Every way a server ends, as the sentence its student reads and the words the ledger keeps.

A student whose server is gone wants to know why in one sentence ("The node
wbnode1 this server ran on failed (Slurm: Not responding)."); an admin
reading ``api/usage`` wants the same end counted under one word ("node
failed"). An ``Ending`` carries both: ``reason`` is one of ``ledger.reasons``
(what usage reports group by), ``detail`` the few facts the ledger keeps
after it ("node failed: wbnode1"), ``message`` and ``hint`` what the spawn
page's stop box and the hub's home page show until the next start.

Backends build endings from their engine's facts (Docker's ``State``, a
pod's status and its node, Slurm's job state) with the functions below, so
the sentences are written here once and every backend says the same thing
for the same end. The stops the workbench service makes for its own reasons
(idle reclaim, a session limit, a reservation) announce their sentence
themselves (``NoticeBook.done``); an ``Ending`` is for everything else.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, replace

from workbench_spawner.ledger import reasons

LOG_LINES = 8
_LOG_LINE_CHARS = 200
# What a log line must never show, even to its own user: tokens in URLs and headers.
_SECRET = re.compile(r"(token=|Authorization: *token +|_TOKEN=|api_token[\"']?: *[\"']?)[^\s&\"']+", re.IGNORECASE)


@dataclass(frozen=True)
class Ending:
    """Why one server ended: the ledger's ``reason`` (``ledger.reasons``), its ``detail``, the student's
    sentence and an optional ``hint`` (advice, or the last lines of the server's log)."""

    reason: str
    message: str
    detail: str = ""
    hint: str = ""
    # Out of memory: the limit the server hit (bytes), so the spawner can name a profile that offers more.
    limit_bytes: int | None = None

    @property
    def ledger_reason(self) -> str:
        """What the ledger's ``reason`` column keeps (64 characters): ``"node failed: wbnode1"``."""
        text = f"{self.reason}: {self.detail}" if self.detail else self.reason
        return text[:64]

    @property
    def kind(self) -> str:
        """The notice kind (32 characters at most) this end is posted under."""
        return "end:" + re.sub(r"[^a-z]+", "-", self.reason.lower()).strip("-")[:28]

    def with_hint(self, hint: str) -> Ending:
        """The same end with ``hint`` added after the one it has."""
        if not hint:
            return self
        return replace(self, hint=f"{self.hint}\n{hint}" if self.hint else hint)


def gib(value: int) -> str:
    """Bytes as a person reads a memory limit: "16 GiB", "1.5 GiB", "512 MiB"."""
    if value >= 1 << 30:
        text = f"{value / (1 << 30):.1f}".removesuffix(".0")
        return f"{text} GiB"
    return f"{max(1, round(value / (1 << 20)))} MiB"


def log_tail(text: str, lines: int = LOG_LINES) -> str:
    """The last ``lines`` non-empty lines of a server's log, each cut to a readable length, tokens hidden."""
    kept = [line.rstrip() for line in (text or "").splitlines() if line.strip()][-lines:]
    return "\n".join(_SECRET.sub(r"\1[hidden]", line)[:_LOG_LINE_CHARS] for line in kept)


# -- someone asked the hub to stop it ------------------------------------------------------------


def stopped_by_user() -> Ending:
    return Ending(reasons.STOPPED_BY_USER, "You stopped this server.")


def stopped_by_admin(name: str = "") -> Ending:
    who = f"An admin ({name})" if name else "An admin"
    return Ending(reasons.STOPPED_BY_ADMIN, f"{who} stopped this server.", detail=name)


def stopped_by_culler(idle_seconds: float = 0) -> Ending:
    after = f" after {_minutes(idle_seconds)} without activity" if idle_seconds else " after a time without activity"
    return Ending(
        reasons.STOPPED_BY_CULLER,
        f"The hub's idle culler stopped this server{after}.",
        detail=_minutes(idle_seconds) if idle_seconds else "",
        hint="Your files are kept; start it again when you need it.",
    )


def stopped_by_service(name: str = "") -> Ending:
    who = f"The hub service {name}" if name else "A hub service"
    return Ending(reasons.STOPPED_BY_SERVICE, f"{who} stopped this server.", detail=name)


def stopped_by_hub(admin: str = "", service: str = "") -> Ending:
    """The hub stopped the server as it shut down. ``admin`` or ``service``: who shut it down through the hub's
    API (``POST /hub/api/shutdown`` with ``servers``), as the API said (``stop_requester.py``); neither: a stop
    nobody on record asked for (Ctrl-C or a signal to the hub, a direct call)."""
    if admin:
        return Ending(
            reasons.STOPPED_BY_ADMIN,
            f"An admin ({admin}) shut the hub down and stopped its servers.",
            detail=f"{admin}, hub shutdown",
        )
    if service:
        return Ending(
            reasons.STOPPED_BY_SERVICE,
            f"The hub service {service} shut the hub down and stopped its servers.",
            detail=f"{service}, hub shutdown",
        )
    return Ending(reasons.STOPPED, "The hub stopped this server (it was shutting down or restarting).")


# -- the server's own process ended --------------------------------------------------------------


def server_exited(exit_code: int | None = None, log: str = "") -> Ending:
    """The server's process ended on its own: it crashed, or the user shut it down from JupyterLab."""
    code = _exit_text(exit_code)
    tail = log_tail(log)
    return Ending(
        reasons.SERVER_EXITED,
        f"This server exited on its own{f' ({code})' if code else ''}.",
        detail=code,
        hint=f"The last lines of its log:\n{tail}" if tail else "",
    )


def server_exited_after_restart() -> Ending:
    """The server's process ended and nobody read how: the hub re-attached to it after a restart, so the hub is
    not its parent, and on Linux only a process's parent reads its exit code. JupyterHub's own poll answers 0
    for such a server ("0 if unknown", ``Spawner.poll``): taking that 0 for an exit code would make one up."""
    return Ending(
        reasons.SERVER_EXITED,
        "This server's process ended. The hub re-attached to it after a restart, so its exit code is unknown.",
        detail="exit code unknown",
    )


def out_of_memory(limit_bytes: int | None = None, what: str = "This server") -> Ending:
    """Killed by its memory limit (Docker's ``OOMKilled``, a pod's ``OOMKilled``, Slurm's OUT_OF_MEMORY)."""
    limit = f": it reached its limit of {gib(limit_bytes)}" if limit_bytes else ""
    return Ending(
        reasons.OUT_OF_MEMORY,
        f"{what} was stopped because it ran out of memory{limit}.",
        detail=f"{gib(limit_bytes)} limit" if limit_bytes else "",
        hint="Load less data at once, or choose a profile with more memory.",
        limit_bytes=limit_bytes,
    )


# -- the engine ended it -------------------------------------------------------------------------


def node_failed(node: str = "", why: str = "", engine: str = "") -> Ending:
    """The node died or was lost: Slurm's NODE_FAIL (with the node's reason), a Kubernetes node not Ready."""
    where = f"The node {node} this server ran on" if node else "The node this server ran on"
    said = f" ({engine}: {why})" if engine and why else (f" ({why})" if why else "")
    return Ending(
        reasons.NODE_FAILED,
        f"{where} failed{said}.",
        detail=node,
        hint="Your files are kept; start again and the hub places the server on a working node.",
    )


def pod_deleted() -> Ending:
    return Ending(
        reasons.POD_DELETED,
        "This server's pod was deleted outside the hub (by hand or by another tool).",
        hint="Your files are kept; start again. If it happens again, ask your admin.",
    )


def evicted(why: str = "", engine: str = "Kubernetes") -> Ending:
    said = f": {why.rstrip('.')}" if why else ""
    return Ending(
        reasons.EVICTED,
        f"{engine} evicted this server{said}.",
        detail=why[:40],
        hint="Your files are kept; start again when there is room.",
    )


def job_cancelled(job_id: str = "") -> Ending:
    job = f"The Slurm job {job_id}" if job_id else "The Slurm job"
    return Ending(reasons.JOB_CANCELLED, f"{job} running this server was cancelled outside the hub.", detail=job_id)


def job_timed_out(job_id: str = "", limit: str = "") -> Ending:
    job = f"The Slurm job {job_id}" if job_id else "The Slurm job"
    within = f" ({limit})" if limit else ""
    return Ending(
        reasons.JOB_TIMED_OUT,
        f"{job} running this server reached its time limit{within}.",
        detail=job_id,
        hint="Start again for a new session; save checkpoints of long runs.",
    )


def job_failed(job_id: str = "", exit_code: str = "") -> Ending:
    job = f"The Slurm job {job_id}" if job_id else "The Slurm job"
    code = f" (exit code {exit_code})" if exit_code else ""
    return Ending(reasons.SERVER_EXITED, f"{job} running this server failed{code}.", detail=f"job {job_id}")


# -- the hub ended it ----------------------------------------------------------------------------


def layout_changed() -> Ending:
    return Ending(
        reasons.LAYOUT_CHANGED,
        "This server's GPU slices were removed: the GPU's MIG layout changed.",
        hint="Your files are kept; start again on the new layout.",
    )


def gpus_leased_elsewhere(gpus: list[str]) -> Ending:
    """After a restart the hub found this server running on GPUs the ledger holds for another server (its own
    lease row was lost: a restored or wiped GPU database), and stopped it: a device a live server uses is never
    shared. The server's process did not exit on its own, and no exit code of it is known."""
    which = f" ({', '.join(gpus)})" if gpus else ""
    return Ending(
        reasons.STOPPED,
        f"The hub stopped this server after a restart: its GPUs{which} are leased to another server now.",
        detail="GPUs leased to another server",
        hint="Your files are kept; start it again to get a free GPU.",
    )


def server_gone() -> Ending:
    return Ending(reasons.SERVER_GONE, "This server was no longer running when the hub checked on it.")


def for_reason(reason: str) -> Ending:
    """The plain ending for a bare ledger reason (a backend or test that names only the reason)."""
    plain = {
        reasons.STOPPED: stopped_by_hub,
        reasons.STOPPED_BY_USER: stopped_by_user,
        reasons.STOPPED_BY_ADMIN: stopped_by_admin,
        reasons.STOPPED_BY_CULLER: stopped_by_culler,
        reasons.STOPPED_BY_SERVICE: stopped_by_service,
        reasons.SERVER_EXITED: server_exited,
        reasons.NODE_FAILED: node_failed,
        reasons.JOB_CANCELLED: job_cancelled,
        reasons.JOB_TIMED_OUT: job_timed_out,
        reasons.POD_DELETED: pod_deleted,
        reasons.EVICTED: evicted,
        reasons.OUT_OF_MEMORY: out_of_memory,
        reasons.LAYOUT_CHANGED: layout_changed,
        reasons.SERVER_GONE: server_gone,
    }.get(reason)
    return plain() if plain else Ending(reason, "")


def as_ending(said: Ending | str | None, otherwise: Ending) -> Ending:
    """What a backend hook said (an ``Ending``, a bare ledger reason, or None: nothing) as an ``Ending``."""
    if isinstance(said, Ending):
        return said
    return for_reason(said) if said else otherwise


# Ends the student already learned about from the spawn itself (JupyterHub shows a failed start's error), or
# that are not an end to them (a new start replaced the server): the ledger keeps them, no stop box.
SILENT = frozenset({reasons.START_FAILED, reasons.START_CANCELLED, reasons.REPLACED})


def _exit_text(code: int | None) -> str:
    """Says "exit code 1"; a signal's kill said as one: -9 (a process the hub waited on) or 137 (a container's
    128 + 9) is "killed by SIGKILL (exit code 137)"."""
    if code is None:
        return ""
    number = -code if code < 0 else code - 128 if code > 128 else 0
    try:
        name = signal.Signals(number).name if number else ""
    except ValueError:
        name = ""
    if name:
        return f"killed by {name}, exit code {code}"
    return f"exit code {code}"


def _minutes(seconds: float) -> str:
    if seconds < 90:
        return f"{round(seconds)} seconds"
    minutes = round(seconds / 60)
    return f"{minutes} minute{'s' if minutes != 1 else ''}"
