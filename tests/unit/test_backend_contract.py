"""The backend contract's conformance suite: the same scenarios for every backend.

Behaviour (start pinned or placed, stop and poll release, restore after a
hub restart, reconcile of leases without servers and servers without
leases, queue and refusal words) runs against the two reference
implementations in ``fake_backends.py``: a host backend and an engine
backend. The real backends' classes are held to the declared contract here
(every member of their mode implemented, no private life-cycle method or
``start`` overridden, an installed ``workbench.backends`` entry); their
behaviour runs in their tiers, against a real runtime: ``tests/integration``
(local), ``tests/docker`` (docker), ``tests/slurm`` (the two-node cluster).
"""

from __future__ import annotations

import importlib
import warnings
from types import SimpleNamespace

import pytest
from jupyterhub.spawner import SpawnException

from tests.unit.fake_backends import FakeEngineSpawner, FakeHostSpawner, FakeWorld
from workbench_spawner.backend import installed_backends
from workbench_spawner.contract import BackendContractError, contract_members, contract_problems
from workbench_spawner.mixin import GPUSpawnerMixin
from workbench_spawner.policy.gpu_policy import _policies

FAKES = [FakeHostSpawner, FakeEngineSpawner]
REAL = {
    "gpu-local": "workbench_spawner.backends.local.spawner:LocalGPUSpawner",
    "gpu-docker": "workbench_spawner.backends.docker.spawner:DockerGPUSpawner",
    "gpu-slurm": "workbench_spawner.backends.slurm.spawner:SlurmGPUSpawner",
}


def load(path: str) -> type:
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


@pytest.fixture(params=FAKES, ids=lambda cls: cls.placement_mode)
def backend(request, tmp_path):
    _policies.clear()
    world = FakeWorld()
    cls = type(f"Conforming{request.param.__name__}", (request.param,), {"world": world})

    def make(user="alice", name="", **traits):
        traits = {
            "gpu_db_url": f"sqlite:///{tmp_path / 'wb.sqlite'}",
            "simulated_gpus": "2",
            "gpu_queue_timeout": 0.3,
        } | traits
        user_obj = SimpleNamespace(name=user, url=f"/user/{user}/", escaped_name=user, groups=[])
        hub = SimpleNamespace(public_host="", api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/")
        return cls(user=user_obj, hub=hub, orm_spawner=SimpleNamespace(name=name, server=None), **traits)

    yield SimpleNamespace(make=make, world=world, mode=request.param.placement_mode)
    _policies.clear()


async def start(spawner, options):
    await spawner._apply_gpu_options(options)
    return await spawner.start()


def leases(spawner) -> dict[str, tuple[str, ...]]:
    return {lease.user: lease.gpu_uuids for lease in spawner.gpu_policy.store.leases()}


# -- the declared contract ---------------------------------------------------------------------------


@pytest.mark.parametrize("entry", sorted(REAL))
def test_every_real_backend_keeps_the_declared_contract(entry):
    cls = load(REAL[entry])
    assert contract_problems(cls) == []
    assert cls.placement_mode in ("host", "engine")
    extension = installed_backends()[cls.workbench_backend]
    assert extension.spawner == entry, "the backend's extension names its own spawner entry point"


def test_the_contract_is_small_and_each_member_is_documented():
    host, engine = contract_members("host"), contract_members("engine")
    assert host == ["gpu_lease_ref", "gpu_lease_alive", "gpu_reconcile_orphans", "gpu_environment"]
    assert engine == [
        "gpu_lease_ref",
        "gpu_lease_alive",
        "gpu_reconcile_orphans",
        "engine_inventory",
        "engine_placement",
        "engine_submit",
        "engine_connect",
        "engine_cancel",
    ]
    for name in set(host) | set(engine):
        assert (getattr(GPUSpawnerMixin, name).__doc__ or "").strip(), f"{name} has no docstring"


def test_a_backend_that_misses_a_member_is_refused_with_a_sentence_naming_it():
    class Forgetful(FakeHostSpawner):
        pass

    Forgetful.gpu_environment = GPUSpawnerMixin.gpu_environment
    problems = contract_problems(Forgetful)
    assert problems == [
        "Forgetful is a host-placed backend and does not implement gpu_environment() (see docs/backends.md)"
    ]
    with pytest.raises(BackendContractError, match="does not implement gpu_environment"):
        Forgetful(user=SimpleNamespace(name="a"), hub=None)


def test_a_backend_that_overrides_the_life_cycle_or_names_no_mode_is_refused():
    class Restarter(FakeEngineSpawner):
        async def start(self):
            return "http://x"

    class Modeless(FakeHostSpawner):
        placement_mode = "magic"

    assert any("Restarter overrides start()" in p for p in contract_problems(Restarter))
    assert contract_problems(Modeless) == ["Modeless.placement_mode must be 'host' or 'engine', not 'magic'"]


def test_a_sites_subclass_keeps_the_backend_and_its_features():
    base = load(REAL["gpu-slurm"])
    site = type("SiteSlurmSpawner", (base,), {})
    assert contract_problems(site) == [] and site.workbench_backend == "slurm"


def test_the_old_import_paths_still_work_with_a_deprecation_warning():
    for module, name in [
        ("workbench_spawner.local", "LocalGPUSpawner"),
        ("workbench_spawner.docker_backend", "DockerGPUSpawner"),
        ("workbench_spawner.slurm_backend", "SlurmGPUSpawner"),
    ]:
        import sys

        sys.modules.pop(module, None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cls = getattr(importlib.import_module(module), name)
        assert issubclass(cls, GPUSpawnerMixin)
        assert any(issubclass(w.category, DeprecationWarning) and module in str(w.message) for w in caught)


# -- behaviour, on both reference implementations ------------------------------------------------------


async def test_start_pins_or_places_the_server_and_records_the_lease(backend):
    spawner = backend.make()
    await start(spawner, {"gpus": 1})
    assert leases(spawner) == {"alice": tuple(spawner.gpu_uuids)} and len(spawner.gpu_uuids) == 1
    assert spawner.get_env()["WORKBENCH_GPUS"] == spawner.gpu_uuids[0]
    if backend.mode == "host":
        assert spawner.get_env()["FAKE_VISIBLE_DEVICES"] == spawner.gpu_uuids[0]
    lease = spawner.gpu_policy.store.lease_of("alice", "")
    assert lease.ref == spawner.gpu_lease_ref() != ""


async def test_two_servers_never_share_a_gpu(backend):
    a, b = backend.make("alice"), backend.make("bob")
    await start(a, {"gpus": 1})
    await start(b, {"gpus": 1})
    assert set(a.gpu_uuids).isdisjoint(b.gpu_uuids)


async def test_stop_releases_and_poll_of_a_dead_server_releases(backend):
    spawner = backend.make()
    await start(spawner, {"gpus": 1})
    await spawner.stop()
    assert leases(spawner) == {}
    await start(spawner, {"gpus": 1})
    spawner.alive = False  # the server died under the hub
    assert await spawner.poll() is not None
    assert leases(spawner) == {}


async def test_a_failed_start_leaves_no_lease(backend):
    spawner = backend.make()
    spawner.behaviour = "fail"
    with pytest.raises((RuntimeError, SpawnException)):
        await start(spawner, {"gpus": 1})
    assert leases(spawner) == {}


async def test_nothing_free_is_a_503_with_words_after_the_queue_timeout(backend):
    holder, waiter = backend.make("alice", default_max_gpus=2), backend.make("bob")
    await start(holder, {"gpus": 2})
    with pytest.raises(SpawnException) as info:
        await start(waiter, {"gpus": 1})
    assert info.value.status_code == 503
    assert "GPU" in info.value.message or "job" in info.value.message
    assert set(leases(holder)) == {"alice"}


async def test_a_refusal_by_the_quota_starts_nothing(backend):
    spawner = backend.make()
    with pytest.raises(SpawnException) as info:
        await start(spawner, {"gpus": 2})  # the default quota is 1 GPU
    assert info.value.status_code == 403 and "1" in info.value.message
    assert leases(spawner) == {} and backend.world.running == {}


async def test_restore_after_a_hub_restart_keeps_a_running_servers_gpus(backend):
    spawner = backend.make()
    await start(spawner, {"gpus": 1})
    state, uuids = spawner.get_state(), list(spawner.gpu_uuids)
    _policies.clear()  # a new hub process
    again = backend.make()
    again.load_state(state)
    again.alive = True
    assert await again.poll() is None
    assert again.gpu_uuids == uuids and leases(again) == {"alice": tuple(uuids)}


async def test_reconcile_releases_leases_without_servers_and_adopts_servers_without_leases(backend):
    gone, orphan = backend.make("alice"), backend.make("bob")
    await start(gone, {"gpus": 1})
    await start(orphan, {"gpus": 1})
    store = gone.gpu_policy.store
    ref = store.lease_of("bob", "").ref
    backend.world.running.pop(gone.gpu_lease_ref())  # alice's server ended while the hub was down
    store.release("bob", "", "lost with the database")  # bob's runs, its lease row is lost
    _policies.clear()
    fresh = backend.make("carol")
    policy = fresh.gpu_policy  # the first use reconciles
    assert {lease.user for lease in policy.store.leases()} == {"bob"}
    assert policy.store.lease_of("bob", "").ref == ref


async def test_an_orphan_whose_gpus_went_to_someone_else_is_ended(backend):
    bob = backend.make("bob")
    await start(bob, {"gpus": 1})
    store = bob.gpu_policy.store
    ref, uuids = store.lease_of("bob", "").ref, store.lease_of("bob", "").gpu_uuids
    store.release("bob", "", "lost")
    store.adopt("dave", "", list(uuids), "elsewhere")  # someone else holds them now, and runs
    backend.world.running["elsewhere"] = ("dave", "", tuple(uuids))
    _policies.clear()
    backend.make("carol").gpu_policy  # noqa: B018
    assert ref in backend.world.cancelled and ref not in backend.world.running


async def test_progress_tells_the_user_what_happens(backend):
    spawner = backend.make()
    await start(spawner, {"gpus": 0 if backend.mode == "host" else 1})
    events = [e["message"] for e in spawner._gpu_events._events]
    assert any(spawner.gpu_uuids[0] in e for e in events) if spawner.gpu_uuids else events, events
