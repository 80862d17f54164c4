"""``workbench_hub.finish``: the end of the hub's config, shared by ``hub/jupyterhub_config.py`` and the z2jh chart.

It runs on the final config: a problem ends the hub with a sentence and
status 2; otherwise the policy's settings are published to the GPU database,
the workbench service is pointed at them and the spawn limit is set above the
GPU line.
"""

from __future__ import annotations

import pytest
from traitlets.config import Config

from workbench_hub import finish
from workbench_spawner.ledger.store import AllocationStore
from workbench_spawner.policy.settings import load_policy_settings


def local_config(tmp_path) -> Config:
    c = Config()
    c.JupyterHub.spawner_class = "gpu-local"
    c.GPUSpawnerMixin.gpu_db_url = f"sqlite:///{tmp_path / 'wb.sqlite'}"
    c.GPUSpawnerMixin.simulated_gpus = "2"
    # As configurer.update_services leaves it: the workbench service, which finish points at the settings.
    c.JupyterHub.services = [{"name": "workbench", "command": ["python", "-m", "workbench_hub.service", "--port=1"]}]
    return c


def test_a_good_config_is_published_and_the_spawn_limit_set(tmp_path):
    c = local_config(tmp_path)
    finished = finish.finish_hub(c, c)
    assert finished.spawner_class.__name__ == "LocalGPUSpawner"
    assert finished.settings.backend == "local"
    assert len(finished.settings.inventory.devices) == 2
    assert c.JupyterHub.concurrent_spawn_limit == finished.limits.concurrent_spawn_limit
    service = c.JupyterHub.services[0]
    assert service["command"][-1] == "--backend=local"
    assert service["environment"]["WORKBENCH_DB_URL"] == finished.settings.db_url
    store = AllocationStore(finished.settings.db_url)
    try:
        stored, _ = load_policy_settings(store)
    finally:
        store.dispose()
    assert stored.backend == "local"
    assert len(stored.inventory.devices) == 2


def test_the_callers_refusal_of_the_class_ends_the_hub_before_anything_is_published(tmp_path, capsys):
    c = local_config(tmp_path)
    with pytest.raises(SystemExit) as exited:
        finish.finish_hub(c, c, class_problem=lambda cls: f"{cls.__name__} is not welcome here")
    assert exited.value.code == 2
    assert "GPU Workbench: LocalGPUSpawner is not welcome here" in capsys.readouterr().err
    assert not (tmp_path / "wb.sqlite").exists()


def test_a_spawner_class_outside_the_contract_ends_the_hub(tmp_path, capsys):
    c = local_config(tmp_path)
    c.JupyterHub.spawner_class = "jupyterhub.spawner.LocalProcessSpawner"
    with pytest.raises(SystemExit) as exited:
        finish.finish_hub(c, c)
    assert exited.value.code == 2
    assert "GPU Workbench: " in capsys.readouterr().err
