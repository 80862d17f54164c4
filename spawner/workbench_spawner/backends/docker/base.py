"""What the docker backend's mixins are mixed into (for the type checker), and the engine's errors.

``ContainerEnding`` and ``TenantIsolation`` are bases of ``DockerGPUSpawner``
and work on the spawner's state (DockerSpawner's ``docker``, ``image``,
``volumes``...; the GPU mixin's ``gpu_policy``, ``user``...). The checker
sees them as subclasses of both, so every attribute they read is checked
against its definition; at run time they derive from ``object`` and the
spawner's real bases come after them in ``DockerGPUSpawner``'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import docker

# The errors a call to the Docker engine can raise: docker-py's own, and requests'/the socket's when the daemon
# is away (requests' exceptions are OSErrors). A catch of these is where the engine's absence is handled.
ENGINE_ERRORS: tuple[type[Exception], ...] = (docker.errors.DockerException, OSError)

if TYPE_CHECKING:
    from dockerspawner import DockerSpawner

    from workbench_spawner.mixin import GPUSpawnerMixin

    class DockerGPUBase(GPUSpawnerMixin, DockerSpawner):
        """The spawner a docker mixin is mixed into (``DockerGPUSpawner``'s other bases)."""

else:
    DockerGPUBase = object
