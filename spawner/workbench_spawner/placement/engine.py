"""Placement by an engine (Slurm, Kubernetes): the engine picks the GPUs, the policy admits and records.

``EnginePlacement`` is what the mixin's engine template drives
(``GPUSpawnerMixin._start_by_engine``): ``admit_to_queue`` holds a request
back while submitting it would eat into what open reservations keep,
``withdraw`` takes it back when the submission failed, and ``place`` (the
base signature, with the submitted ``EngineJob``) follows the job in the
engine's queue with the engine's reason, learns node and GPUs back from
what the engine says and what the server reported, and writes the lease.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from workbench_devices import GPUDevice
from workbench_spawner.placement.host import NoGPUAvailableError, Placement


def _quiet(text: str) -> None:
    return None


def _no_report() -> None:
    return None


@dataclass(frozen=True)
class EngineJob:
    """A server submitted to an engine, as its backend hands it to placement.

    ``job_id``: the engine's id (Slurm's job id, a pod's name). ``started``
    (called in a worker thread) returns the server's start report once it
    arrived (the node and the GPU UUIDs it sees), else None. ``submitted``:
    when the engine took it, on the placement's clock (the hub's line orders
    by it; 0: when placement first follows it). ``kind``: the request's
    ``SpawnRequest.kind`` (a model, a MIG profile, or ``"<model> <profile>"``;
    None: what ``place`` is given, a whole-GPU model or any GPU), so a slice
    request waits as "1 1g.18gb slice" among that profile's slices and its
    lease is charged by each slice's share of a GPU. The template fills in
    ``deadline`` (the queue timeout's end, on the placement's clock),
    ``admitted`` (the key ``admit_to_queue`` registered) and ``describe``
    (progress events for the user).
    """

    job_id: str
    started: Callable[[], Any] = _no_report
    describe: Callable[[str], None] = _quiet
    deadline: float | None = None
    admitted: str = ""
    submitted: float = 0.0
    kind: str | None = None


class EnginePlacement(Placement):
    """Placement that follows an engine's queue."""

    clock: Callable[[], float]
    # An engine hands out slices only where its backend maps a profile to the engine's own resource
    # (a Slurm GRES type, a Kubernetes MIG resource); until then a slice request is refused in words.
    pins_slices = False

    @abstractmethod
    async def admit_to_queue(
        self,
        key: str,
        count: int,
        model: str | None,
        groups: Sequence[str],
        deadline: float,
        describe: Callable[[str], None] = _quiet,
    ) -> None:
        """Return once submitting leaves what open reservations keep; NoGPUAvailableError at ``deadline``."""

    @abstractmethod
    def withdraw(self, key: str) -> None:
        """The admitted request ``key`` is not going to the engine's queue after all (the submission failed)."""

    def unusable(self, devices: Sequence[GPUDevice]) -> dict[str, str]:
        """Which of ``devices`` the engine would give no new server now, and why: device UUID -> words
        ("node wbnode1 is down, not responding (Not responding)"). Blocking (a worker thread).

        The policy's ``status`` reads it, so the spawn form, admission and the fleet count such a device
        as neither free nor in use: a GPU on a dead node is no GPU a student can wait for. An engine that
        answers from its own records caches them for a few seconds (the form asks on every render). By
        default every device is usable."""
        return {}


class EngineJobEndedError(NoGPUAvailableError):
    """The engine's job ended (cancelled, deleted, failed) before its server started."""


class ReportMismatchError(NoGPUAvailableError):
    """A start report that disagrees with the engine's own record; str(err) is the user's sentence."""


class ReportConflictError(ValueError):
    """A start report that contradicts what the hub already knows of a node's GPUs; str(err) is for the admin."""


@dataclass(frozen=True)
class Look:
    """One look at a submitted job in the engine (``EngineTemplate.look``'s answer).

    Exactly one outcome: ``node`` set (the engine placed it there; ``record`` is the engine's own record of
    it, which ``uuids`` checks the report against), ``ended`` (the sentence: it ended before the server
    started), ``refused`` (the sentence: the engine says it can never run, the template cancels it, logging
    ``refused_why``), or still waiting: ``text`` is the user's sentence in the engine's words, ``report``
    what the policy hears (``(ahead,)`` or ``(ahead, words)``) and ``detail`` what the timeout sentence
    says it was waiting for."""

    node: str = ""
    record: Any = None
    ended: str = ""
    refused: str = ""
    refused_why: str = ""
    text: str = ""
    report: tuple[Any, ...] = ()
    detail: str = ""
