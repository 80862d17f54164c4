"""Reservations where an engine places (Slurm, Kubernetes): checked before anything is submitted.

On one host the allocator enforces reservations inside its transaction. Where
an engine places, the workbench still decides one thing: when to submit. A
user who is not in a group with an open reservation may submit only while the
engine's free GPUs cover what the reservations still keep for their members
after this request (``gpus_user_may_take``, the host allocator's rule: grace
period, members' demand). Until then the spawn waits in the hub
(``EngineTemplate.admit_to_queue``), says why, and counts against the queue
timeout; nothing waits in the engine meanwhile, so the engine cannot hand a
member's GPU to it. Members submit at once. Each backend says what "free"
means in its engine (``free_gpus``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, tzinfo

from workbench_devices import DeviceInventory
from workbench_spawner.ledger.reservation_book import ReservationBook
from workbench_spawner.ledger.store import AllocationStore
from workbench_spawner.placement.host import holdings
from workbench_spawner.policy.clock import Clock, real_now
from workbench_spawner.rules.reservations import (
    Holding,
    Reservation,
    demand_by_group,
    gpus_user_may_take,
    is_member,
    reserved_now,
)


class EngineReservations:
    """The reservation check before submitting, and the demand members have in the engine's queue now."""

    def __init__(
        self,
        store: AllocationStore,
        inventory: Callable[[], DeviceInventory],
        tz: tzinfo | None = None,
        clock: Clock = real_now,
    ):
        self.store = store
        self.inventory = inventory
        self.tz = tz or UTC
        self.clock = clock
        self.book = ReservationBook(store)
        # request key -> (groups, GPUs, model) of every workbench request admitted to the engine's queue and
        # not running yet: about to take free GPUs, and members among them count as asking.
        self.asking: dict[str, tuple[frozenset[str], int, str | None]] = {}

    def active(self, now: datetime) -> list[Reservation]:
        return self.book.open_at(now, self.tz)

    def waiting_by_group(self) -> dict[str, int]:
        return demand_by_group((groups, count) for groups, count, _model in list(self.asking.values()))

    def may_submit(
        self,
        groups: Sequence[str],
        count: int,
        model: str | None,
        free_gpus: Callable[[DeviceInventory], list[str]],
    ) -> tuple[bool, str]:
        """(True, "") when this request leaves what open reservations keep; else (False, why). Blocking.

        ``free_gpus(inventory)``: the inventory's GPUs the engine has not allocated now (any model)."""
        now = self.clock()
        others = [r for r in self.active(now) if not is_member(r, groups)]
        if not count or not others:
            return True, ""
        inventory = self.inventory()
        models = {d.uuid: d.model for d in inventory.devices}
        free = free_gpus(inventory)
        # Requests already admitted to the engine's queue will take free GPUs before this one: they count as
        # held (members' among them as members' use), and the free ones they will take are not free.
        held = holdings(self.store.leases())
        for n, (their_groups, their_count, their_model) in enumerate(list(self.asking.values())):
            placeholders = tuple(f"admitted-{n}-{i}" for i in range(their_count))
            models.update({u: their_model or "" for u in placeholders})
            held.append(Holding(f"admitted-{n}", "", placeholders, frozenset(their_groups), now))
            for _ in range(their_count):
                fits = [u for u in free if their_model is None or models.get(u) == their_model]
                if fits:
                    free.remove(fits[-1])
        free = [u for u in free if model is None or models.get(u) == model]
        allowed = gpus_user_may_take(free, models, count, groups, others, held, now, self.tz, {})
        if len(allowed) >= count:
            return True, ""
        kept = "; ".join(reserved_now(others, now, self.tz, inventory.count_by_model()))
        return False, f"{len(free)} free in the cluster, but {kept}"
