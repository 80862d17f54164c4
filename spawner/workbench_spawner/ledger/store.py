"""The allocation store: which server holds which GPU, kept in one database.

The database, not any process's memory, is the source of truth. Every
allocation is one transaction, and a unique constraint on (gpu_uuid, slot)
means two spawns can never hold the same GPU slot even if two hub processes
race on PostgreSQL. On SQLite a write transaction starts with BEGIN
IMMEDIATE, so writers queue instead of failing; reads go through a second
engine whose transactions are deferred, so with WAL a read never waits for a
writer and never blocks one. Released leases move to a usage ledger, which
quotas on GPU-hours read later.

Every lease names the **node** its GPUs are on (the host name on a single
host, the Slurm node on a cluster), so the fleet view, metrics and ledger can
tell two nodes' GPU 0 apart.

Every lease row also records the **share** of a GPU its device is (1.0 for
a whole GPU; a MIG slice's ``g / 7``, from the inventory's
``GPUDevice.share``), and the ledger row copies it when the lease ends:
GPU-hours charge share x hours, and a later MIG layout change does not
rewrite history.

A lease for a start may carry its user's **limits** (``ledger.lease_limits``):
``allocate`` and ``adopt`` then check the quota inside their write
transaction, from the leases it reads, so two spawns of one user at once
cannot both pass it; a refusal rolls the transaction back.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import (
    DateTime,
    Float,
    Integer,
    Select,
    String,
    Text,
    UniqueConstraint,
    delete,
    select,
)
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from workbench_spawner.ledger import lease_limits
from workbench_spawner.ledger.connection import LEASES_TABLE, lock_leases, make_engine
from workbench_spawner.ledger.lease_limits import LeaseLimits
from workbench_spawner.ledger.reasons import REPLACED


class Base(DeclarativeBase):
    pass


class LeaseRow(Base):
    """One GPU slot held by one user server."""

    __tablename__ = LEASES_TABLE
    __table_args__ = (UniqueConstraint("gpu_uuid", "slot", name="one_holder_per_slot"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    gpu_uuid: Mapped[str] = mapped_column(String(128), index=True)
    slot: Mapped[int] = mapped_column(Integer, default=0)
    user: Mapped[str] = mapped_column(String(255), index=True)
    server: Mapped[str] = mapped_column(String(255), default="")
    since: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # What the backend needs to find the server again: a pid, a container id.
    ref: Mapped[str] = mapped_column(String(255), default="")
    node: Mapped[str] = mapped_column(String(255), default="")
    # The user's JupyterHub groups when the lease began (a JSON list):
    # reservations count what their members hold, in the hub and the service alike.
    groups: Mapped[str] = mapped_column(Text, default="[]")
    # The share of a GPU this device is (1.0 whole, 1/7 for a 1g MIG slice): migration 0005.
    share: Mapped[float] = mapped_column(Float, default=1.0, server_default="1.0")


class UsageRow(Base):
    """A finished lease: the ledger behind GPU-hour budgets."""

    __tablename__ = "gpu_usage"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    gpu_uuid: Mapped[str] = mapped_column(String(128))
    user: Mapped[str] = mapped_column(String(255), index=True)
    server: Mapped[str] = mapped_column(String(255), default="")
    started: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    ended: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    reason: Mapped[str] = mapped_column(String(64), default="")
    node: Mapped[str] = mapped_column(String(255), default="")
    share: Mapped[float] = mapped_column(Float, default=1.0, server_default="1.0")  # the lease's, copied
    # The sentence its student was told (``ledger.endings``; migration 0008); "" before it, or for no sentence.
    message: Mapped[str] = mapped_column(Text, default="", server_default="")


@dataclass(frozen=True)
class Lease:
    """The GPUs one server holds.

    ``shares`` goes with ``gpu_uuids``, one per device: the share of a GPU
    each is (1.0 whole, a MIG slice's ``g / 7``); left out, every device is
    a whole GPU."""

    user: str
    server: str
    gpu_uuids: tuple[str, ...]
    since: datetime
    ref: str = ""
    node: str = ""
    groups: tuple[str, ...] = ()
    shares: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.shares:
            object.__setattr__(self, "shares", (1.0,) * len(self.gpu_uuids))
        elif len(self.shares) != len(self.gpu_uuids):
            raise ValueError(f"a lease of {len(self.gpu_uuids)} device(s) needs as many shares, not {len(self.shares)}")

    @property
    def gpu_share(self) -> float:
        """How many GPUs' worth this lease holds (two 1g slices: 2/7): what an hour of it charges."""
        return sum(self.shares)


def share_of(shares: Mapping[str, float] | None, uuid: str) -> float:
    """The share of a GPU ``uuid`` is by ``shares`` (uuid -> share; missing: a whole GPU, 1.0)."""
    value = 1.0 if shares is None else float(shares.get(uuid, 1.0))
    if not 0.0 < value <= 1.0:
        raise ValueError(f"the share of a GPU that {uuid} is must be more than 0 and at most 1, not {value:g}")
    return value


def utcnow() -> datetime:
    return datetime.now(UTC)


def _aware(value: datetime) -> datetime:
    # SQLite hands datetimes back without a zone; they were stored in UTC.
    return value if value.tzinfo else value.replace(tzinfo=UTC)


class AllocationStore:
    """Allocate, release and list GPU leases, each call one transaction."""

    def __init__(self, url: str):
        self.url = url
        self.engine = make_engine(url)
        # Bring the schema to the newest revision (Alembic); a database made
        # by an older create_all is adopted by the first revision.
        from workbench_spawner.ledger.migrations import upgrade

        upgrade(self.engine)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self.read_engine = make_engine(url, readonly=True) if url.startswith("sqlite") else self.engine
        self._reads = sessionmaker(self.read_engine, expire_on_commit=False)

    def writes(self) -> sessionmaker:
        """Sessions for transactions that change something (BEGIN IMMEDIATE on SQLite)."""
        return self._sessions

    def reads(self) -> sessionmaker:
        """Sessions for reads only: they never take the write lock."""
        return self._reads

    # -- writes -------------------------------------------------------------

    def allocate(
        self,
        user: str,
        server: str,
        count: int,
        candidates: Sequence[str],
        slots_per_gpu: int | Mapping[str, int] = 1,
        retries: int = 20,
        node: str = "",
        groups: Sequence[str] = (),
        choose: Callable[[list[str], list[Lease]], list[str]] | None = None,
        *,
        shares: Mapping[str, float] | None = None,
        limits: LeaseLimits | None = None,
    ) -> Lease | None:
        """Give ``user``/``server`` ``count`` distinct GPUs from ``candidates``.

        Returns None when not enough are free; never a partial allocation.
        Any lease the same server still held is replaced, because a server that
        is starting cannot also be running. ``choose(free, leases)``, if
        given, narrows the free GPUs (in preference order) inside the same
        transaction, from the leases that transaction sees: reservations
        are enforced there, so two spawns can never both take the last GPU
        a reservation keeps. ``slots_per_gpu`` may differ per device (uuid ->
        servers; missing: 1). ``shares`` (uuid -> share of a GPU; missing:
        1.0) is recorded with each device: the inventory's ``GPUDevice.share``.
        ``limits``: the user's quota for a start (``lease_limits.check``),
        checked before any device is looked for: over it, ``QuotaExceededError``
        and nothing changes, even where no GPU is free.
        """
        if count < 1:
            raise ValueError("count must be at least 1")
        for attempt in range(retries):
            try:
                with self._sessions.begin() as session:
                    lock_leases(session)
                    if limits is not None:
                        self._check(session, limits, user, server, count)
                    self._delete_lease(session, user, server, reason=REPLACED)
                    taken: dict[str, set[int]] = {}
                    # Plain rows, not ORM objects: every placement reads every lease here, under the lock.
                    for uuid, slot in session.execute(select(LeaseRow.gpu_uuid, LeaseRow.slot)):
                        taken.setdefault(uuid, set()).add(slot)
                    order = {uuid: i for i, uuid in enumerate(candidates)}

                    def slots(uuid: str) -> int:
                        return slots_per_gpu.get(uuid, 1) if isinstance(slots_per_gpu, Mapping) else slots_per_gpu

                    free = [u for u in candidates if len(taken.get(u, ())) < slots(u)]
                    if len(free) < count:
                        return None
                    # Least-shared GPUs first, then inventory order.
                    free.sort(key=lambda u: (len(taken.get(u, ())), order[u]))
                    if choose is not None:
                        free = choose(free, _group(session.execute(select(*_LEASE_COLUMNS).order_by(LeaseRow.id))))
                        if len(free) < count:
                            return None
                    now = utcnow()
                    chosen = free[:count]
                    chosen_shares = tuple(share_of(shares, uuid) for uuid in chosen)
                    for uuid, share in zip(chosen, chosen_shares, strict=True):
                        slot = min(set(range(slots(uuid))) - taken.get(uuid, set()))
                        session.add(
                            LeaseRow(
                                gpu_uuid=uuid,
                                slot=slot,
                                user=user,
                                server=server,
                                since=now,
                                node=node,
                                groups=json.dumps(list(groups)),
                                share=share,
                            )
                        )
                return Lease(user, server, tuple(chosen), now, node=node, groups=tuple(groups), shares=chosen_shares)
            except (IntegrityError, OperationalError):
                # Another writer won the race for a slot (PostgreSQL) or the
                # database was busy for longer than busy_timeout: try again.
                time.sleep(0.01 * (attempt + 1))
        raise RuntimeError(f"could not allocate GPUs for {user}/{server}: the database stayed contended")

    def adopt(
        self,
        user: str,
        server: str,
        gpu_uuids: Sequence[str],
        ref: str,
        since: datetime | None = None,
        node: str = "",
        groups: Sequence[str] = (),
        *,
        shares: Mapping[str, float] | None = None,
        limits: LeaseLimits | None = None,
    ) -> bool:
        """Record a lease for GPUs placed outside this store: a server found
        running without one (after a lost database row), or a job an engine
        such as Slurm placed. Refused, with no change, if any of its GPUs is
        held by someone else now. ``groups`` and ``shares`` as in ``allocate``.

        ``limits``: the user's quota, for the lease of a start (an engine's
        job): over it, ``QuotaExceededError`` and nothing changes. A server
        that already runs (reconcile, restore) is adopted without limits: it
        is a fact, not a request. The GPUs are checked first: a lease the
        ledger has not released yet (``False``, the caller waits) is not a
        quota matter."""
        recorded = {uuid: share_of(shares, uuid) for uuid in gpu_uuids}
        try:
            with self._sessions.begin() as session:
                lock_leases(session)
                taken = set(session.scalars(select(LeaseRow.gpu_uuid)))
                if taken & set(gpu_uuids):
                    return False
                if limits is not None:
                    self._check(session, limits, user, server, len(gpu_uuids))
                for uuid in gpu_uuids:
                    session.add(
                        LeaseRow(
                            gpu_uuid=uuid,
                            slot=0,
                            user=user,
                            server=server,
                            since=since or utcnow(),
                            ref=ref,
                            node=node,
                            groups=json.dumps(sorted(groups)),
                            share=recorded[uuid],
                        )
                    )
            return True
        except IntegrityError:
            return False

    def release(
        self, user: str, server: str, reason: str = "stopped", *, since: datetime | None = None, message: str = ""
    ) -> tuple[str, ...]:
        """Free whatever ``user``/``server`` holds; safe to call twice.

        ``since``: only the lease that began then. A start cancelled while its
        allocation ran in a worker thread releases that allocation later, by
        then perhaps replaced by a new start of the same server, whose lease
        it must not end. ``message``: the sentence the student was told (``ledger.endings``)."""
        with self._sessions.begin() as session:
            return self._delete_lease(session, user, server, reason, since=since, message=message)

    def set_ref(self, user: str, server: str, ref: str) -> None:
        with self._sessions.begin() as session:
            for row in session.scalars(select(LeaseRow).where(LeaseRow.user == user, LeaseRow.server == server)):
                row.ref = ref

    def _check(self, session: Session, limits: LeaseLimits, user: str, server: str, count: int) -> None:
        """``lease_limits.check`` from the leases this write transaction reads (after ``lock_leases``): only the
        user's own (``gpu_leases.user`` is indexed), all a quota counts, so the check's cost does not grow with
        everyone else's leases (``benchmarks/quota_check.py``)."""
        leases = _group(session.execute(_leases_of(user)))

        def hours_used() -> float:
            from workbench_spawner.ledger.gpu_hours import gpu_hours_used  # it reads this module's rows

            return gpu_hours_used(self, user, leases=leases, within=session.connection())

        lease_limits.check(limits, user, server, count, leases, hours_used)

    def _delete_lease(
        self,
        session: Session,
        user: str,
        server: str,
        reason: str,
        since: datetime | None = None,
        message: str = "",
    ) -> tuple[str, ...]:
        rows = list(session.scalars(select(LeaseRow).where(LeaseRow.user == user, LeaseRow.server == server)))
        if since is not None:
            rows = [row for row in rows if _aware(row.since) == _aware(since)]
        if not rows:
            return ()
        now = utcnow()
        for row in rows:
            session.add(
                UsageRow(
                    gpu_uuid=row.gpu_uuid,
                    user=row.user,
                    server=row.server,
                    started=_aware(row.since),
                    ended=now,
                    reason=reason[:64],
                    node=row.node or "",
                    share=row.share if row.share is not None else 1.0,
                    message=message,
                )
            )
        session.execute(delete(LeaseRow).where(LeaseRow.id.in_([r.id for r in rows])))
        return tuple(r.gpu_uuid for r in rows)

    # -- reads --------------------------------------------------------------

    def leases(self) -> list[Lease]:
        # Plain rows of the columns, not ORM objects: the reconciler, the form and the fleet read every lease
        # often, and building 2,000 tracked objects cost more than the query (benchmarks/churn.py).
        with self._reads() as session:
            rows = list(session.execute(select(*_LEASE_COLUMNS).order_by(LeaseRow.id)))
        return _group(rows)

    def lease_of(self, user: str, server: str) -> Lease | None:
        with self._reads() as session:
            rows = list(
                session.execute(
                    select(*_LEASE_COLUMNS)
                    .where(LeaseRow.user == user, LeaseRow.server == server)
                    .order_by(LeaseRow.id)
                )
            )
        leases = _group(rows)
        return leases[0] if leases else None

    def leases_of(self, user: str) -> list[Lease]:
        """Every lease ``user`` holds now, over all their servers (``lease_limits``' early look; indexed)."""
        with self._reads() as session:
            rows = list(session.execute(_leases_of(user)))
        return _group(rows)

    def holders(self) -> dict[str, list[tuple[str, str]]]:
        """GPU UUID -> [(user, server), ...] for every held slot."""
        result: dict[str, list[tuple[str, str]]] = {}
        for lease in self.leases():
            for uuid in lease.gpu_uuids:
                result.setdefault(uuid, []).append((lease.user, lease.server))
        return result

    def usage(self, since: datetime | None = None, user: str | None = None) -> list[UsageRow]:
        with self._reads() as session:
            query = select(UsageRow).order_by(UsageRow.id)
            if since is not None:
                query = query.where(UsageRow.ended >= since)
            if user is not None:
                query = query.where(UsageRow.user == user)
            return list(session.scalars(query))

    def dispose(self) -> None:
        self.engine.dispose()
        self.read_engine.dispose()


# What a Lease is built from (``_group``).
_LEASE_COLUMNS = (
    LeaseRow.user,
    LeaseRow.server,
    LeaseRow.gpu_uuid,
    LeaseRow.since,
    LeaseRow.ref,
    LeaseRow.node,
    LeaseRow.groups,
    LeaseRow.share,
)


def _leases_of(user: str) -> Select:
    """The lease rows of ``user``, in row order (``gpu_leases.user`` is indexed): the quota's check inside a
    writing transaction and ``leases_of`` read the same."""
    return select(*_LEASE_COLUMNS).where(LeaseRow.user == user).order_by(LeaseRow.id)


@functools.lru_cache(maxsize=1024)
def _groups(text: str | None) -> tuple[str, ...]:
    try:
        value = json.loads(text or "[]")
    except ValueError:
        return ()
    return tuple(str(g) for g in value) if isinstance(value, list) else ()


def _group(rows: Iterable) -> list[Lease]:
    """Leases from lease rows (ORM rows or plain rows of ``_LEASE_COLUMNS``), one per server, in row order."""
    grouped: dict[tuple[str, str], list[LeaseRow]] = {}
    for row in rows:
        grouped.setdefault((row.user, row.server), []).append(row)
    return [
        Lease(
            user=user,
            server=server,
            gpu_uuids=tuple(r.gpu_uuid for r in group),
            since=_aware(min(r.since for r in group)),
            ref=group[0].ref,
            node=group[0].node or "",
            groups=_groups(group[0].groups),
            shares=tuple(r.share if r.share is not None else 1.0 for r in group),
        )
        for (user, server), group in grouped.items()
    ]
