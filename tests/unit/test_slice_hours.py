"""GPU-hours of MIG slices: an hour of a slice counts its share of the GPU (a 1g slice 1/7), recorded
with the lease when it is made (allocate, adopt, the policy's placement and restore) and copied to the
usage ledger when it ends. (Quotas by kind, whole GPUs and MIG profiles, are in test_quota.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from workbench_devices import DeviceInventory, parse_simulated_spec
from workbench_spawner.ledger.gpu_hours import gpu_hours_by_user, gpu_hours_used
from workbench_spawner.ledger.store import Lease, UsageRow
from workbench_spawner.policy.gpu_policy import GPUPolicy
from workbench_spawner.policy.settings import PolicySettings

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
SPEC = "1xH200-141GB:mig=2x1g.18gb+1x3g.71gb,1xH100-80GB"


def _usage(store, user, started, ended, gpu="GPU-sim-00-h100-80gb"):
    with store._sessions.begin() as session:
        session.add(UsageRow(gpu_uuid=gpu, user=user, server="", started=started, ended=ended, reason="stopped"))


SLICE = "MIG-sim-00-h200-141gb-0-1g.18gb"
SLICE_3G = "MIG-sim-00-h200-141gb-2-3g.71gb"


def test_a_slice_hour_counts_its_share_in_the_ledger(store):
    with store._sessions.begin() as session:
        session.add(
            UsageRow(gpu_uuid=SLICE, user="alice", server="", started=NOW - timedelta(hours=7), ended=NOW, share=1 / 7)
        )
    _usage(store, "bob", NOW - timedelta(hours=2), NOW)  # a whole GPU, as every row before MIG
    assert gpu_hours_by_user(store, now=NOW) == pytest.approx({"alice": 1.0, "bob": 2.0})


def test_a_held_slice_counts_its_share_and_the_ledger_keeps_it(store):
    shares = {SLICE: 1 / 7, SLICE_3G: 3 / 7}
    lease = store.allocate("alice", "", 1, [SLICE], shares=shares)
    assert lease.shares == pytest.approx((1 / 7,))
    assert lease.gpu_share == pytest.approx(1 / 7)
    assert store.lease_of("alice", "").shares == pytest.approx((1 / 7,))
    assert gpu_hours_used(store, "alice", now=lease.since + timedelta(hours=7)) == pytest.approx(1.0)
    # Adopted leases record their shares too; a uuid shares leaves out is a whole GPU.
    assert store.adopt("bob", "", [SLICE_3G, "GPU-whole"], "pid:1", since=lease.since, shares=shares)
    assert store.lease_of("bob", "").gpu_share == pytest.approx(3 / 7 + 1)
    assert gpu_hours_used(store, "bob", now=lease.since + timedelta(hours=7)) == pytest.approx(10.0)
    store.release("alice", "", "stopped")
    (row,) = store.usage(user="alice")
    assert row.share == pytest.approx(1 / 7), "the ledger copies the share the lease recorded"
    with pytest.raises(ValueError, match="more than 0 and at most 1, not 2"):
        store.allocate("carol", "", 1, ["GPU-x"], shares={"GPU-x": 2.0})
    assert store.lease_of("carol", "") is None


def test_a_lease_without_shares_holds_whole_gpus():
    lease = Lease("alice", "", ("GPU-a", "GPU-b"), NOW)
    assert lease.shares == (1.0, 1.0)
    assert lease.gpu_share == 2.0
    with pytest.raises(ValueError, match="needs as many shares"):
        Lease("alice", "", ("GPU-a",), NOW, shares=(0.5, 0.5))


async def test_the_policy_records_the_share_of_what_it_places_and_restores(store):
    inventory = DeviceInventory("simulated", parse_simulated_spec(SPEC), "test")
    policy = GPUPolicy(PolicySettings(store.url, inventory, node="node-a"), store)
    lease = await policy.place("alice", "", 1, "1g.18gb", 1)
    assert lease.shares == pytest.approx((1 / 7,))
    assert store.lease_of("alice", "").shares == pytest.approx((1 / 7,))
    assert (await policy.place("bob", "", 1, None, 1)).shares == (1.0,)
    assert gpu_hours_used(store, "alice", now=lease.since + timedelta(hours=7)) == pytest.approx(1.0)
    # After a restart that lost carol's lease row, her running server's 3g slice is leased again at 3/7.
    assert policy.restore("carol", "", [SLICE_3G], "pid:7") == (SLICE_3G,)
    assert store.lease_of("carol", "").shares == pytest.approx((3 / 7,))
