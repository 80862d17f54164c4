"""A GPU's MIG layout changes while the hub runs: the inventory is read again and used, without a restart."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

import pytest
from jupyterhub.spawner import SpawnException

from tests.unit.test_quota_spawn import make_spawner  # noqa: F401  (the fixture)
from workbench_devices import DeviceInventory, parse_simulated_spec
from workbench_spawner.ledger.store import AllocationStore
from workbench_spawner.policy.gpu_policy import LAYOUT_CHANGED
from workbench_spawner.policy.inventory_refresh import InventoryRefresh, changes, spec_in_force
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
    assert refresh() is False and adopted == [], "just read at start: not again before the interval"
    clock.now += 60
    assert refresh() is False and adopted == [], "the same devices: nothing to adopt"
    clock.now += 30
    assert refresh() is False, "30 s after the last read"
    clock.now += 30
    assert refresh() is True and [d.profile for d in adopted[0].devices] == ["3g.71gb", "3g.71gb"]


def test_zero_turns_it_off():
    refresh, clock, adopted = refresher([inventory(TWO)], every=0)
    clock.now += 10_000
    assert refresh() is False and adopted == []


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
    assert adopted == [] and [r.getMessage() for r in caplog.records if logged in r.getMessage()] != []
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


async def test_a_new_layout_is_placed_on_stored_for_the_service_and_closes_leases_on_gone_slices(
    make_spawner,  # noqa: F811
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

    layout.write_text(TWO)  # the admin drained the GPU and cut it again (here: under a running server)
    time.sleep(0.1)
    bob = make_spawner("bob", **traits)
    assert bob.gpu_policy is policy, "one policy for the hub, whatever layout a later spawner finds"
    assert [d.uuid for d in policy.devices] == ["MIG-sim-00-h200-141gb-0-3g.71gb", "MIG-sim-00-h200-141gb-1-3g.71gb"]
    stored, _ = load_policy_settings(store)
    assert [d.profile for d in stored.inventory.devices] == ["3g.71gb", "3g.71gb"]
    assert store.lease_of("alice", "") is None
    assert [(row.user, row.reason) for row in store.usage()] == [("alice", LAYOUT_CHANGED)]

    with pytest.raises(SpawnException) as refused:
        await bob._apply_gpu_options({"gpus": 1, "gpu_profile": "1g.18gb"})
    assert refused.value.status_code == 400 and "1g.18gb" in str(refused.value)
    await bob._apply_gpu_options({"gpus": 1, "gpu_profile": "3g.71gb"})
    await bob._acquire(bob.gpu_request)
    assert leased(bob) == ("MIG-sim-00-h200-141gb-0-3g.71gb",)
    assert bob.get_env()["WORKBENCH_SIMULATED_GPUS"] == TWO
    store.dispose()


async def test_a_request_waiting_in_line_gets_a_slice_of_the_new_layout(make_spawner, tmp_path):  # noqa: F811
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
