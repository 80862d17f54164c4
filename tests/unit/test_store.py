"""The allocation store under contention, release and restart."""

import threading
from collections import Counter

import pytest

from workbench_spawner.ledger.store import AllocationStore

GPUS = [f"GPU-sim-{i:02d}-h100-80gb" for i in range(8)]


def hammer(db_url, requests, count_of=lambda i: 1, slots=1):
    """Run ``requests`` allocations at once, each thread with its own store
    (its own connections), as separate hub workers would."""
    barrier = threading.Barrier(requests)
    results, errors = {}, []

    def one(i):
        store = AllocationStore(db_url)
        try:
            barrier.wait()
            results[i] = store.allocate(f"user{i}", "", count_of(i), GPUS, slots)
        except Exception as exc:  # noqa: BLE001 - a thread's error, handed to the assertion below
            errors.append(exc)
        finally:
            store.dispose()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


def test_200_concurrent_requests_for_8_gpus_never_double_assign(db_url):
    AllocationStore(db_url).dispose()  # create the schema once, as the hub does
    results = hammer(db_url, 200)
    granted = [lease for lease in results.values() if lease is not None]
    assert len(granted) == 8
    held = Counter(uuid for lease in granted for uuid in lease.gpu_uuids)
    assert sorted(held) == sorted(GPUS)
    assert set(held.values()) == {1}
    # The database agrees with what the callers were told.
    store = AllocationStore(db_url)
    assert sorted((h.user, h.gpu_uuids) for h in store.leases()) == sorted((g.user, g.gpu_uuids) for g in granted)


def test_concurrent_multi_gpu_requests_are_all_or_nothing(db_url):
    AllocationStore(db_url).dispose()
    results = hammer(db_url, 60, count_of=lambda i: 1 + i % 3)
    granted = [lease for lease in results.values() if lease is not None]
    held = Counter(uuid for lease in granted for uuid in lease.gpu_uuids)
    assert set(held.values()) == {1}, "a GPU was handed out twice"
    for i, lease in results.items():
        if lease is not None:
            assert len(lease.gpu_uuids) == 1 + i % 3
    assert sum(len(g.gpu_uuids) for g in granted) <= 8
    # Nothing free is left that a one-GPU request could still get, or the
    # allocator refused someone while it could serve them.
    free = 8 - sum(held.values())
    refused_single = [i for i, lease in results.items() if lease is None and 1 + i % 3 == 1]
    assert free == 0 or not refused_single


def test_shared_mode_caps_servers_per_gpu(db_url):
    AllocationStore(db_url).dispose()
    results = hammer(db_url, 40, slots=2)
    granted = [lease for lease in results.values() if lease is not None]
    assert len(granted) == 16
    assert set(Counter(u for lease in granted for u in lease.gpu_uuids).values()) == {2}


def test_release_frees_gpus_and_records_usage(db_url):
    store = AllocationStore(db_url)
    lease = store.allocate("alice", "", 2, GPUS)
    assert lease.gpu_uuids == tuple(GPUS[:2])
    assert store.allocate("bob", "", 7, GPUS) is None, "only 6 are free"
    assert store.release("alice", "", "stopped") == lease.gpu_uuids
    assert store.release("alice", "", "stopped") == (), "a second release is a no-op"
    assert store.allocate("bob", "", 8, GPUS) is not None
    usage = store.usage(user="alice")
    assert sorted(u.gpu_uuid for u in usage) == sorted(lease.gpu_uuids)
    assert all(u.ended >= u.started and u.reason == "stopped" for u in usage)


def test_restarting_a_server_replaces_its_old_lease(db_url):
    store = AllocationStore(db_url)
    store.allocate("alice", "exp", 2, GPUS)
    lease = store.allocate("alice", "exp", 1, GPUS)
    assert len(lease.gpu_uuids) == 1
    assert [held.gpu_uuids for held in store.leases()] == [lease.gpu_uuids]


def test_leases_survive_a_new_store_on_the_same_database(db_url):
    first = AllocationStore(db_url)
    first.allocate("alice", "", 3, GPUS)
    first.set_ref("alice", "", "pid:1234")
    first.dispose()
    second = AllocationStore(db_url)
    [lease] = second.leases()
    assert (lease.user, lease.ref, lease.gpu_uuids) == ("alice", "pid:1234", tuple(GPUS[:3]))
    assert second.allocate("bob", "", 6, GPUS) is None
    assert set(second.allocate("bob", "", 5, GPUS).gpu_uuids).isdisjoint(lease.gpu_uuids)


def test_count_must_be_positive(db_url):
    with pytest.raises(ValueError, match="count must be at least 1"):
        AllocationStore(db_url).allocate("alice", "", 0, GPUS)
