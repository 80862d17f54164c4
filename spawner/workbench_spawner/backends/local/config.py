"""``WORKBENCH_BACKEND=local`` (the default, ``make run``): servers as processes of the hub's own user.

The hub listens on loopback unless ``WORKBENCH_HUB_IP`` says otherwise;
servers run this Python environment's ``jupyterhub-singleuser`` and get the
repository's starter notebooks.
"""

from __future__ import annotations

from traitlets.config import Config

from workbench_hub.env_values import ConfigError, Env, text
from workbench_spawner.backend import HubContext
from workbench_spawner.rules.admission import image_refusal

_IMAGE_REFUSAL = image_refusal("local", "the host's Python environment")


def configure(c: Config, env: Env, hub: HubContext) -> None:
    if text(env, "WORKBENCH_IMAGES"):
        # A form would offer images the server then ignores: refused, as admission refuses an ``image`` option.
        raise ConfigError(f"WORKBENCH_IMAGES is set, but {_IMAGE_REFUSAL[0].lower()}{_IMAGE_REFUSAL[1:]} Unset it.")
    c.JupyterHub.spawner_class = "gpu-local"
    c.JupyterHub.hub_ip = text(env, "WORKBENCH_HUB_IP", "127.0.0.1")
    c.Spawner.cmd = [str(hub.bin_dir / "jupyterhub-singleuser")]
    c.LocalGPUSpawner.starter_notebooks_dir = str(hub.repo / "notebooks")
