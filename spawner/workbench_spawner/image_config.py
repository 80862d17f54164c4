"""``WORKBENCH_IMAGE`` and ``WORKBENCH_IMAGES`` as a backend's config function reads them, one of two ways.

A backend whose servers run the image a user picks (``runs_picked_images``:
docker, kubernetes) needs a default image and offers the listed ones on the
spawn form. A backend whose servers all run one Python environment (local,
slurm) refuses the list at start, in the sentence its admission refuses an
``image`` option with, rather than show a form whose pick would be ignored.
"""

from __future__ import annotations

from traitlets.config import Config

from workbench_hub.env_values import ConfigError, Env, comma_list, text
from workbench_spawner.rules.admission import image_refusal


def configure_images(spawner: Config, env: Env, backend: str, the_image: str) -> None:
    """The default image (``WORKBENCH_IMAGE``; without it: "the <backend> backend needs WORKBENCH_IMAGE,
    <the_image>") and the images a user may pick (``WORKBENCH_IMAGES``), set on the spawner's section."""
    image = text(env, "WORKBENCH_IMAGE")
    if not image:
        raise ConfigError(f"the {backend} backend needs WORKBENCH_IMAGE, {the_image}")
    spawner.image = image
    offered = comma_list(env, "WORKBENCH_IMAGES")
    if offered:
        spawner.offered_images = offered


def refuse_images(env: Env, backend: str, server_environment: str) -> None:
    """A ConfigError when ``WORKBENCH_IMAGES`` is set for a backend whose servers all run ``server_environment``."""
    if text(env, "WORKBENCH_IMAGES"):
        refusal = image_refusal(backend, server_environment)
        raise ConfigError(f"WORKBENCH_IMAGES is set, but {refusal[0].lower()}{refusal[1:]} Unset it.")
