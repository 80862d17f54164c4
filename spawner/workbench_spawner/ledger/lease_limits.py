"""Where a new lease meets its limits: checked inside the transaction that writes it.

Admission (``rules.admission``) checks the quota when a spawn's options are applied, counting the
leases held at that moment; two spawns of one user that overlap (two named servers, the default server
and a named one, an API script and the browser) would both pass it and both get a GPU. So the quota is
enforced again where the lease is written: ``AllocationStore.allocate`` (host placement: the local and
docker backends, time-sliced shares and MIG slices alike) and ``AllocationStore.adopt`` (an engine's
placement: Slurm, Kubernetes) call ``check`` inside their write transaction, after ``lock_leases``, from
the leases that transaction reads. Writers of leases are serialised there (SHARE ROW EXCLUSIVE on
PostgreSQL, BEGIN IMMEDIATE on SQLite), so of N spawns of one user at once exactly as many as the quota
allows get devices, and the others get ``QuotaExceededError``: the transaction rolls back, nothing is
written, and the student reads the same sentence admission would have said (``rules.quota``), naming
the other servers that hold the quota.

Only a lease for a start is limited. A lease recorded for a server that already runs (the reconciler's
or ``GPUPolicy.restore``'s adopt after a hub restart or a lost row) is a fact, not a request: those
callers pass no limits.

``LeaseLimits`` is the one value a lease is checked against; a course-wide ceiling belongs here too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from workbench_devices.mig import is_profile_name
from workbench_spawner.rules.admission import NoGPUAvailableError
from workbench_spawner.rules.quota import EffectiveQuota, ServerHolding, budget_spent, over_max_gpus

if TYPE_CHECKING:
    from workbench_spawner.ledger.store import Lease


class QuotaExceededError(NoGPUAvailableError):
    """A new lease would leave its user over quota; str(err) is the sentence for the student.

    A 403, not a wait: the spawn ends at once (host placement's line included), because what holds the
    quota is the user's own other server, which the student, not the line, decides to stop."""

    status = 403
    reason = "quota"


@dataclass(frozen=True)
class LeaseLimits:
    """What a new lease of one user must stay within, and the words its refusal uses.

    Built once per spawn from the effective quota admission read (``of``); placement adds what only it
    knows: ``kind`` (the request's ``SpawnRequest.kind``, so the sentence counts GPUs or slices as asked)
    and ``kinds`` (device UUID -> what it is, "H100-80GB" or "H200-141GB 1g.18gb", so the sentence says
    what the other servers hold)."""

    max_gpus: int  # devices at once over all the user's servers; a slice and a time-sliced share count 1
    gpu_hours_per_week: float | None = None  # None: no budget
    source: str = "the default quota"  # where the quota comes from, in words (``EffectiveQuota.describe``)
    contact: str = "a hub admin"  # who to ask for more
    kind: str | None = None
    kinds: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, quota: EffectiveQuota, contact: str) -> LeaseLimits:
        """The limits of ``quota`` (the effective quota of the spawn's user), ``contact`` named in refusals."""
        return cls(quota.quota.max_gpus, quota.quota.gpu_hours_per_week, quota.describe, contact)


def others_holding(
    leases: Sequence[Lease], user: str, server: str, kinds: Mapping[str, str] = {}
) -> tuple[ServerHolding, ...]:
    """What each of ``user``'s servers but ``server`` holds in ``leases``, in lease order: devices counted
    one each, and their kinds by ``kinds`` (device UUID -> words; an unknown device is left unnamed)."""
    held: list[ServerHolding] = []
    for lease in leases:
        if lease.user != user or lease.server == server or not lease.gpu_uuids:
            continue
        named = dict.fromkeys(kinds[uuid] for uuid in lease.gpu_uuids if kinds.get(uuid))
        held.append(ServerHolding(lease.server, len(lease.gpu_uuids), tuple(named)))
    return tuple(held)


def refusal(
    limits: LeaseLimits,
    user: str,
    server: str,
    count: int,
    leases: Sequence[Lease],
    hours_used: Callable[[], float],
) -> str | None:
    """Why a new lease of ``count`` devices for ``user``/``server`` may not be written, or None.

    ``leases``: the leases held now, as the writing transaction read them; only ``user``'s count (the store
    reads no others), and not the server's own, which the new one replaces. ``hours_used()``: the user's
    GPU-hours in the last 7 days with those leases, asked only where the quota has a budget. The budget
    first, then the count, as admission checks them."""
    budget = limits.gpu_hours_per_week
    if budget is not None:
        used = hours_used()
        if used >= budget:
            return budget_spent(limits.source, budget, used, limits.contact)
    others = others_holding(leases, user, server, limits.kinds)
    if sum(o.devices for o in others) + count > limits.max_gpus:
        slices = bool(limits.kind) and is_profile_name(str(limits.kind).split(" ")[-1])
        return over_max_gpus(count, slices, limits.source, limits.max_gpus, others, limits.contact)
    return None


def check(
    limits: LeaseLimits,
    user: str,
    server: str,
    count: int,
    leases: Sequence[Lease],
    hours_used: Callable[[], float],
) -> None:
    """Raise ``QuotaExceededError`` (the sentence) where ``refusal`` finds one; call it inside the
    transaction that writes the lease, so the refusal rolls it back."""
    why = refusal(limits, user, server, count, leases, hours_used)
    if why is not None:
        raise QuotaExceededError(why)
