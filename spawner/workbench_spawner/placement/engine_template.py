"""The engine placement template: everything Slurm, Kubernetes (or a third engine) share.

An engine's placement subclasses ``EngineTemplate`` and writes only what
differs (``docs`` of the class list the hooks): one look at its queue, how a
start report maps to UUIDs, what the hub learns of a node, cancelling, and
its own words. The sentences the user reads are built here from the
engine's vocabulary, so every engine words a wait, a timeout and a conflict
the same way.
"""

from __future__ import annotations

import asyncio
import time
from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from workbench_devices import DeviceInventory
from workbench_spawner.ledger.lease_limits import LeaseLimits, QuotaExceededError
from workbench_spawner.ledger.store import AllocationStore, Lease
from workbench_spawner.placement.engine import (
    EngineJob,
    EngineJobEndedError,
    EnginePlacement,
    Look,
    ReportConflictError,
    ReportMismatchError,
    _quiet,
)
from workbench_spawner.placement.engine_reservations import EngineReservations
from workbench_spawner.placement.host import NoGPUAvailableError, Report, _nothing
from workbench_spawner.rules.queue_order import Waiting
from workbench_spawner.rules.reservations import gpus_text


@dataclass(frozen=True)
class EngineWords:
    """An engine's own words, from which the template builds every sentence the user reads.

    ``placed``, ``no_report``, ``held`` and ``conflict`` are ``str.format`` templates: the engine writes
    the whole sentence (so each reads naturally), the template fills in ``{job}`` (the job's id),
    ``{node}``, ``{uuids}`` (comma-separated), ``{timeout}`` (``report_timeout``), ``{grace}``
    (``release_grace``) and ``{problem}`` (what the report contradicts)."""

    engine: str  # as a person names it: "Slurm", "Kubernetes"
    the_job: str  # "the job", "the pod"
    job_noun: str  # what names a job before its id: "Slurm job" 7, "pod" wb/wb-alice
    job_gone: str  # what the hub did with it on failure: "the job was cancelled", "the pod was deleted"
    answerer: str  # who did not answer: "Slurm's controller", "the Kubernetes API"
    placed: str  # progress once placed: "Slurm started the job on {node}; waiting for the server to report its GPUs"
    no_report: str  # the server did not report within ``report_timeout``
    held: str  # the ledger still holds the GPUs the engine gave after ``release_grace``
    conflict: str  # the report contradicts what the hub knows of the node
    place_verb: str = "start"  # "Slurm did not *start* the job ...", "Kubernetes did not *place* the pod ..."
    nothing_made: str = "nothing was submitted"  # admission refused: "no pod was created"
    nothing_submitted: str = "Nothing was submitted, so there is nothing to place."


class EngineTemplate(EnginePlacement):
    """The whole engine placement; an engine supplies only its hooks and words.

    ``admit_to_queue`` waits while submitting would eat into what open reservations keep; ``place`` follows
    the submitted job: it registers it as pending (the hub's line and the reservations' count), waits until
    the engine placed it (the user sees the engine's words, the deadline cancels it), waits for the server's
    start report, checks it against the engine's record, learns the node's UUIDs, writes the lease (waiting
    out the moment the ledger lags the engine, ``release_grace``) and cancels the job on every failure.

    An engine implements: ``free_gpus`` (what is free in the engine, for the reservations' check; blocking),
    ``look`` (one poll of the engine: pending with its own words, placed on a node, ended), ``uuids`` (how a
    report maps to the leased UUIDs, ``ReportMismatchError`` if it disagrees), ``learn_from`` (what the hub
    learns of the node, ``ReportConflictError`` if it contradicts what is known), and its ``words``. It may
    override ``cancel`` (default: nothing; the spawner ends it), ``joining`` (its queue entry), ``holds_reserved``,
    ``trouble`` (why a placed job cannot start), ``ended`` (whether it is gone, asked while the lease waits) and
    the settings below.
    """

    words: EngineWords
    Job: type[EngineJob] = EngineJob  # the jobs it follows (a Kubernetes placement follows pods only)
    ref_prefix = "engine"  # a lease's ref: "<prefix>:<job id>"
    unavailable_errors: tuple[type[Exception], ...] = ()  # the engine did not answer
    report_poll = 0.2  # seconds between looks for the start report (at most poll_interval)

    def __init__(
        self,
        store: AllocationStore,
        inventory: Callable[[], DeviceInventory],
        reservations: EngineReservations,
        poll_interval: float = 1.0,
        report_timeout: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
        release_grace: float = 60.0,
    ):
        super().__init__(store)
        self.inventory = inventory
        self.reservations = reservations
        self.poll_interval = poll_interval
        self.report_timeout = report_timeout
        self.clock = clock
        self.release_grace = release_grace
        # job id -> its entry in the hub's line, for every job of ours the engine keeps pending.
        self._pending: dict[str, Waiting] = {}
        # The reservation check and the admission it leads to are one step: ten non-members who ask
        # at the same second do not all see the same free GPUs.
        self._admitting = asyncio.Lock()

    # -- the hooks ---------------------------------------------------------------------------------

    @abstractmethod
    def free_gpus(self, inventory: DeviceInventory) -> list[str]:
        """The UUIDs of ``inventory`` the engine has free now, as the reservations' check counts them (blocking;
        may raise one of ``unavailable_errors``)."""

    @abstractmethod
    async def look(self, job: EngineJob, what: str, kind: str | None, memo: dict[str, Any]) -> Look:
        """One poll of the engine for ``job`` (may raise one of ``unavailable_errors``); ``memo`` persists
        across the polls of one wait."""

    @abstractmethod
    def uuids(self, job: EngineJob, look: Look, report: Any, count: int) -> list[str]:
        """The leased UUIDs the ``report`` names, checked against the engine's record; ReportMismatchError."""

    @abstractmethod
    def learn_from(self, job: EngineJob, look: Look, report: Any) -> None:
        """Learn the node's UUIDs from a checked report (blocking); ReportConflictError if it contradicts the hub."""

    async def cancel(self, job_id: str, why: str) -> None:
        """End the job the engine holds (the placement failed). By default nothing: the spawner ends it."""
        return None

    async def joining(self, job: EngineJob, user: str) -> Waiting:
        """The job's entry in the hub's line (fair share reads the user's GPU-hours here)."""
        return Waiting(key=job.job_id, user=user, joined=job.submitted or self.clock())

    def holds_reserved(self, job: EngineJob) -> bool:
        """Whether the pending job counts against what open reservations keep (whole GPUs do)."""
        return True

    def trouble(self, job: EngineJob, node: str) -> str:
        """While the report is awaited: the sentence if the placed job cannot start, else ""."""
        return ""

    async def ended(self, job: EngineJob) -> str:
        """While the lease waits for the ledger: the sentence if the job is gone, else ""."""
        try:
            look = await self.look(job, "", None, {"seen": True})
        except self.unavailable_errors:
            return ""
        return look.ended

    # -- sentences in the engine's words ----------------------------------------------------------

    def job_name(self, job_id: str) -> str:
        """The job as a sentence names it: "Slurm job 7", "pod wb/wb-alice"."""
        return f"{self.words.job_noun} {job_id}"

    def ended_before_start(self, job_id: str, how: str) -> str:
        """The sentence when the job ended before its server started: "The Slurm job 7 ended ... (FAILED)."."""
        return f"The {self.job_name(job_id)} ended before the server started ({how})."

    def _say(self, sentence: str, job: EngineJob, node: str, uuids: Sequence[str] = (), problem: Any = "") -> str:
        """One of the engine's sentence templates (``EngineWords``) filled in for ``job``."""
        return sentence.format(
            job=job.job_id,
            node=node,
            uuids=", ".join(uuids),
            timeout=self.report_timeout,
            grace=self.release_grace,
            problem=problem,
        )

    # -- the template ------------------------------------------------------------------------------

    def waiting(self) -> int:
        return len(self._pending)

    def waiting_by_group(self) -> dict[str, int]:
        return self.reservations.waiting_by_group()

    async def admit_to_queue(
        self,
        key: str,
        count: int,
        model: str | None,
        groups: Sequence[str],
        deadline: float,
        describe: Callable[[str], None] = _quiet,
    ) -> None:
        """Return once submitting leaves what open reservations keep; NoGPUAvailableError at ``deadline``.

        The check and the admission it leads to are one step (``_admitting``). From then on the request counts
        as about to take GPUs (``reservations.asking[key]``) until ``place`` follows its job or ``withdraw(key)``.
        The user sees why it waits."""
        note = ""
        while True:
            async with self._admitting:
                ok, why = await asyncio.to_thread(self._may_submit, groups, count, model)
                if ok:
                    self.reservations.asking[key] = (frozenset(groups), count, model)
                    return
            if why != note:
                describe(f"Waiting for {gpus_text(count, model)} outside reserved ones: {why}")
                note = why
            if self.clock() >= deadline:
                raise NoGPUAvailableError(
                    f"No {gpus_text(count, model)} outside reserved ones came free in time ({why}); "
                    f"{self.words.nothing_made}. Try again later, ask for fewer GPUs, or start a CPU-only server "
                    "(0 GPUs)."
                )
            await asyncio.sleep(self.poll_interval)

    def _may_submit(self, groups: Sequence[str], count: int, model: str | None) -> tuple[bool, str]:
        """The reservations' check with what the engine has free (blocking); an engine that did not answer says so."""
        try:
            return self.reservations.may_submit(groups, count, model, self.free_gpus)
        except self.unavailable_errors as exc:
            return False, f"{self.words.answerer} did not answer ({exc})"

    def withdraw(self, key: str) -> None:
        """The admitted request ``key`` is not going to the engine's queue after all (the submission failed)."""
        self.reservations.asking.pop(key, None)

    async def place(
        self,
        user: str,
        server: str,
        count: int,
        model: str | None,
        timeout: float,
        report: Report = _nothing,
        groups: Sequence[str] = (),
        job: EngineJob | None = None,
        limits: LeaseLimits | None = None,
    ) -> Lease | None:
        """The lease of the placed, reported ``job`` (None for 0 GPUs), or NoGPUAvailableError (the job cancelled).

        ``job.started`` is called in a worker thread and returns the server's start report once it came.
        ``limits``: the user's quota, checked where the lease is written (``_adopt``)."""
        if not isinstance(job, self.Job) or not job.job_id:
            raise NoGPUAvailableError(self.words.nothing_submitted)
        kind = job.kind or model  # what the wait names the request by, as ``gpus_text`` takes it
        if limits is not None:  # a refusal over quota counts what was asked for: GPUs or slices
            limits = replace(limits, kind=kind)
        what = gpus_text(count, kind)
        deadline = self.clock() + timeout if job.deadline is None else job.deadline
        self._pending[job.job_id] = await self.joining(job, user)
        if self.holds_reserved(job):
            self.reservations.asking[job.job_id] = (frozenset(groups), count, model)
        self.withdraw(job.admitted)
        try:
            placed = await self._until_placed(job, what, kind, deadline, timeout, report)
        finally:
            self._pending.pop(job.job_id, None)
            self.reservations.asking.pop(job.job_id, None)
        job.describe(self._say(self.words.placed, job, placed.node))
        started = await self._until_reported(job, placed.node)
        if not count:
            return None
        try:
            uuids = self.uuids(job, placed, started, count)
        except ReportMismatchError:
            await self.cancel(job.job_id, "its GPU report does not match the engine's record")
            raise
        try:
            # Only now, checked against the engine's record, and only the job's node and GPUs.
            await asyncio.to_thread(self.learn_from, job, placed, started)
        except ReportConflictError as exc:
            await self.cancel(job.job_id, "its GPU report contradicts what the hub knows of the node")
            raise NoGPUAvailableError(self._say(self.words.conflict, job, placed.node, problem=exc)) from None
        await self._adopt(job, user, server, uuids, placed.node, groups, limits)
        lease = await asyncio.to_thread(self.store.lease_of, user, server)
        if lease is None:  # released under us (a stop raced the start)
            raise NoGPUAvailableError(
                f"The lease of {self.job_name(job.job_id)} was released while the server started."
            )
        return lease

    async def _until_placed(
        self, job: EngineJob, what: str, kind: str | None, deadline: float, timeout: float, report: Report
    ) -> Look:
        last = detail = ""
        memo: dict[str, Any] = {}
        words = self.words
        while True:
            try:
                look = await self.look(job, what, kind, memo)
            except self.unavailable_errors as exc:
                job.describe(f"Waiting for {words.answerer} to answer ({exc})")
                look = None
            if look is not None:
                if look.ended:  # nothing left to cancel
                    raise EngineJobEndedError(look.ended)
                if look.refused:
                    await self.cancel(job.job_id, look.refused_why or f"{words.engine} cannot run it")
                    raise NoGPUAvailableError(look.refused)
                if look.node:
                    return look
                detail = look.detail
                if look.text != last:
                    report(*look.report)
                    job.describe(look.text)
                    last = look.text
            if self.clock() >= deadline:
                await self.cancel(job.job_id, "queue timeout")
                raise NoGPUAvailableError(
                    f"{words.engine} did not {words.place_verb} {words.the_job} for {what} within {timeout:g} seconds "
                    f"({detail or 'pending'}); {words.job_gone}. Try again later, ask for fewer GPUs, or start a "
                    "CPU-only server (0 GPUs)."
                )
            await asyncio.sleep(self.poll_interval)

    def ahead_in_line(self, job_id: str) -> int:
        """How many of this hub's pending jobs joined the line before ``job_id`` (the hub's own FIFO)."""
        mine = self._pending.get(job_id)
        if mine is None:
            return 0
        return sum(1 for k, w in self._pending.items() if k != job_id and w.joined < mine.joined)

    async def _until_reported(self, job: EngineJob, node: str) -> Any:
        end = self.clock() + self.report_timeout
        while self.clock() < end:
            found = await asyncio.to_thread(job.started)
            if found is not None:
                return found
            trouble = self.trouble(job, node)
            if trouble:
                await self.cancel(job.job_id, "its server cannot start")
                raise EngineJobEndedError(trouble)
            await asyncio.sleep(min(self.report_poll, self.poll_interval))
        await self.cancel(job.job_id, "no start report")
        raise NoGPUAvailableError(self._say(self.words.no_report, job, node))

    async def _adopt(
        self,
        job: EngineJob,
        user: str,
        server: str,
        uuids: list[str],
        node: str,
        groups: Sequence[str],
        limits: LeaseLimits | None = None,
    ) -> None:
        """Write the lease; while another server's lease still names these GPUs, wait for its release.

        An engine gives a GPU away as soon as the job that held it is gone, and the hub releases that
        job's lease when its stop (or poll) sees it gone: for a moment the ledger lags the engine. Only a
        lease that stays past ``release_grace`` is a real conflict (the ledger names GPUs the engine gave
        to someone else): then the job is cancelled.

        ``limits``: the user's quota, checked in the transaction that writes the lease. Two spawns of one
        user that passed admission together may both be placed by the engine; the second to write its lease
        is refused: its job is cancelled and the student reads the sentence naming the server that holds
        the quota (``QuotaExceededError``, a 403; the spawner's failed start releases and cancels too)."""
        end = self.clock() + self.release_grace
        told = False
        shares, kinds = await asyncio.to_thread(lambda: (self._shares(uuids), self._kinds()))
        if limits is not None:  # the sentence names what the user's other servers hold
            limits = replace(limits, kinds=kinds)
        ref = f"{self.ref_prefix}:{job.job_id}"

        def adopt() -> bool:
            return self.store.adopt(user, server, uuids, ref, None, node, tuple(groups), shares=shares, limits=limits)

        while True:
            try:
                if await asyncio.to_thread(adopt):
                    return
            except QuotaExceededError:
                await self.cancel(job.job_id, "its user is over their GPU quota")
                raise
            if self.clock() >= end:
                await self.cancel(job.job_id, "its GPUs are leased to another server")
                raise NoGPUAvailableError(self._say(self.words.held, job, node, uuids))
            gone = await self.ended(job)
            if gone:
                raise EngineJobEndedError(gone)
            if not told:
                job.describe(
                    f"{self.words.engine} gave {self.words.the_job} {', '.join(uuids)}; waiting for its previous "
                    "server to release it"
                )
                told = True
            await asyncio.sleep(self.poll_interval)

    def _kinds(self) -> dict[str, str]:
        """What each device of the inventory is ("H100-80GB", "H200-141GB 1g.18gb"), for a refusal's words."""
        return {d.uuid: d.kind for d in self.inventory().devices}

    def _shares(self, uuids: Sequence[str]) -> dict[str, float]:
        """Each leased device's share of a GPU (a ``1g`` slice 1/7): what GPU-hours charge (reads the database)."""
        devices = self.inventory().by_uuid()
        return {uuid: devices[uuid].share for uuid in uuids if uuid in devices}
