"""Drained for maintenance (``service/drain_stops.py``): the words, who is warned, and the countdown kept in
the pending ``drain`` notices, so a restarted service stops at the time the users were told.

Table tests on a real allocation store (SQLite), a stand-in hub and a Stopper without user servers (no save
round); the real hub is in ``test_drain_stops_hub.py``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from tests.service.test_stopping import FakeHub
from workbench_devices import GPUDevice
from workbench_hub.service.drain_handlers import drain_json, stop_times
from workbench_hub.service.drain_stops import (
    KIND,
    DrainStops,
    clear_moot,
    drain_cause,
    drain_notice,
    drain_reason,
    drain_warning,
    drained_holdings,
    warn_holders,
)
from workbench_hub.service.hub_client import HubUnavailableError
from workbench_hub.service.stopping import UNREACHABLE, Stopper
from workbench_spawner.ledger.drain_book import DrainBook
from workbench_spawner.ledger.notices import NoticeBook
from workbench_spawner.ledger.reasons import reason_kind
from workbench_spawner.ledger.store import AllocationStore

GIB = 1024**3
WHOLE = [GPUDevice(f"GPU-{i}", i, "H100", 80 * GIB, model="H100-80GB") for i in range(2)]
SLICES = [
    GPUDevice(f"MIG-{i}", 2, "H200 1g.18gb", 18 * GIB, model="H200-141GB", mig=True, parent_uuid="GPU-2")
    for i in range(3)
]
DEVICES = WHOLE + SLICES
NOW = datetime(2026, 3, 2, 13, 45, tzinfo=UTC)


@pytest.fixture
def store(tmp_path):
    store = AllocationStore(f"sqlite:///{tmp_path / 'wb.sqlite'}")
    yield store
    store.dispose()


def hold(store, user: str, *uuids: str, server: str = "") -> None:
    assert store.allocate(user, server, len(uuids), list(uuids), slots_per_gpu=4) is not None  # time-sliced


@pytest.mark.parametrize(
    ("reason", "held", "drained", "warning", "cause"),
    [
        (
            "new MIG layout",
            1,
            1,
            "Your server will be stopped at 14:00: its GPU is being drained for maintenance (new MIG layout).",
            "its GPU was drained for maintenance (new MIG layout)",
        ),
        (
            "",
            1,
            1,
            "Your server will be stopped at 14:00: its GPU is being drained for maintenance.",
            "its GPU was drained for maintenance",
        ),
        (
            "driver update",
            2,
            2,
            "Your server will be stopped at 14:00: its GPUs are being drained for maintenance (driver update).",
            "its GPUs were drained for maintenance (driver update)",
        ),
        (
            " x ",
            3,
            1,
            "Your server will be stopped at 14:00: one of its GPUs is being drained for maintenance (x).",
            "one of its GPUs was drained for maintenance (x)",
        ),
        (
            "x",
            4,
            2,
            "Your server will be stopped at 14:00: 2 of its GPUs are being drained for maintenance (x).",
            "2 of its GPUs were drained for maintenance (x)",
        ),
    ],
)
def test_the_words_of_the_warning_and_the_stop_box(reason, held, drained, warning, cause):
    assert drain_warning("14:00", reason, held, drained) == warning
    assert drain_cause(reason, held, drained) == cause


@pytest.mark.parametrize(
    ("reason", "ledger"),
    [
        ("new MIG layout", "drained: new MIG layout"),
        ("", "drained: maintenance"),
        ("  two\nlines  ", "drained: two lines"),
        ("a" * 200, "drained: " + "a" * 55),
    ],
)
def test_the_ledger_reason_is_drained_colon_reason_in_64_characters(reason, ledger):
    assert drain_reason(reason) == ledger
    assert len(ledger) <= 64
    assert reason_kind(ledger) == "drained"


def test_a_long_reason_moves_from_the_warning_to_its_hint():
    short, hint = drain_notice("14:00", "new MIG layout")
    assert short.endswith("(new MIG layout).")
    assert hint.startswith("Save your work now.")
    reason = "a long explanation of the maintenance window, " * 3
    message, hint = drain_notice("14:00", reason)
    assert message == "Your server will be stopped at 14:00: its GPU is being drained for maintenance."
    assert hint.startswith(f"The reason: {reason.strip()}. Save your work now.")


def test_who_holds_a_drained_device_whole_gpu_slice_of_a_drained_gpu_or_partly(store):
    hold(store, "alice", "GPU-0")
    hold(store, "bob", "GPU-1")
    hold(store, "carol", "MIG-1")
    hold(store, "dave", "GPU-0", "GPU-1", server="big")
    DrainBook(store).drain(["GPU-0"], "new MIG layout")
    DrainBook(store).drain(["GPU-2"], "")  # a MIG GPU: all its slices
    found = drained_holdings(store, DEVICES)
    assert sorted(found) == [("alice", ""), ("carol", ""), ("dave", "big")]
    assert found[("dave", "big")].held == 2
    assert found[("dave", "big")].drained == ("GPU-0",)
    assert found[("alice", "")].reason == "new MIG layout"
    assert found[("carol", "")].reason == ""


def test_a_drain_with_a_countdown_warns_only_the_servers_on_it(store):
    hold(store, "alice", "GPU-0")
    hold(store, "bob", "GPU-1")
    hold(store, "carol", "MIG-2")
    DrainBook(store).drain(["GPU-0", "GPU-1", "GPU-2"], "new MIG layout")
    warned = warn_holders(store, DEVICES, ["GPU-2", "MIG-0", "MIG-1", "MIG-2"], 15, UTC, now=NOW)
    assert [(n.user, n.kind, n.stop_at) for n in warned] == [("carol", KIND, NOW + timedelta(minutes=15))]
    assert warned[0].message == (
        "Your server will be stopped at 14:00: its GPU is being drained for maintenance (new MIG layout)."
    )
    assert "Save your work now" in warned[0].hint
    # Draining again with a new countdown sets the new time.
    [again] = warn_holders(store, DEVICES, ["GPU-2", "MIG-2"], 30, UTC, now=NOW)
    assert again.id == warned[0].id
    assert again.stop_at == NOW + timedelta(minutes=30)
    # The drain's holders carry their stop time (api/drains); bob and alice were not asked.
    [gpu2] = [d for d in DrainBook(store).rows() if d.gpu_uuid == "GPU-2"]
    view = drain_json(gpu2, DEVICES, store.holders(), stop_times(store))
    assert view["holders"] == [
        {"uuid": "MIG-2", "user": "carol", "server": "", "stop_at": (NOW + timedelta(minutes=30)).isoformat()}
    ]
    [gpu0] = [d for d in DrainBook(store).rows() if d.gpu_uuid == "GPU-0"]
    assert drain_json(gpu0, DEVICES, store.holders(), stop_times(store))["holders"][0]["stop_at"] is None


def test_undraining_withdraws_the_warnings_of_servers_left_on_no_drained_device(store):
    hold(store, "alice", "GPU-0")
    hold(store, "bob", "GPU-0", "GPU-1")
    DrainBook(store).drain(["GPU-0", "GPU-1"], "x")
    warn_holders(store, DEVICES, ["GPU-0", "GPU-1"], 10, UTC, now=NOW)
    DrainBook(store).undrain(["GPU-0"])
    assert clear_moot(store, DEVICES) == [("alice", "")]
    assert [n.user for n in NoticeBook(store).pending()] == ["bob"], "bob's GPU-1 is still drained"


class Clock:
    def __init__(self, now: datetime):
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def service(store, clock, hub) -> DrainStops:
    """One run of the service: a new DrainStops (as after a restart) over the same database."""
    fleet = SimpleNamespace(
        store=store, inventory=SimpleNamespace(devices=DEVICES), settings=SimpleNamespace(time_zone="Europe/Berlin")
    )
    stopper = Stopper(NoticeBook(store, clock=clock), hub, None, save_wait=0, zone=lambda: UTC, clock=clock)
    return DrainStops(fleet, hub, stopper, clock=clock)


async def test_the_countdown_survives_a_restart_and_ends_in_a_stop_with_the_sentence(store):
    hold(store, "alice", "GPU-0")
    hold(store, "bob", "GPU-1")
    DrainBook(store).drain(["GPU-0"], "new MIG layout")
    [told] = warn_holders(store, DEVICES, ["GPU-0"], 15, UTC, now=NOW)
    clock, hub = Clock(NOW + timedelta(minutes=5)), FakeHub()
    first = await service(store, clock, hub).check()
    assert first.stopped == []
    assert hub.stopped == []
    # The hub's zone is Berlin: the warning's words follow it; the countdown stays where it was.
    [notice] = NoticeBook(store).pending()
    assert notice.stop_at == told.stop_at
    assert "stopped at 15:00:" in notice.message
    assert first.rewarned
    # The service restarts (a new DrainStops, nothing in memory) after the stop time: it stops alice only.
    clock.now = NOW + timedelta(minutes=16)
    second = await service(store, clock, hub).check()
    assert second.stopped == [("alice", "")]
    assert hub.stopped == [("alice", "")]
    done = NoticeBook(store).last_done("alice", "")
    assert done.kind == KIND
    assert done.reason == "drained: new MIG layout"
    assert done.message == (
        "Your server was stopped at 14:01: its GPU was drained for maintenance (new MIG layout). "
        f"{UNREACHABLE} Your files are kept."
    )
    assert NoticeBook(store).pending() == []
    assert NoticeBook(store).last_done("bob") is None


async def test_a_pass_withdraws_warnings_whose_server_stopped_or_whose_gpu_was_undrained(store):
    hold(store, "alice", "GPU-0")
    hold(store, "bob", "GPU-1")
    DrainBook(store).drain(["GPU-0", "GPU-1"], "x")
    warn_holders(store, DEVICES, ["GPU-0", "GPU-1"], 10, UTC, now=NOW)
    store.release("alice", "", "stopped by the user")
    DrainBook(store).undrain(["GPU-1"])
    hub = FakeHub()
    report = await service(store, Clock(NOW + timedelta(minutes=11)), hub).check()
    assert sorted(report.cleared) == [("alice", ""), ("bob", "")]
    assert report.stopped == []
    assert hub.stopped == []
    assert NoticeBook(store).pending() == []


async def test_a_drain_without_a_countdown_stops_nobody(store):
    hold(store, "alice", "GPU-0")
    DrainBook(store).drain(["GPU-0"], "x")
    hub = FakeHub()
    report = await service(store, Clock(NOW + timedelta(days=3)), hub).check()
    assert report.stopped == []
    assert hub.stopped == []
    assert NoticeBook(store).pending() == []


async def test_a_stop_the_hub_refused_is_asked_again_only_after_a_while(store):
    hold(store, "alice", "GPU-0")
    DrainBook(store).drain(["GPU-0"], "x")
    warn_holders(store, DEVICES, ["GPU-0"], 1, UTC, now=NOW)

    class Refusing(FakeHub):
        async def stop_server(self, user, server):
            self.stopped.append((user, server))
            raise HubUnavailableError("the hub's API answered DELETE with 503")

    hub = Refusing()
    clock = Clock(NOW + timedelta(minutes=2))
    loop = service(store, clock, hub)
    assert (await loop.check()).stopped == []
    assert hub.stopped == [("alice", "")]
    # The warning is back with its time; the next pass does not ask again at once, one a while later does.
    [back] = NoticeBook(store).pending()
    assert back.stop_at == NOW + timedelta(minutes=1)
    assert (await loop.check()).stopped == []
    assert len(hub.stopped) == 1
    loop._asked.clear()  # as RESTOP_SECONDS later
    await loop.check()
    assert len(hub.stopped) == 2
