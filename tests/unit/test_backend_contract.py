"""The backend contract, checked on the classes: members, modes, entry points, old import paths.

Every backend's class is held to the declared contract here (every member
of its mode implemented, no private life-cycle method or ``start``
overridden, an installed ``workbench.backends`` entry naming its spawner).
Behaviour (start pinned or placed, stop and poll release, restore after a
hub restart, reconcile both ways, queue and refusal words) is the
conformance suite, ``tests/conformance/test_conformance.py``: the same
scenarios on the two reference implementations (``fake_backends.py``) and
on local, docker and slurm against their real runtimes.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest

from tests.unit.fake_backends import FakeEngineSpawner, FakeHostSpawner
from workbench_spawner.backend import installed_backends
from workbench_spawner.contract import BackendContractError, contract_members, contract_problems
from workbench_spawner.mixin import GPUSpawnerMixin

FAKES = [FakeHostSpawner, FakeEngineSpawner]
REAL = {
    "gpu-local": "workbench_spawner.backends.local.spawner:LocalGPUSpawner",
    "gpu-docker": "workbench_spawner.backends.docker.spawner:DockerGPUSpawner",
    "gpu-slurm": "workbench_spawner.backends.slurm.spawner:SlurmGPUSpawner",
}


def load(path: str) -> type:
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


# -- the declared contract ---------------------------------------------------------------------------


@pytest.mark.parametrize("entry", sorted(REAL))
def test_every_real_backend_keeps_the_declared_contract(entry):
    cls = load(REAL[entry])
    assert contract_problems(cls) == []
    assert cls.placement_mode in ("host", "engine")
    extension = installed_backends()[cls.workbench_backend]
    assert extension.spawner == entry, "the backend's extension names its own spawner entry point"


@pytest.mark.parametrize("cls", FAKES, ids=lambda cls: cls.__name__)
def test_the_reference_implementations_keep_the_contract(cls):
    assert contract_problems(cls) == []


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
