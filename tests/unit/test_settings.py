"""The policy's settings: resolved once from the spawner class's config, stored, read back."""

from __future__ import annotations

import pytest
from traitlets.config import Config

from workbench_devices import DeviceInventory, GPUDevice
from workbench_spawner.ledger.store import AllocationStore
from workbench_spawner.policy.settings import (
    PolicySettings,
    load_policy_settings,
    publish_policy_settings,
    store_policy_settings,
)
from workbench_spawner.rules.quota import Quota

STATIC = [
    {"uuid": "GPU-a", "name": "NVIDIA A100-SXM4-40GB", "model": "A100-40GB", "memory_total_bytes": 40 << 30},
    {"uuid": "GPU-b", "name": "NVIDIA L40S", "model": "L40S-48GB"},
]


def config(tmp_path, spawner_class: str, **sections) -> Config:
    c = Config()
    c.JupyterHub.spawner_class = spawner_class
    c.GPUSpawnerMixin.gpu_db_url = f"sqlite:///{tmp_path / 'wb.sqlite'}"
    for section, values in sections.items():
        for key, value in values.items():
            setattr(getattr(c, section), key, value)
    return c


@pytest.mark.parametrize(
    "spawner_class", ["gpu-local", "gpu-docker", "workbench_spawner.backends.local.spawner.LocalGPUSpawner"]
)
def test_the_spawner_class_config_is_resolved_without_making_a_spawner(tmp_path, spawner_class):
    c = config(
        tmp_path,
        spawner_class,
        GPUSpawnerMixin={"default_max_gpus": 2, "servers_per_gpu": 3, "static_gpus": STATIC},
        Spawner={"default_max_gpus": 7},
    )  # a base section: the more specific one wins
    settings = publish_policy_settings(c)
    assert settings.default_quota == Quota(max_gpus=2)
    assert settings.servers_per_gpu == 3
    assert [d.uuid for d in settings.inventory.devices] == ["GPU-a", "GPU-b"]
    assert settings.inventory.source == "static"


def test_the_most_specific_section_wins(tmp_path):
    c = config(
        tmp_path,
        "gpu-docker",
        GPUSpawnerMixin={"default_max_gpus": 2, "quota_contact": "staff"},
        DockerGPUSpawner={"default_max_gpus": 4},
    )
    settings = publish_policy_settings(c)
    assert (settings.default_quota.max_gpus, settings.quota_contact) == (4, "staff")
    assert settings.backend == "docker"  # the workbench.backends name the class declares


def test_published_settings_are_what_the_service_reads(tmp_path):
    c = config(
        tmp_path,
        "gpu-local",
        GPUSpawnerMixin={
            "static_gpus": STATIC,
            "gpu_node": "gpu-host-1",
            "gpu_queue_timeout": 42.0,
            "cpu_servers_allowed": False,
        },
    )
    published = publish_policy_settings(c)
    store = AllocationStore(published.db_url)
    loaded, updated = load_policy_settings(store)
    assert loaded == published
    assert (loaded.node, loaded.queue_timeout, loaded.cpu_servers_allowed) == ("gpu-host-1", 42.0, False)
    assert loaded.inventory.devices[0] == GPUDevice("GPU-a", 0, "NVIDIA A100-SXM4-40GB", 40 << 30, "A100-40GB")
    # A later start replaces them.
    store_policy_settings(store, PolicySettings(published.db_url, DeviceInventory("none", [], "no GPUs")))
    assert load_policy_settings(store)[0].inventory.devices == []
    assert load_policy_settings(store)[1] >= updated


def test_nothing_is_stored_before_a_hub_published(tmp_path):
    assert load_policy_settings(AllocationStore(f"sqlite:///{tmp_path / 'empty.sqlite'}")) is None


def test_the_stored_url_has_no_password():
    settings = PolicySettings("postgresql+psycopg://wb:s3cret@db/wb", DeviceInventory("none"))
    assert "s3cret" not in settings.to_json()["db_url"]


@pytest.mark.parametrize(
    ("static", "message"),
    [
        ([{"name": "x"}], "static_gpus entry 0 needs 'uuid' and 'name'"),
        ([{"uuid": "a", "name": "x", "index": "first"}], "static_gpus entry 0: index and memory_total_bytes"),
        ([{"uuid": "a", "name": "x"}, {"uuid": "a", "name": "y"}], "names the same GPU UUID twice"),
        ([{"uuid": "MIG-a", "name": "x", "profile": "half"}], r"entry 0: profile 'half' is not a MIG profile"),
        (
            [{"uuid": "MIG-a", "name": "x", "model": "H100-80GB", "profile": "1g.18gb"}],
            r"entry 0: the model H100-80GB has no MIG profile '1g.18gb'; its profiles are 1g.10gb, 1g.20gb, 2g.20gb",
        ),
        (
            [
                {"uuid": "GPU-p", "name": "H200", "model": "H200-141GB"},
                {"uuid": "MIG-a", "name": "x", "model": "H200-141GB", "profile": "1g.18gb", "parent_uuid": "GPU-p"},
            ],
            "lists GPU-p as a whole GPU and as the parent of MIG slices",
        ),
    ],
)
def test_a_bad_static_list_is_a_sentence(tmp_path, static, message):
    with pytest.raises(ValueError, match=message):
        publish_policy_settings(config(tmp_path, "gpu-local", GPUSpawnerMixin={"static_gpus": static}))


def test_a_bad_simulated_spec_is_a_sentence(tmp_path):
    with pytest.raises(ValueError, match="WORKBENCH_SIMULATED_GPUS: cannot read"):
        publish_policy_settings(config(tmp_path, "gpu-local", GPUSpawnerMixin={"simulated_gpus": "lots of GPUs"}))


def test_a_spawner_that_is_not_ours_is_refused(tmp_path):
    with pytest.raises(ValueError, match="is not a GPU Workbench spawner"):
        publish_policy_settings(config(tmp_path, "simple"))


def test_a_static_list_may_name_slices_with_their_gpu(tmp_path):
    """A hub that cannot see the driver lists slices itself: each is a MIG device of its profile, with its
    GPU's UUID, and counts its share of that GPU."""
    static = [
        {"uuid": "GPU-h100", "name": "NVIDIA H100 80GB HBM3", "model": "H100-80GB", "index": 0},
        *(
            {
                "uuid": f"MIG-{i}",
                "name": "NVIDIA H200 MIG 3g.71gb",
                "model": "H200-141GB",
                "index": 1,
                "profile": " 3G.71GB ",
                "parent_uuid": "GPU-h200",
            }
            for i in range(2)
        ),
    ]
    settings = publish_policy_settings(config(tmp_path, "gpu-local", GPUSpawnerMixin={"static_gpus": static}))
    devices = settings.inventory.devices
    assert [(d.uuid, d.mig, d.profile, d.parent_uuid, round(d.share, 3)) for d in devices] == [
        ("GPU-h100", False, "", "", 1.0),
        ("MIG-0", True, "3g.71gb", "GPU-h200", round(3 / 7, 3)),
        ("MIG-1", True, "3g.71gb", "GPU-h200", round(3 / 7, 3)),
    ]
    assert settings.inventory.message == "1 GPU(s) and 2 MIG slice(s) from the static_gpus setting"
