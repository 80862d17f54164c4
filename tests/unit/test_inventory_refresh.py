"""A GPU's MIG layout changes while the hub runs: the inventory is read again and used, without a restart."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

import pytest
from jupyterhub.spawner import SpawnException

from tests.unit.test_quota_spawn import make_spawner as make_spawner  # the fixture, for pytest to find
from workbench_devices import DeviceInventory, parse_simulated_spec
from workbench_spawner.ledger.store import AllocationStore
from workbench_spawner.policy.gpu_policy import LAYOUT_CHANGED
from workbench_spawner.policy.inventory_refresh import (
    InventoryRefresh,
    LayoutWait,
    changes,
    load_layout_waiting,
    merge_layouts,
    spec_in_force,
)
from workbench_spawner.policy.settings import PolicySettings, load_policy_settings, store_policy_settings

SEVEN = "1xH200-141GB:mig=7x1g.18gb"
TWO = "1xH200-141GB:mig=2x3g.71gb"


def inventory(spec: str, source: str = "simulated") -> DeviceInventory:
    return DeviceInventory(source, parse_simulated_spec(spec) if spec else [], spec or "none")


# -- when it reads and what it adopts ---------------------------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def refresher(answers: list, every: float = 60.0):
    clock, adopted = Clock(), []
    state = {"current": inventory(SEVEN)}

    def discover() -> DeviceInventory:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def adopt(new: DeviceInventory) -> None:
        adopted.append(new)
        state["current"] = new

    return InventoryRefresh(lambda: state["current"], discover, adopt, every, clock), clock, adopted


def test_it_reads_at_most_every_interval_and_adopts_only_a_change():
    refresh, clock, adopted = refresher([inventory(SEVEN), inventory(TWO)])
    assert refresh() is False, "just read at start: not again before the interval"
    assert adopted == [], "just read at start: not again before the interval"
    clock.now += 60
    assert refresh() is False, "the same devices: nothing to adopt"
    assert adopted == [], "the same devices: nothing to adopt"
    clock.now += 30
    assert refresh() is False, "30 s after the last read"
    clock.now += 30
    assert refresh() is True
    assert [d.profile for d in adopted[0].devices] == ["3g.71gb", "3g.71gb"]


def test_zero_turns_it_off():
    refresh, clock, adopted = refresher([inventory(TWO)], every=0)
    clock.now += 10_000
    assert refresh() is False
    assert adopted == []


@pytest.mark.parametrize(
    ("answer", "logged"),
    [
        (inventory("", "none"), "found none (none) where it had simulated; keeping the last one"),
        (ValueError("WORKBENCH_SIMULATED_GPUS=@/x: cannot read /x"), "failed, keeping the last one: "),
        (
            # NVML showed the GPU but not its slices this time: not a layout change that closes leases.
            replace(inventory(""), unread=("GPU 0 (NVIDIA H200) is in MIG mode but its MIG slices could not be read",)),
            "could not read every GPU (GPU 0 (NVIDIA H200) is in MIG mode but its MIG slices could not be read); "
            "keeping the last one",
        ),
    ],
)
def test_a_read_that_fails_or_finds_another_source_is_kept_out_and_logged_once(answer, logged, caplog):
    refresh, clock, adopted = refresher([answer, answer, inventory(TWO)])
    with caplog.at_level(logging.WARNING, logger="workbench.policy"):
        for _ in range(2):
            clock.now += 60
            assert refresh() is False
    assert adopted == []
    assert [r.getMessage() for r in caplog.records if logged in r.getMessage()] != []
    assert len(caplog.records) == 1, "the same refusal is logged once, not every minute"
    clock.now += 60
    assert refresh() is True, "the source answers again: its change is adopted"


def test_changes_names_what_went_and_what_came():
    gone, added = changes(inventory(SEVEN), inventory("1xH200-141GB:mig=5x1g.18gb+1x2g.35gb"))
    assert gone == ["MIG-sim-00-h200-141gb-5-1g.18gb", "MIG-sim-00-h200-141gb-6-1g.18gb"]
    assert added == ["MIG-sim-00-h200-141gb-5-2g.35gb"]


def test_a_server_is_told_the_spec_in_force_not_the_hubs_file(tmp_path):
    layout = tmp_path / "layout"
    layout.write_text(f"{TWO}\n")
    assert spec_in_force(f"@{layout}") == TWO
    assert spec_in_force("2xH100-80GB") == "2xH100-80GB"
    assert spec_in_force(f"@{tmp_path / 'gone'}") == f"@{tmp_path / 'gone'}"


# -- through the spawner: placement, the stored settings, the ledger ------------------------------------------


def leased(spawner) -> tuple[str, ...]:
    return spawner.gpu_policy.store.lease_of(spawner.user.name, spawner.name).gpu_uuids


async def test_a_new_layout_waits_for_a_server_on_a_gone_slice_then_is_placed_on_and_stored(
    make_spawner,
    tmp_path,
):
    layout = tmp_path / "layout"
    layout.write_text(SEVEN)
    traits = {"simulated_gpus": f"@{layout}", "inventory_refresh_seconds": 0.05}
    alice = make_spawner(**traits)
    store = AllocationStore(alice.gpu_db_url)
    # The hub publishes its settings at start; the service reads them from the database.
    store_policy_settings(store, PolicySettings(store.url, inventory(SEVEN), node="n"))
    await alice._apply_gpu_options({"gpus": 1, "gpu_profile": "1g.18gb"})
    await alice._acquire(alice.gpu_request)
    assert leased(alice) == ("MIG-sim-00-h200-141gb-0-1g.18gb",)
    policy = alice.gpu_policy

    layout.write_text(TWO)  # the admin cut the GPU again under a running server
    time.sleep(0.1)
    bob = make_spawner("bob", **traits)
    assert bob.gpu_policy is policy, "one policy for the hub, whatever layout a later spawner finds"
    # alice's slice would be gone: the GPU keeps its old layout, closed to new servers, and alice her lease.
    assert [d.uuid for d in policy.devices] == [d.uuid for d in inventory(SEVEN).devices]
    assert leased(alice) == ("MIG-sim-00-h200-141gb-0-1g.18gb",)
    assert store.usage() == []
    assert [w.message for w in policy.layout_waiting] == [
        "layout change waiting: 1 server still on slices the new layout removes"
    ]
    assert load_layout_waiting(store)[0]["servers"] == ["alice"]
    assert policy.free_count("1g.18gb") == 0, "the six free slices are closed to new servers"
    await bob._apply_gpu_options({"gpus": 1, "gpu_profile": "1g.18gb"})
    bob.gpu_queue_timeout = 0.3
    with pytest.raises(SpawnException, match=r"No 1 H200-141GB 1g\.18gb|No GPU|became free"):
        await bob._acquire(bob.gpu_request)

    # alice stops: the release adopts the waiting layout at once, and the service's settings follow.
    await asyncio.to_thread(policy.release, "alice", "", "stopped")
    assert [d.uuid for d in policy.devices] == ["MIG-sim-00-h200-141gb-0-3g.71gb", "MIG-sim-00-h200-141gb-1-3g.71gb"]
    assert policy.layout_waiting == []
    assert load_layout_waiting(store) == []
    stored, _ = load_policy_settings(store)
    assert [d.profile for d in stored.inventory.devices] == ["3g.71gb", "3g.71gb"]
    assert [(row.user, row.reason) for row in store.usage()] == [("alice", "stopped")]

    with pytest.raises(SpawnException) as refused:
        await bob._apply_gpu_options({"gpus": 1, "gpu_profile": "1g.18gb"})
    assert refused.value.status_code == 400
    assert "1g.18gb" in str(refused.value)
    await bob._apply_gpu_options({"gpus": 1, "gpu_profile": "3g.71gb"})
    bob.gpu_queue_timeout = 10
    await bob._acquire(bob.gpu_request)
    assert leased(bob) == ("MIG-sim-00-h200-141gb-0-3g.71gb",)
    assert bob.get_env()["WORKBENCH_SIMULATED_GPUS"] == TWO
    store.dispose()


async def test_a_request_waiting_in_line_gets_a_slice_of_the_new_layout(make_spawner, tmp_path):
    layout = tmp_path / "layout"
    layout.write_text("1xH200-141GB:mig=1x1g.18gb")
    traits = {
        "simulated_gpus": f"@{layout}",
        "inventory_refresh_seconds": 0.05,
        "gpu_queue_recheck_interval": 0.05,
        "gpu_queue_timeout": 10,
    }
    alice, bob = make_spawner(**traits), make_spawner("bob", **traits)
    for spawner in (alice, bob):
        await spawner._apply_gpu_options({"gpus": 1, "gpu_profile": "1g.18gb"})
    await alice._acquire(alice.gpu_request)
    waiting = asyncio.create_task(bob._acquire(bob.gpu_request))
    await asyncio.sleep(0.3)
    assert not waiting.done(), "the only slice is alice's"
    layout.write_text("1xH200-141GB:mig=3x1g.18gb")  # one slice more; alice's is still there
    lease = await asyncio.wait_for(waiting, 5)
    assert lease.gpu_uuids == ("MIG-sim-00-h200-141gb-1-1g.18gb",)
    assert leased(alice) == ("MIG-sim-00-h200-141gb-0-1g.18gb",), "a slice that still exists keeps its lease"


# -- the per-GPU merge rule: a layout change never takes a device from a live server -------------------------

G0, G1 = "GPU-sim-00-h200-141gb", "GPU-sim-01-h200-141gb"


def s0(place: int, profile: str = "1g.18gb") -> str:
    return f"MIG-sim-00-h200-141gb-{place}-{profile}"


def s1(place: int, profile: str = "1g.18gb") -> str:
    return f"MIG-sim-01-h200-141gb-{place}-{profile}"


def static(*entries: tuple[str, int, str]) -> DeviceInventory:
    """A static list whose slices do not name their GPU (no ``parent_uuid``): GPUs are told apart by index."""
    from workbench_devices import GPUDevice

    return DeviceInventory(
        "static",
        [
            GPUDevice(uuid, index, "H200", 0, "H200-141GB", mig=bool(profile), profile=profile)
            for uuid, index, profile in entries
        ],
        "static",
    )


ONE_OF_TWO = "1xH200-141GB:mig=7x1g.18gb,1xH200-141GB"  # GPU 0 cut in seven, GPU 1 whole
TWO_OF_ONE = "1xH200-141GB,1xH200-141GB:mig=7x1g.18gb"  # the other way round


@pytest.mark.parametrize(
    ("old", "new", "held", "in_force", "waits"),
    [
        # Nothing held: the new layout at once.
        (SEVEN, TWO, {}, TWO, []),
        # Three held slices the new layout removes: the GPU keeps its seven, and says why.
        (
            SEVEN,
            TWO,
            {s0(0): [("ann", "")], s0(1): [("ben", "")], s0(2): [("cat", "lab")]},
            SEVEN,
            [
                (
                    G0,
                    "slices",
                    ("ann", "ben", "cat/lab"),
                    "2x3g.71gb",
                    "layout change waiting: 3 servers still on slices the new layout removes",
                )
            ],
        ),
        # A re-cut that keeps the held slice (same UUID) takes nothing from anyone: adopted.
        (
            SEVEN,
            "1xH200-141GB:mig=5x1g.18gb+1x2g.35gb",
            {s0(0): [("ann", "")]},
            "1xH200-141GB:mig=5x1g.18gb+1x2g.35gb",
            [],
        ),
        # ... one that removes it waits.
        (
            SEVEN,
            "1xH200-141GB:mig=5x1g.18gb+1x2g.35gb",
            {s0(6): [("ann", "")]},
            SEVEN,
            [
                (
                    G0,
                    "slices",
                    ("ann",),
                    "5x1g.18gb+1x2g.35gb",
                    "layout change waiting: 1 server still on slices the new layout removes",
                )
            ],
        ),
        # Slices in use, the new layout makes the GPU whole: never a whole GPU over live slices.
        (
            SEVEN,
            "1xH200-141GB",
            {s0(3): [("ann", "")]},
            SEVEN,
            [
                (
                    G0,
                    "slices",
                    ("ann",),
                    "whole",
                    "layout change waiting: 1 server still on slices the new layout removes",
                )
            ],
        ),
        # The whole GPU in use, the new layout cuts it: never slices over a live whole-GPU server.
        (
            "1xH200-141GB",
            SEVEN,
            {G0: [("ann", "")]},
            "1xH200-141GB",
            [
                (
                    G0,
                    "whole",
                    ("ann",),
                    "7x1g.18gb",
                    "layout change waiting: 1 server still on the whole GPU, which the new layout cuts into slices",
                )
            ],
        ),
        # A lease on the whole GPU left while its slices are in force (from before a restart) keeps the
        # slices of a new cut from being handed out too.
        (
            SEVEN,
            TWO,
            {G0: [("old", "")]},
            SEVEN,
            [
                (
                    G0,
                    "whole",
                    ("old",),
                    "2x3g.71gb",
                    "layout change waiting: 1 server still on the whole GPU, which the new layout cuts into slices",
                )
            ],
        ),
        # Per GPU: GPU 0's held slice holds GPU 0 back, GPU 1 (free) is cut at once.
        (
            "2xH200-141GB:mig=7x1g.18gb",
            "2xH200-141GB:mig=2x3g.71gb",
            {s0(0): [("ann", "")]},
            "1xH200-141GB:mig=7x1g.18gb,1xH200-141GB:mig=2x3g.71gb",
            [
                (
                    G0,
                    "slices",
                    ("ann",),
                    "2x3g.71gb",
                    "layout change waiting: 1 server still on slices the new layout removes",
                )
            ],
        ),
        # Both ways at once, both held: GPU 0 (slices -> whole) and GPU 1 (whole -> slices) both wait.
        (
            ONE_OF_TWO,
            TWO_OF_ONE,
            {s0(0): [("ann", "")], G1: [("ben", "")]},
            ONE_OF_TWO,
            [
                (
                    G0,
                    "slices",
                    ("ann",),
                    "whole",
                    "layout change waiting: 1 server still on slices the new layout removes",
                ),
                (
                    G1,
                    "whole",
                    ("ben",),
                    "7x1g.18gb",
                    "layout change waiting: 1 server still on the whole GPU, which the new layout cuts into slices",
                ),
            ],
        ),
        # ... only GPU 1 held: GPU 0 becomes whole at once, GPU 1 keeps its whole form.
        (
            ONE_OF_TWO,
            TWO_OF_ONE,
            {G1: [("ben", "")]},
            "2xH200-141GB",
            [
                (
                    G1,
                    "whole",
                    ("ben",),
                    "7x1g.18gb",
                    "layout change waiting: 1 server still on the whole GPU, which the new layout cuts into slices",
                )
            ],
        ),
        # A GPU the new read no longer lists, with a server on it: kept; a free one is dropped.
        (
            "2xH200-141GB",
            "1xH200-141GB",
            {G1: [("ann", "")]},
            "2xH200-141GB",
            [
                (
                    G1,
                    "gpu",
                    ("ann",),
                    "not listed",
                    "layout change waiting: 1 server still on this GPU, which the new inventory no longer lists",
                )
            ],
        ),
        ("2xH200-141GB", "1xH200-141GB", {G0: [("ann", "")]}, "1xH200-141GB", []),
        # A time-sliced slice with two servers on it counts both.
        (
            SEVEN,
            TWO,
            {s0(0): [("ann", ""), ("ben", "")]},
            SEVEN,
            [
                (
                    G0,
                    "slices",
                    ("ann", "ben"),
                    "2x3g.71gb",
                    "layout change waiting: 2 servers still on slices the new layout removes",
                )
            ],
        ),
    ],
)
def test_a_gpu_adopts_its_new_layout_only_when_no_server_is_on_a_device_it_removes(old, new, held, in_force, waits):
    merged, got = merge_layouts(inventory(old), inventory(new), held)
    assert [d.uuid for d in merged.devices] == [d.uuid for d in inventory(in_force).devices]
    assert [(w.gpu, w.removes, w.servers, w.new_layout, w.message) for w in got] == waits
    for wait in got:  # the devices kept in force are the waiting GPU's old ones
        assert set(wait.devices) == {d.uuid for d in inventory(old).devices if wait.gpu in (d.uuid, d.parent_uuid)}
    # Whatever was chosen, every held device of the old inventory is still in force.
    assert {u for u in held if u in inventory(old).by_uuid()} <= set(merged.by_uuid())


def test_the_merge_keeps_every_held_device_and_never_mixes_whole_and_slices_of_one_gpu():
    """Every pair of layouts of two H200s, every server holding one device of the old one: nothing held
    leaves the inventory in force, and no GPU is in force both whole and cut."""
    layouts = [
        "2xH200-141GB",
        "2xH200-141GB:mig=7x1g.18gb",
        "2xH200-141GB:mig=2x3g.71gb",
        ONE_OF_TWO,
        TWO_OF_ONE,
        "1xH200-141GB:mig=5x1g.18gb+1x2g.35gb,1xH200-141GB:mig=3x2g.35gb",
    ]
    for old in layouts:
        for new in layouts:
            for device in inventory(old).devices:
                merged, waits = merge_layouts(inventory(old), inventory(new), {device.uuid: [("ann", "")]})
                assert device.uuid in merged.by_uuid(), (old, new, device.uuid)
                whole = {d.uuid for d in merged.devices if not d.mig}
                assert not whole & {d.parent_uuid for d in merged.devices if d.mig}, (old, new, device.uuid)
                assert len(waits) <= 1
                assert (waits == []) == (device.uuid in inventory(new).by_uuid())


def test_slices_that_do_not_name_their_gpu_are_grouped_by_index():
    old = static(("GPU-a", 0, ""), ("GPU-b", 1, ""))
    new = static(("MIG-a0", 0, "3g.71gb"), ("MIG-a1", 0, "3g.71gb"), ("MIG-b0", 1, "3g.71gb"))
    merged, waits = merge_layouts(old, new, {"GPU-a": [("ann", "")]})
    assert [d.uuid for d in merged.devices] == ["GPU-a", "MIG-b0"], "GPU 0 stays whole, GPU 1 is cut"
    assert [(w.gpu, w.removes) for w in waits] == [("#0", "whole")]


def test_a_waiting_layout_says_so_in_words_and_json():
    wait = LayoutWait(G0, 0, ("ann", "ben"), "slices", (s0(0),), "2x3g.71gb")
    assert wait.to_json() == {
        "gpu_uuid": G0,
        "index": 0,
        "servers": ["ann", "ben"],
        "removes": "slices",
        "devices": [s0(0)],
        "new_layout": "2x3g.71gb",
        "message": "layout change waiting: 2 servers still on slices the new layout removes",
    }


# -- the policy: waiting, adopting after the last release, the timer ------------------------------------------


def policy_on(tmp_path, spec: str, every: float = 0.0):
    from workbench_spawner.policy.gpu_policy import GPUPolicy

    url = f"sqlite:///{tmp_path / 'wb.sqlite'}"
    store = AllocationStore(url)
    settings = PolicySettings(url, inventory(spec), node="n")
    store_policy_settings(store, settings)
    return GPUPolicy(settings, store, recheck_interval=0.05), store


def place(policy, user: str, kind: str | None, timeout: float = 0.2):
    return asyncio.run(policy.place(user, "", 1, kind, timeout))


def test_the_policy_keeps_a_held_gpu_closed_adopts_the_rest_and_the_held_one_after_its_servers_stop(tmp_path):
    from workbench_spawner.policy.gpu_policy import NoGPUAvailableError

    policy, store = policy_on(tmp_path, "2xH200-141GB:mig=7x1g.18gb")
    for user in ("ann", "ben", "cat"):
        place(policy, user, "H200-141GB 1g.18gb")
    assert sorted(u for lease in store.leases() for u in lease.gpu_uuids) == [s0(0), s0(1), s0(2)]

    assert policy.adopt_inventory(inventory("2xH200-141GB:mig=2x3g.71gb")) == []
    assert [d.uuid for d in policy.devices] == [*(s0(i) for i in range(7)), s1(0, "3g.71gb"), s1(1, "3g.71gb")]
    assert sorted(lease.user for lease in store.leases()) == ["ann", "ben", "cat"], "nobody's lease closed"
    (waiting,) = load_layout_waiting(store)
    assert waiting["message"] == "layout change waiting: 3 servers still on slices the new layout removes"
    assert waiting["gpu_uuid"] == G0
    assert waiting["new_layout"] == "2x3g.71gb"
    stored, _ = load_policy_settings(store)
    assert [d.uuid for d in stored.inventory.devices] == [d.uuid for d in policy.devices]
    # GPU 0's four free slices go to nobody; GPU 1's new slices do.
    assert [s.free_slots for s in policy.status()] == [0] * 7 + [1, 1]
    with pytest.raises(NoGPUAvailableError):
        place(policy, "dan", "H200-141GB 1g.18gb")
    assert place(policy, "dan", "H200-141GB 3g.71gb").gpu_uuids == (s1(0, "3g.71gb"),)

    policy.release("ann", "", "stopped")
    policy.release("ben", "", "stopped")
    assert policy.layout_waiting, "cat is still on a removed slice"
    assert s0(0) in policy.inventory.by_uuid(), "cat is still on a removed slice"
    assert load_layout_waiting(store)[0]["servers"] == ["cat"]
    policy.release("cat", "", "stopped")
    assert [d.uuid for d in policy.devices] == [s0(0, "3g.71gb"), s0(1, "3g.71gb"), s1(0, "3g.71gb"), s1(1, "3g.71gb")]
    assert policy.layout_waiting == []
    assert load_layout_waiting(store) == []
    assert place(policy, "eve", "H200-141GB 3g.71gb").gpu_uuids == (s0(0, "3g.71gb"),)
    assert {row.reason for row in store.usage()} == {"stopped"}
    store.dispose()


def test_changing_back_while_a_gpu_waits_cancels_the_wait_and_hands_out_nothing_twice(tmp_path):
    policy, store = policy_on(tmp_path, ONE_OF_TWO)
    place(policy, "ann", "H200-141GB 1g.18gb")
    place(policy, "ben", "H200-141GB")
    assert [lease.gpu_uuids for lease in store.leases()] == [(s0(0),), (G1,)]
    for _ in range(2):
        policy.adopt_inventory(inventory(TWO_OF_ONE))
        assert [d.uuid for d in policy.devices] == [d.uuid for d in inventory(ONE_OF_TWO).devices]
        assert [w.gpu for w in policy.layout_waiting] == [G0, G1]
        assert policy.free_count() == 0, "no whole GPU and no slice is free for anyone new"
        policy.adopt_inventory(inventory(ONE_OF_TWO))
        assert policy.layout_waiting == []
        assert load_layout_waiting(store) == []
        assert policy.free_count("H200-141GB 1g.18gb") == 6
    assert [lease.gpu_uuids for lease in store.leases()] == [(s0(0),), (G1,)]
    store.dispose()


def test_a_lease_on_a_slice_no_inventory_knows_is_closed_with_the_ledger_reason(tmp_path):
    policy, store = policy_on(tmp_path, SEVEN)
    assert store.adopt("old", "", ["MIG-sim-00-h200-141gb-9-1g.18gb"], "pid:1")
    closed = policy.adopt_inventory(inventory(TWO))
    assert [lease.user for lease in closed] == ["old"]
    assert LAYOUT_CHANGED == "MIG layout changed"
    assert [(row.user, row.reason) for row in store.usage()] == [("old", "MIG layout changed")]
    store.dispose()


def test_the_timer_reads_a_new_layout_and_adopts_a_waiting_gpu_with_nobody_spawning(tmp_path):
    from workbench_spawner.policy.inventory_refresh import watch

    layout = tmp_path / "layout"
    layout.write_text(SEVEN)
    policy, store = policy_on(tmp_path, SEVEN)
    refresh = watch(policy, [], f"@{layout}", 0.05)
    try:
        place(policy, "ann", "H200-141GB 1g.18gb")
        layout.write_text(TWO)
        deadline = time.monotonic() + 5
        while not policy.layout_waiting and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [w.servers for w in policy.layout_waiting] == [("ann",)], "read on the timer, nobody spawned"
        # The lease ends in the ledger without the policy's release (another process, a reconcile): the next
        # tick adopts the waiting layout.
        store.release("ann", "", "stopped")
        while policy.layout_waiting and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [d.profile for d in policy.devices] == ["3g.71gb", "3g.71gb"]
    finally:
        refresh.stop()
        store.dispose()


# -- the workbench service: api/gpus (held to the OpenAPI document) and the fleet page say what waits --------


async def test_the_service_shows_the_waiting_layout_change_until_it_is_adopted(store, monkeypatch):
    import json as jsonlib

    from tornado.httpclient import AsyncHTTPClient

    from tests.service.openapi_check import check
    from tests.unit.test_quota_service import PREFIX, FakeHub, _free_port, service_document
    from workbench_hub.service import handlers
    from workbench_hub.service.app import make_app
    from workbench_hub.service.fleet import Fleet
    from workbench_hub.service.handlers import _jinja
    from workbench_spawner.policy.gpu_policy import GPUPolicy
    from workbench_spawner.rules.quota import Quota

    caller = {"kind": "user", "name": "admin", "scopes": [handlers.ADMIN_SCOPE]}
    monkeypatch.setattr(handlers.WorkbenchHandler, "get_current_user", lambda self: caller)
    settings = PolicySettings(store.url, inventory("2xH200-141GB:mig=7x1g.18gb"), node="n")
    store_policy_settings(store, settings)
    policy = GPUPolicy(settings, store)
    for user in ("ann", "ben", "cat"):
        await policy.place(user, "", 1, "H200-141GB 1g.18gb", 1)
    await asyncio.to_thread(policy.adopt_inventory, inventory("2xH200-141GB:mig=2x3g.71gb"))
    fleet = Fleet(store, refresh_seconds=0)
    port = _free_port()
    server = make_app(fleet, FakeHub(), PREFIX).listen(port, "127.0.0.1")
    doc = service_document()

    async def gpus() -> dict:
        r = await AsyncHTTPClient().fetch(f"http://127.0.0.1:{port}{PREFIX}api/gpus", raise_error=False)
        check(doc, "GET", "api/gpus", r.code, r.headers.get("Content-Type", ""), r.body)
        return jsonlib.loads(r.body)

    try:
        answer = await gpus()
        wait = "layout change waiting: 3 servers still on slices the new layout removes"
        (waiting,) = answer["layout_waiting"]
        assert (waiting["gpu_uuid"], waiting["servers"], waiting["message"]) == (G0, ["ann", "ben", "cat"], wait)
        assert [(r["uuid"], r["layout_waiting"], r["free_slots"]) for r in answer["gpus"]] == [
            *((s0(i), wait, 0) for i in range(7)),
            (s1(0, "3g.71gb"), None, 1),
            (s1(1, "3g.71gb"), None, 1),
        ]
        html = _jinja.get_template("admin.html").render(
            prefix=PREFIX,
            hub_prefix="/hub/",
            caller={"name": "admin"},
            admin=True,
            inventory=fleet.inventory,
            node="n",
            simulated=True,
            gpus=answer["gpus"],
            layout_waiting=answer["layout_waiting"],
            users=[],
            groups=[],
            default=Quota(1).to_json(),
            models=[],
            xsrf="x",
        )
        assert f"GPU 0 ({G0}): {wait} (ann, ben, cat); new layout 2x3g.71gb." in html
        assert html.count(f'<span class="wb-drain-state">{wait}</span>') == 7

        for user in ("ann", "ben", "cat"):
            await asyncio.to_thread(policy.release, user, "", "stopped")
        answer = await gpus()
        assert answer["layout_waiting"] == []
        assert all(r["layout_waiting"] is None for r in answer["gpus"])
        assert [r["profile"] for r in answer["gpus"]] == ["3g.71gb"] * 4
    finally:
        server.stop()
