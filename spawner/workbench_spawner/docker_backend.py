"""Deprecated import path: the docker backend lives in ``workbench_spawner.backends.docker.spawner``.

Kept for one release so that configs naming ``workbench_spawner.docker_backend.DockerGPUSpawner``
keep working; use ``spawner_class = "gpu-docker"`` (the entry point) instead.
"""

import warnings

from workbench_spawner.backends.docker.spawner import DockerGPUSpawner, check_lockdown

warnings.warn(
    "workbench_spawner.docker_backend is deprecated: use spawner_class = 'gpu-docker' "
    "(workbench_spawner.backends.docker.spawner)",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["DockerGPUSpawner", "check_lockdown"]
