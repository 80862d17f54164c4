"""The backend contract, checked on the classes: members, modes, entry points, and the image a user picks.

Every backend's class is held to the declared contract here (every member
of its mode implemented, no private life-cycle method or ``start``
overridden, an installed ``workbench.backends`` entry naming its spawner).
Behaviour (start pinned or placed, stop and poll release, restore after a
hub restart, reconcile both ways, queue and refusal words) is the
conformance suite, ``tests/conformance/test_conformance.py``: the same
scenarios on the two reference implementations (``fake_backends.py``) and
on local, docker, slurm and kubernetes against their real runtimes (the
Kubernetes pod's picked image on the real cluster: tests/kubernetes).
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
from traitlets.config import Config

from tests.unit.fake_backends import FakeEngineSpawner, FakeHostSpawner
from workbench_spawner.backend import installed_backends
from workbench_spawner.contract import BackendContract, BackendContractError, contract_members, contract_problems
from workbench_spawner.form.options import SpawnRequest
from workbench_spawner.mixin import GPUSpawnerMixin

FAKES = [FakeHostSpawner, FakeEngineSpawner]
REAL = {
    "gpu-local": "workbench_spawner.backends.local.spawner:LocalGPUSpawner",
    "gpu-docker": "workbench_spawner.backends.docker.spawner:DockerGPUSpawner",
    "gpu-slurm": "workbench_spawner.backends.slurm.spawner:SlurmGPUSpawner",
    "gpu-kubernetes": "workbench_spawner.backends.kubernetes.spawner:KubernetesGPUSpawner",
}
# The container backends: their configuration offers WORKBENCH_IMAGES on the spawn form, so a pick must reach
# the container or pod (``apply_gpu_request``).
OFFERS_IMAGES = ("gpu-docker", "gpu-kubernetes")


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
    assert contract_problems(site) == []
    assert site.workbench_backend == "slurm"


def test_every_installed_backend_is_held_to_the_contract_here():
    assert {extension.spawner for extension in installed_backends().values()} == set(REAL)


# -- the image a user picks ------------------------------------------------------------------------------------


@pytest.mark.parametrize("entry", OFFERS_IMAGES)
def test_each_backend_that_offers_images_acts_on_the_pick(entry):
    cls = load(REAL[entry])
    assert cls.apply_gpu_request is not BackendContract.apply_gpu_request, f"{entry} would drop the picked image"


@pytest.fixture
def make_spawner(monkeypatch, tmp_path):
    """make(entry, config) -> that backend's spawner as the hub makes it, with no runtime behind it."""
    import kubespawner.spawner

    monkeypatch.setattr(kubespawner.spawner, "load_config", lambda **kwargs: None)  # no kubeconfig needed

    def make(entry: str, config: Config):
        return load(REAL[entry])(
            config=config,
            user=SimpleNamespace(name="ann", id=3, url="/user/ann/", escaped_name="ann"),
            hub=SimpleNamespace(public_host="", api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/", url="/hub/"),
            orm_spawner=SimpleNamespace(name="", server=None),
            gpu_db_url=f"sqlite:///{tmp_path / 'wb.sqlite'}",
        )

    return make


@pytest.mark.parametrize("entry", OFFERS_IMAGES)
async def test_an_image_pick_is_applied_by_each_backend_that_offers_images(entry, make_spawner):
    config = Config()
    section = load(REAL[entry]).__name__
    config[section].image = "site/singleuser:1"
    config[section].offered_images = ["site/singleuser:1", "site/singleuser:2"]
    spawner = make_spawner(entry, config)
    assert spawner.image == "site/singleuser:1"
    spawner.apply_gpu_request(SpawnRequest(gpus=0, image="site/singleuser:2"))
    assert spawner.image == "site/singleuser:2", f"{entry} runs the default image although the user picked another"
