"""``WORKBENCH_BACKEND=local`` (the default, ``make run``): servers as processes of the hub's own user.

The hub listens on loopback unless ``WORKBENCH_HUB_IP`` says otherwise;
servers run this Python environment's ``jupyterhub-singleuser`` and get the
repository's starter notebooks.
"""

from __future__ import annotations

from traitlets.config import Config

from workbench_hub.env_values import Env, text
from workbench_spawner.backend import HubContext
from workbench_spawner.image_config import refuse_images


def configure(c: Config, env: Env, hub: HubContext) -> None:
    """``WORKBENCH_BACKEND=local``."""
    refuse_images(env, "local", "the host's Python environment")
    c.JupyterHub.spawner_class = "gpu-local"
    c.JupyterHub.hub_ip = text(env, "WORKBENCH_HUB_IP", "127.0.0.1")
    c.Spawner.cmd = [str(hub.bin_dir / "jupyterhub-singleuser")]
    c.LocalGPUSpawner.starter_notebooks_dir = str(hub.repo / "notebooks")
