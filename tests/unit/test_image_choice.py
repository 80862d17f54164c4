"""A user's image pick is never silently dropped: it runs, or it cannot be offered or asked for at all.

The container backends (docker, kubernetes) run the picked image, and only for that start; the backends whose
servers run the host's (or the cluster's) Python environment (local, slurm) offer no image on the form, refuse an
``image`` option with a sentence, and refuse to start the hub with images offered.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
from traitlets.config import Config

from workbench_hub.env_values import ConfigError
from workbench_spawner.backend import HubContext
from workbench_spawner.form.options import SpawnRequest
from workbench_spawner.policy.settings import image_choice_problem, publish_policy_settings
from workbench_spawner.rules.admission import AdmissionContext, Refusal, admit, image_refusal
from workbench_spawner.rules.quota import EffectiveQuota, Quota

SPAWNERS = {
    "gpu-local": "workbench_spawner.backends.local.spawner:LocalGPUSpawner",
    "gpu-docker": "workbench_spawner.backends.docker.spawner:DockerGPUSpawner",
    "gpu-slurm": "workbench_spawner.backends.slurm.spawner:SlurmGPUSpawner",
    "gpu-kubernetes": "workbench_spawner.backends.kubernetes.spawner:KubernetesGPUSpawner",
}
RUN_PICKS = ("gpu-docker", "gpu-kubernetes")
NO_PICKS = ("gpu-local", "gpu-slurm")


def load(entry: str) -> type:
    module, name = SPAWNERS[entry].split(":")
    return getattr(importlib.import_module(module), name)


@pytest.fixture
def make_spawner(monkeypatch, tmp_path):
    """make(entry, config) -> that backend's spawner as the hub makes it, with no runtime behind it."""
    import kubespawner.spawner

    monkeypatch.setattr(kubespawner.spawner, "load_config", lambda **kwargs: None)  # no kubeconfig needed

    def make(entry: str, config: Config):
        return load(entry)(
            config=config,
            user=SimpleNamespace(name="ann", id=3, url="/user/ann/", escaped_name="ann", groups=[]),
            hub=SimpleNamespace(public_host="", api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/", url="/hub/"),
            orm_spawner=SimpleNamespace(name="", server=None),
            gpu_db_url=f"sqlite:///{tmp_path / 'wb.sqlite'}",
        )

    return make


def test_each_backend_declares_whether_it_runs_a_picked_image():
    assert {entry: load(entry).runs_picked_images for entry in SPAWNERS} == {
        "gpu-local": False,
        "gpu-docker": True,
        "gpu-slurm": False,
        "gpu-kubernetes": True,
    }


# -- the pick is for one start only ------------------------------------------------------------------------------


@pytest.mark.parametrize("entry", RUN_PICKS)
async def test_a_pick_does_not_carry_over_to_the_next_start_without_one(entry, make_spawner):
    config = Config()
    section = load(entry).__name__
    config[section].image = "site/singleuser:1"
    config[section].offered_images = ["site/singleuser:1", "site/singleuser:2"]
    spawner = make_spawner(entry, config)
    spawner.apply_gpu_request(SpawnRequest(gpus=0, image="site/singleuser:2"))
    assert spawner.image == "site/singleuser:2"
    spawner.apply_gpu_request(SpawnRequest(gpus=0))
    assert spawner.image == "site/singleuser:1", f"{entry} kept the last start's pick for a start without one"


# -- where a backend runs no picked image --------------------------------------------------------------------------


def context(**kw) -> AdmissionContext:
    return AdmissionContext(quota=EffectiveQuota(Quota(1), "default", None), inventory_size=2, **kw)


def test_admission_refuses_an_image_with_the_backends_sentence():
    sentence = image_refusal("local", "the host's Python environment")
    assert sentence == "This hub's local servers all run the host's Python environment; an image cannot be chosen here."
    refusal = admit({"gpus": 0, "image": "any:1"}, context(image_refusal=sentence))
    assert isinstance(refusal, Refusal)
    assert (refusal.status, refusal.reason, refusal.message) == (400, "bad_options", sentence)
    assert not isinstance(admit({"gpus": 0}, context(image_refusal=sentence)), Refusal)


@pytest.mark.parametrize("entry", NO_PICKS)
async def test_the_form_offers_no_image_and_admission_refuses_one(entry, make_spawner):
    config = Config()
    # Set behind the hub-start check's back (a site's subclass changing the trait later, say): still no choice.
    config[load(entry).__name__].offered_images = ["site/singleuser:2"]
    spawner = make_spawner(entry, config)
    ctx = spawner.gpu_admission_context()
    assert tuple(ctx.offered_images) == ()
    assert ctx.image_refusal.startswith(f"This hub's {spawner.workbench_backend} servers all run ")
    refusal = admit({"gpus": 0, "image": "site/singleuser:2"}, ctx)
    assert isinstance(refusal, Refusal)
    assert refusal.message == ctx.image_refusal


@pytest.mark.parametrize("entry", RUN_PICKS)
async def test_a_container_backend_offers_its_images_and_admits_a_pick(entry, make_spawner):
    config = Config()
    config[load(entry).__name__].offered_images = ["site/singleuser:1", "site/singleuser:2"]
    spawner = make_spawner(entry, config)
    ctx = spawner.gpu_admission_context()
    assert tuple(ctx.offered_images) == ("site/singleuser:1", "site/singleuser:2")
    assert ctx.image_refusal == ""


@pytest.mark.parametrize("entry", NO_PICKS)
@pytest.mark.parametrize("section", ["Spawner", "GPUSpawnerMixin", "own class"])
def test_the_hub_refuses_to_start_with_images_offered_where_none_can_run(entry, section, tmp_path):
    cls = load(entry)
    config = Config()
    config.JupyterHub.spawner_class = entry
    config[cls.__name__ if section == "own class" else section].offered_images = ["a:1", "b:2"]
    config[cls.__name__].gpu_db_url = f"sqlite:///{tmp_path / 'wb.sqlite'}"
    problem = image_choice_problem(config, cls)
    assert problem.startswith(f"{cls.__name__}.offered_images (WORKBENCH_IMAGES) is set to a:1, b:2, but this hub's ")
    assert "an image cannot be chosen here. Remove it" in problem
    with pytest.raises(ValueError, match="an image cannot be chosen here"):
        publish_policy_settings(config, cls)


@pytest.mark.parametrize("entry", SPAWNERS)
def test_no_problem_without_images_or_where_they_run(entry):
    cls = load(entry)
    assert image_choice_problem(Config(), cls) == ""
    if cls.runs_picked_images:
        config = Config()
        config[cls.__name__].offered_images = ["a:1"]
        assert image_choice_problem(config, cls) == ""


@pytest.mark.parametrize("backend", ["local", "slurm"])
def test_workbench_images_fails_the_configuration_of_a_backend_that_runs_no_image(backend, tmp_path):
    configure = importlib.import_module(f"workbench_spawner.backends.{backend}.config").configure
    env = {"WORKBENCH_IMAGES": "a:1,b:2", "WORKBENCH_SLURM_PARTITION": "gpu"}
    with pytest.raises(ConfigError, match=rf"WORKBENCH_IMAGES is set, but this hub's {backend} servers all run"):
        configure(Config(), env, HubContext(tmp_path, tmp_path, tmp_path, {}))
