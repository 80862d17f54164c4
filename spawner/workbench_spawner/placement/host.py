"""Placement: which GPUs on which node an admitted request gets.

Two kinds of backend place differently. On one host we place: a transaction
in the GPU database picks free GPUs, and a first-come, first-served wait list
holds the rest (``HostAllocator``, for the local and docker backends), in
the order ``queue_order`` says (first come, first served, or fair share),
and reservations are enforced inside the allocating transaction: a
non-member gets only GPUs that leave what a reservation keeps, and so is the
user's quota (``ledger.lease_limits``: a spawn over it ends at once). On an
engine such as Slurm the engine places, and the backend learns the node and
GPUs back; its queue is the wait. Both end in the same place: a ``Lease`` in
the ledger (``AllocationStore``), which the fleet view, metrics, GPU-hours
and reconcile read. ``Placement`` is that small common interface.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, tzinfo
from typing import TYPE_CHECKING

from workbench_devices import DeviceInventory
from workbench_spawner.form.options import device_matches
from workbench_spawner.ledger import lease_limits
from workbench_spawner.ledger.drain_book import DrainBook, is_drained
from workbench_spawner.ledger.gpu_hours import gpu_hours_used
from workbench_spawner.ledger.lease_limits import LeaseLimits
from workbench_spawner.ledger.reasons import START_CANCELLED
from workbench_spawner.ledger.reservation_book import ReservationBook
from workbench_spawner.ledger.store import AllocationStore, Lease
from workbench_spawner.placement.waitlist import Ticket, WaitList, WaitTimeoutError
from workbench_spawner.policy.clock import Clock, real_now
from workbench_spawner.rules.admission import NoGPUAvailableError as NoGPUAvailableError
from workbench_spawner.rules.queue_order import REJOIN_MINUTES
from workbench_spawner.rules.reservations import (
    Holding,
    Reservation,
    demand_by_group,
    gpus_text,
    is_member,
    remaining_needs,
    reserved_now,
    takeable,
)

if TYPE_CHECKING:
    from workbench_spawner.placement.engine import EngineJob

log = logging.getLogger("workbench.placement")

# report(ahead, why): how many are ahead, and in fair-share mode why ("" otherwise).
Report = Callable[..., None]


def _nothing(ahead: int, why: str = "") -> None:
    return None


def holdings(leases: Sequence[Lease]) -> list[Holding]:
    return [Holding(l.user, l.server, l.gpu_uuids, frozenset(l.groups), l.since) for l in leases]  # noqa: E741


class Placement(ABC):
    """Turns an admitted request into a lease in the ledger, waiting if it must."""

    # Whether this placement hands out MIG slices (a request's kind may name a profile).
    pins_slices = True

    def __init__(self, store: AllocationStore):
        self.store = store

    @abstractmethod
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
        """A lease of ``count`` GPUs (of ``model``), or NoGPUAvailableError after ``timeout`` s.

        ``groups``: the user's JupyterHub groups (reservations let members in).
        ``job``: on an engine, the submitted job to follow (host placement has none).
        ``limits``: the user's quota, checked where the lease is written (``QuotaExceededError``, a 403)."""

    def release(
        self, user: str, server: str, reason: str, since: datetime | None = None, message: str = ""
    ) -> tuple[str, ...]:
        """End the lease (the ledger keeps it); blocking, so call it from a worker thread.

        ``since``: only the lease that began then (``AllocationStore.release``); ``message``: the sentence
        its student was told."""
        released = self.store.release(user, server, reason, since=since, message=message)
        if released:
            log.info("Released GPU(s) %s of %s/%s (%s)", ", ".join(released), user, server or "default", reason)
            self.released()
        return released

    def released(self) -> None:  # noqa: B027
        """Hook: GPUs came free (wake whoever waits). Called from any thread."""

    def waiting(self) -> int:
        """Requests waiting for GPUs now."""
        return 0

    def waiting_by_group(self) -> dict[str, int]:
        """GPUs that members of each group wait for now (reservations count them as members' demand)."""
        return {}


class HostAllocator(Placement):
    """Our own placement on one host: a database transaction plus an ordered wait list.

    ``clock`` is the hub's clock for reservations (a test clock may jump);
    ``queue_clock`` the wait list's (monotonic seconds: waits, the aging
    bound, the queue timeout). A simulation passes simulated ones for both.
    """

    def __init__(
        self,
        store: AllocationStore,
        inventory: DeviceInventory,
        node: str,
        slots_per_gpu: int | Mapping[str, int] = 1,
        recheck_interval: float = 2.0,
        queue_order: str = "fifo",
        aging_minutes: float = 30.0,
        tz: tzinfo | None = None,
        clock: Clock = real_now,
        queue_clock: Callable[[], float] = time.monotonic,
        rejoin_minutes: float = REJOIN_MINUTES,
    ):
        super().__init__(store)
        self.node = node
        self.adopt_inventory(inventory, slots_per_gpu)
        # Re-reads the inventory if it is time (``inventory_refresh``, set by the policy's owner); every try
        # of a waiting request calls it, so the line sees a GPU's new MIG layout without another spawn.
        self.refresh_inventory: Callable[[], object] = lambda: None
        self.queue_order = queue_order
        self.waitlist: WaitList[Lease] = WaitList(
            recheck_interval, queue_order, aging_minutes, clock=queue_clock, rejoin_minutes=rejoin_minutes
        )
        self.reservations = ReservationBook(store)
        self.tz = tz
        self.clock = clock
        # key -> (groups, count) of every request waiting now (members waiting count as "asked").
        self._asking: dict[str, tuple[frozenset[str], int]] = {}
        # key -> (model, groups) of every request waiting now: its class is computed from them.
        self._requests: dict[str, tuple[str | None, frozenset[str]]] = {}
        # The ids of the reservations open at the last look (a try or a join reads them anyway).
        self._open_ids: frozenset[int] | None = None
        self._reads = itertools.count()  # numbers each reservation read as it begins (_saw_open)
        self._newest_read = -1
        # Releases of what cancelled waits took (``_give_back``), kept until done.
        self._giving_back: set[asyncio.Future] = set()

    def adopt_inventory(
        self,
        inventory: DeviceInventory,
        slots_per_gpu: int | Mapping[str, int],
        held_back: Collection[str] = frozenset(),
    ) -> None:
        """Place on these devices from now on (at start, and when a re-read finds a new MIG layout: the
        next try of a request waiting in line already sees it, ``inventory_refresh``). ``held_back``: devices
        in force only for the servers on them, given to nobody new: a GPU whose layout change waits for
        them (``GPUPolicy.adopt_inventory``)."""
        self.held_back = frozenset(held_back)
        self.inventory = inventory
        # Servers per device: one number for all, or by UUID (settings.slots(): time-sliced GPUs).
        self.slots_per_gpu = slots_per_gpu if isinstance(slots_per_gpu, Mapping) else max(1, slots_per_gpu)
        # A slice is known by its kind ("H200-141GB 1g.18gb"), never its GPU's model: a reservation of
        # H200-141GB GPUs holds whole GPUs, not slices.
        self.models = {d.uuid: d.kind for d in inventory.devices}
        # Each device's share of a GPU (a 1g MIG slice 1/7): what its lease records for GPU-hours.
        self.shares = {d.uuid: d.share for d in inventory.devices}

    def candidates(self, kind: str | None, exclusive: bool = False) -> list[str]:
        """The devices a request of ``kind`` may get now: whole GPUs (of a model), or slices of a profile,
        less the drained ones (``drain_book``: an admin changes a MIG layout while nothing new starts) and
        those of a GPU whose layout change waits (``held_back``); ``exclusive``: only devices one server
        holds alone (a quota that forbids time-sliced GPUs).

        Reads the drains (blocking: call from a thread). ``place`` asks on every try, so a request
        waiting in line is never given a GPU that was drained after it joined."""
        drained = DrainBook(self.store).drained()
        return [
            d.uuid
            for d in self.inventory.devices
            if device_matches(d, kind)
            and not is_drained(d, drained)
            and d.uuid not in self.held_back
            and not (exclusive and self.slots_of(d.uuid) > 1)
        ]

    def waiting_by_group(self) -> dict[str, int]:
        return demand_by_group(self._asking.values())

    def active_reservations(self) -> list[Reservation]:
        """Reservations whose window is open now (reads the database: call from a thread)."""
        return self.reservations.open_at(self.clock(), self.tz or UTC)

    @staticmethod
    def wait_class(model: str | None, groups: Collection[str], active: Sequence[Reservation]) -> Hashable:
        """A waiting request's class (waitlist.py): its model and the open reservations it may use."""
        return (model, frozenset(r.id for r in active if is_member(r, groups)))

    def _saw_open(self, active: Sequence[Reservation], read: int) -> None:
        """Called on the loop's thread with the reservations a try or a join just read: when the set of
        open windows changed, every waiting request gets its class again (a member who joined before the
        window opened is no longer stuck behind non-members). ``read`` numbers the reads in the order
        they began: reads run in worker threads, and an older one that lands last is ignored."""
        if read < self._newest_read:
            return
        self._newest_read = read
        ids = frozenset(r.id for r in active)
        if ids == self._open_ids:
            return
        self._open_ids = ids

        def classify(ticket: Ticket) -> Hashable:
            model, groups = self._requests.get(ticket.key, (None, frozenset()))
            return self.wait_class(model, groups, active) if ticket.key in self._requests else ticket.cls

        changed = self.waitlist.reclassify(classify)
        if changed:
            log.info(
                "Reservations open now: %s; %d waiting request(s) changed class",
                ", ".join(f"{r.group} (#{r.id})" for r in active) or "none",
                changed,
            )

    def choose(self, groups: Sequence[str], count: int, active: Sequence[Reservation]):
        """The in-transaction filter: the free GPUs this user may take under ``active`` reservations."""

        def pick(free: list[str], leases: list[Lease]) -> list[str]:
            # The devices in force now, read inside the allocating transaction: a layout adopted after the
            # candidates were listed (``GPUPolicy.adopt_inventory`` switches inside a write transaction of
            # its own, which this one waits for) never has a gone or held-back device handed out.
            free = [uuid for uuid in free if uuid in self.models and uuid not in self.held_back]
            if not active:
                return free
            needs = remaining_needs(
                active,
                holdings(leases),
                self.models,
                self.clock(),
                self.tz or UTC,
                self.waiting_by_group(),
                exclude_groups=groups,
            )
            return takeable(free, self.models, count, needs)

        return pick

    def reserved_lines(self, groups: Sequence[str], only_others: bool = False) -> list[str]:
        """What the open reservations hold for their members now, one sentence each (reads the DB).

        After a grace period that is what members hold or wait for, not the
        whole reservation (``reservations.reserved_now``)."""
        active = [r for r in self.active_reservations() if not (only_others and is_member(r, groups))]
        if not active:
            return []  # the usual case: no lease read
        return reserved_now(
            active,
            self.clock(),
            self.tz or UTC,
            self.inventory.count_by_model(),
            groups,
            holdings=holdings(self.store.leases()),
            models=self.models,
            waiting=self.waiting_by_group(),
        )

    def reserved_note(self, groups: Sequence[str]) -> str:
        """ "; 3 of 4 GPUs reserved for ml-course until 12:00" for reservations the user is not in (reads the DB)."""
        return "".join(f"; {line}" for line in self.reserved_lines(groups, only_others=True))

    def free_count(self, model: str | None = None) -> int:
        """GPUs a new server could get right now (reads the database: call from a thread)."""
        holders = self.store.holders()
        return sum(1 for uuid in self.candidates(model) if len(holders.get(uuid, [])) < self.slots_of(uuid))

    def slots_of(self, uuid: str) -> int:
        """How many servers may hold this device at once."""
        slots = self.slots_per_gpu
        return max(1, slots.get(uuid, 1)) if isinstance(slots, Mapping) else slots

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
        exclusive: bool = False,
    ) -> Lease:
        """As ``Placement.place``. A quota refusal (``QuotaExceededError``) ends the spawn at once with its
        403 sentence instead of a wait: what holds the quota is the user's own other server, so a wait would
        keep a place in line for the whole queue timeout for a GPU it may not take, and only the student
        can decide which server to stop. The quota is looked at when the spawn joins the line (a request
        behind others may not try for a long while), again when this allocator gives one of the user's
        other spawns a GPU while it waits (``WaitList.ask_recheck``), and, the check that counts, in the
        transaction of every try (``AllocationStore.allocate``). The wait list lets the exception through
        and the ticket leaves the line (``WaitList.wait_for``)."""
        if job is not None:
            raise ValueError("the host allocator places GPUs itself: it follows no engine job")
        groups = tuple(groups)
        key = f"{user}/{server}"
        if limits is not None:  # the sentence counts what was asked for and names what the others hold
            limits = replace(limits, kind=model, kinds=self.models)

        def take() -> tuple[Lease | None, list[Reservation]]:
            self.refresh_inventory()
            active = self.active_reservations()
            return self.store.allocate(
                user,
                server,
                count,
                self.candidates(model, exclusive),  # every try: a GPU drained meanwhile is left out
                self.slots_per_gpu,
                node=self.node,
                groups=groups,
                choose=self.choose(groups, count, active),
                shares=self.shares,
                limits=limits,
            ), active

        def within_limits() -> None:
            # An early look from a read (the leases the user holds now); the write transaction's check decides.
            if limits is not None:
                mine = self.store.leases_of(user)
                lease_limits.check(limits, user, server, count, mine, lambda: gpu_hours_used(self.store, user))

        def join() -> tuple[float, list[Reservation]]:
            within_limits()
            hours = gpu_hours_used(self.store, user) if self.queue_order == "fair-share" else 0.0
            return hours, self.active_reservations()

        async def try_take() -> Lease | None:
            read = next(self._reads)
            taking = asyncio.ensure_future(asyncio.to_thread(take))
            try:
                # Shielded: a cancel must not leave the transaction's outcome unread.
                lease, active = await asyncio.shield(taking)
            except asyncio.CancelledError:
                taking.add_done_callback(lambda done: self._give_back(done, user, server))
                raise
            self._saw_open(active, read)
            if lease is not None and limits is not None:  # the user's other spawns in line may be over quota now
                self.waitlist.ask_recheck(lambda ticket: ticket.user == user and ticket.key != key)
            return lease

        read = next(self._reads)
        hours, active = await asyncio.to_thread(join)
        self._saw_open(active, read)
        # The class: the model and the open reservations this user may use (waitlist.py).
        cls = self.wait_class(model, groups, active)
        self._asking[key] = (frozenset(groups), count)
        self._requests[key] = (model, frozenset(groups))
        try:
            return await self.waitlist.wait_for(
                key,
                count,
                try_take,
                timeout,
                report,
                user=user,
                gpu_hours=hours,
                cls=cls,
                recheck=lambda: asyncio.to_thread(within_limits),
            )
        except WaitTimeoutError:
            free, note = await asyncio.to_thread(lambda: (self.free_count(model), self.reserved_note(groups)))
            raise NoGPUAvailableError(
                f"No {gpus_text(count, model)} became free within {timeout:g} seconds "
                f"({free} free now, {len(self.waitlist.waiting())} still waiting{note}). "
                "Try again later, ask for fewer GPUs, or start a CPU-only server (0 GPUs)."
            ) from None
        finally:
            self._asking.pop(key, None)
            self._requests.pop(key, None)

    def _give_back(self, taking: asyncio.Future, user: str, server: str) -> None:
        """A wait was cancelled while its allocating transaction ran in a worker thread: whatever that
        transaction took goes back (only that lease: the server may have been started again since)."""
        if taking.cancelled() or taking.exception() is not None:
            return
        lease = taking.result()[0]
        if lease is None:
            return
        log.info("A cancelled wait of %s/%s took %s: giving it back", user, server or "default", lease.gpu_uuids)
        release = asyncio.get_running_loop().run_in_executor(
            None, lambda: self.release(user, server, START_CANCELLED, since=lease.since)
        )
        self._giving_back.add(release)
        release.add_done_callback(self._giving_back.discard)

    def released(self) -> None:
        self.waitlist.notify()

    def waiting(self) -> int:
        return len(self.waitlist.waiting())
