"""Drained GPUs: the ``gpu_drains`` table, so an admin can change a GPU's MIG layout safely.

A MIG layout can change only while nothing runs on the GPU, and a busy hub
never waits for that by itself: a new server takes the GPU as soon as the
last one stops. Draining closes the GPU to new leases while servers already
on it keep running until they stop; undraining opens it again. The hub's
own placement (``HostAllocator.candidates``: the local and docker backends)
reads this table on every try, so a request already waiting in line is not
given a GPU drained after it joined; the spawn form, the fleet page and
``api/gpus`` show the state. An engine (Slurm, Kubernetes) places by
itself: drain the node there.

What is stored is the UUID that was named, one row each: a whole GPU, a
GPU in MIG mode (its slices' ``parent_uuid``; no inventory device itself)
or one slice. A slice counts as drained when its own UUID or its GPU's is
stored (``is_drained``): draining a GPU drains all its slices, and the
slices a layout change makes, under new UUIDs, stay drained until the GPU
is undrained. Every call is one transaction (blocking: call it from a
worker thread); ``drained()`` is one small read, cheap enough for every try.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import DateTime, Integer, String, Text, UniqueConstraint, delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, mapped_column

from workbench_devices import GPUDevice
from workbench_spawner.ledger.store import AllocationStore, Base, _aware, utcnow

# The longest reason a drain may give (the service's DrainBody schema says the same).
MAX_REASON = 500


class DrainRow(Base):
    __tablename__ = "gpu_drains"
    __table_args__ = (UniqueConstraint("gpu_uuid", name="one_drain_per_device"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    gpu_uuid: Mapped[str] = mapped_column(String(128))
    reason: Mapped[str] = mapped_column(Text, default="")
    drained_by: Mapped[str] = mapped_column(String(255), default="")
    since: Mapped[datetime] = mapped_column(DateTime(timezone=True))


@dataclass(frozen=True)
class Drain:
    """One drained device as stored: since when, by whom and why."""

    gpu_uuid: str
    reason: str
    drained_by: str
    since: datetime

    def to_json(self) -> dict[str, Any]:
        return {
            "gpu_uuid": self.gpu_uuid,
            "reason": self.reason,
            "drained_by": self.drained_by,
            "since": self.since.isoformat(),
        }


class UnknownGPUError(LookupError):
    """A name that is no GPU or slice of the inventory; str(err) says so in a sentence."""


class AmbiguousGPUError(ValueError):
    """An index that names GPUs on several nodes; str(err) says to name it by UUID."""


@dataclass(frozen=True)
class DrainTarget:
    """What a name resolved to: ``gpu_uuid``, what draining stores (a whole GPU, a MIG-mode GPU or
    one slice), and the inventory devices it covers (the GPU itself, each of its slices, or the slice)."""

    gpu_uuid: str
    devices: tuple[str, ...]


def is_drained(device: GPUDevice, drained: set[str] | frozenset[str]) -> bool:
    """Whether ``device`` may get no new lease: it is drained, or it is a slice of a drained GPU."""
    return device.uuid in drained or bool(device.parent_uuid and device.parent_uuid in drained)


def resolve_gpu(name: str, devices: Sequence[GPUDevice]) -> DrainTarget:
    """The GPU ``name`` means on this hub: its UUID (``GPU-...``; a GPU in MIG mode by its own UUID
    covers all its slices), one slice's ``MIG-...`` UUID, or its index (on a hub with one node, or
    where the index is on one node only). UnknownGPUError or AmbiguousGPUError, with a sentence, otherwise."""
    name = name.strip()
    wanted = name.lower()
    for device in devices:
        if device.uuid.lower() == wanted:
            return DrainTarget(device.uuid, (device.uuid,))
    slices = [d for d in devices if d.parent_uuid and d.parent_uuid.lower() == wanted]
    if slices:
        return DrainTarget(slices[0].parent_uuid, tuple(d.uuid for d in slices))
    if name.isascii() and name.isdigit() and len(name) < 6:
        gpus: dict[tuple[str, str], list[GPUDevice]] = {}
        for device in devices:
            if device.index == int(name):
                gpus.setdefault((device.node, device.parent_uuid or device.uuid), []).append(device)
        if len(gpus) > 1:
            nodes = sorted({node or "this host" for node, _ in gpus})
            raise AmbiguousGPUError(
                f"GPU index {name} is on several nodes ({', '.join(nodes)}); name the GPU by its UUID instead"
            )
        if gpus:
            ((_, gpu_uuid), found) = next(iter(gpus.items()))
            return DrainTarget(gpu_uuid, tuple(d.uuid for d in found))
    raise UnknownGPUError(f"this hub has no GPU or MIG slice named {json.dumps(name[:80])}")


def _drain(row: DrainRow) -> Drain:
    return Drain(row.gpu_uuid, row.reason or "", row.drained_by or "", _aware(row.since))


class DrainBook:
    """Drain, undrain and list drained devices; each call one transaction (blocking: use a worker thread)."""

    def __init__(self, store: AllocationStore):
        self._writes = store.writes()
        self._reads = store.reads()

    def drained(self) -> set[str]:
        """The UUIDs drained now: one read of a table of a few rows (placement asks on every try)."""
        with self._reads() as session:
            return set(session.scalars(select(DrainRow.gpu_uuid)))

    def rows(self) -> list[Drain]:
        with self._reads() as session:
            return [_drain(r) for r in session.scalars(select(DrainRow).order_by(DrainRow.id))]

    def drain(self, uuids: Iterable[str], reason: str = "", by: str = "", now: datetime | None = None) -> list[Drain]:
        """Drain each of ``uuids``. One drained already keeps its ``since`` and who drained it (the
        GPU has been closed since then); a new, non-empty ``reason`` replaces the old one."""
        uuids = list(dict.fromkeys(uuids))
        reason = reason[:MAX_REASON]
        now = now or utcnow()
        try:
            return self._drain(uuids, reason, by[:255], now)
        except IntegrityError:
            # Another admin drained one of them at the same moment (PostgreSQL): a second look sees their row.
            return self._drain(uuids, reason, by[:255], now)

    def _drain(self, uuids: list[str], reason: str, by: str, now: datetime) -> list[Drain]:
        with self._writes.begin() as session:
            existing = {r.gpu_uuid: r for r in session.scalars(select(DrainRow).where(DrainRow.gpu_uuid.in_(uuids)))}
            for uuid in uuids:
                row = existing.get(uuid)
                if row is None:
                    row = existing[uuid] = DrainRow(gpu_uuid=uuid, reason=reason, drained_by=by, since=now)
                    session.add(row)
                elif reason:
                    row.reason = reason
            session.flush()
            return [_drain(existing[uuid]) for uuid in uuids]

    def undrain(self, uuids: Iterable[str]) -> list[str]:
        """Open each of ``uuids`` to new leases again; the ones that were drained (none: nothing changed)."""
        uuids = list(dict.fromkeys(uuids))
        with self._writes.begin() as session:
            found = list(session.scalars(select(DrainRow.gpu_uuid).where(DrainRow.gpu_uuid.in_(uuids))))
            if found:
                session.execute(delete(DrainRow).where(DrainRow.gpu_uuid.in_(found)))
            return found


def covered(uuid: str, devices: Iterable[GPUDevice]) -> list[GPUDevice]:
    """The inventory devices a stored drain of ``uuid`` closes: the device itself, or a MIG GPU's slices."""
    return [d for d in devices if d.uuid == uuid or (d.parent_uuid and d.parent_uuid == uuid)]
