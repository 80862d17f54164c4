"""After a hub restart: an engine's jobs without a lease, adopted or ended by one rule for every engine.

Servers keep running while the hub is down (``cleanup_servers = False``). The
policy first releases every lease whose job is gone; then ``reconcile_walk``
goes through the engine's jobs of this hub that have no lease. What each job
is (``Orphan``: whose, pending or placed, which GPUs it holds as far as the hub
can name them) is the engine's reading; the rule is shared:

* one the engine leaves alone (``Orphan.left``: another hub's, created by this
  hub process, CPU-only) is left, with why;
* still **pending**: the spawn that waited for it is gone with the old hub
  process, so it is ended (a job nobody waits for must not take GPUs);
* **placed** on GPUs the hub can name, that nobody else holds: adopted, a lease
  is written with the job's node and start time (``adopter``: charged by each
  device's share of a GPU, as before the restart);
* **placed** otherwise (GPUs never recorded, or leased to another server):
  ended, because the ledger could not count it.

Ending a job the engine does not answer for is logged and the walk goes on
(the next pass tries again); the reconciler counts each adopted and each
ended job on /metrics (``ReconcileWords.fixes``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from workbench_devices import DeviceInventory
from workbench_spawner.ledger.reconcile_book import SERVER_ADOPTED, SERVER_STOPPED
from workbench_spawner.ledger.store import AllocationStore

Adopt = Callable[[str, str, list[str], str, datetime | None, str], bool]  # AllocationStore.adopt's first six


@dataclass(frozen=True)
class Action:
    """What reconcile did with one job: "adopted", the engine's word for ending it (with why) or "left"."""

    ident: str  # the engine's name of the job: a Slurm job id, a pod's name
    what: str
    why: str = ""


@dataclass(frozen=True)
class Orphan:
    """One engine job of this hub without a lease, as the engine reads it.

    ``left``: leave it alone, and why. ``uuids``: the GPUs it holds, None where the hub cannot name one."""

    ident: str
    user: str
    server: str
    ref: str = ""
    node: str = ""
    since: datetime | None = None
    pending: bool = False
    uuids: Sequence[str | None] = ()
    left: str = ""


@dataclass(frozen=True)
class ReconcileWords:
    """How an engine's reconcile logs and names its decisions."""

    noun: str  # "pod", "Slurm job"
    ended: str  # Action.what for a job the rule ends: "deleted", "cancelled"
    end_verb: str  # in the log: "Deleting", "Cancelling"
    end_failed: str  # in the log when the engine did not answer: "Could not delete pod"
    pending_why: str  # "not scheduled, no spawn waiting"
    unknown_why: str  # "its GPUs were never recorded"
    held_why: str = "its GPUs are leased to another server"

    @property
    def fixes(self) -> dict[str, str]:
        """The reconciler's fix kinds (``GPUPolicy.count_fixes``) of the actions: adopted, or ended by the rule."""
        return {"adopted": SERVER_ADOPTED, self.ended: SERVER_STOPPED}


def adopter(store: AllocationStore, inventory: DeviceInventory) -> Adopt:
    """``store.adopt`` recording each device's share of a GPU: an adopted MIG slice is charged as a slice
    (a ``1g`` slice-hour is 1/7 of a GPU-hour), as it was before the hub restarted."""
    shares = {d.uuid: d.share for d in inventory.devices}

    def adopt(user: str, server: str, uuids: list[str], ref: str, since: datetime | None, node: str) -> bool:
        return store.adopt(user, server, uuids, ref, since, node, shares=shares)

    return adopt


def reconcile_walk(
    orphans: Iterable[Orphan | None],
    adopt: Adopt,
    end: Callable[[str], None],
    words: ReconcileWords,
    log: logging.Logger,
    unavailable: type[Exception] | tuple[type[Exception], ...] = (),
) -> list[Action]:
    """Apply the rule above to the engine's reading of its jobs (None: nothing to do); every decision is
    logged and returned. ``end(ident)`` cancels or deletes a job (``unavailable``: the errors it raises when
    the engine does not answer, logged); ``adopt`` is ``AllocationStore.adopt``'s first six arguments."""

    def end_quietly(ident: str) -> None:
        try:
            end(ident)
        except unavailable as exc:
            log.warning("%s %s: %s", words.end_failed, ident, exc)

    actions = []
    for job in orphans:
        if job is None:
            continue
        if job.left:
            actions.append(Action(job.ident, "left", job.left))
            continue
        if job.pending:
            log.warning(
                "%s pending %s %s of %s/%s: no spawn waits for it any more",
                words.end_verb,
                words.noun,
                job.ident,
                job.user,
                job.server,
            )
            end_quietly(job.ident)
            actions.append(Action(job.ident, words.ended, words.pending_why))
            continue
        known = [u for u in job.uuids if u]
        named = len(known) == len(job.uuids)
        if named and adopt(job.user, job.server, known, job.ref, job.since, job.node):
            log.info(
                "Adopted %s %s of %s/%s on %s with GPU(s) %s",
                words.noun,
                job.ident,
                job.user,
                job.server,
                job.node,
                ", ".join(known) or "none",
            )
            actions.append(Action(job.ident, "adopted"))
            continue
        why = words.held_why if named else words.unknown_why
        log.warning("%s %s %s of %s/%s: %s", words.end_verb, words.noun, job.ident, job.user, job.server, why)
        end_quietly(job.ident)
        actions.append(Action(job.ident, words.ended, why))
    return actions
