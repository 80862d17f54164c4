"""The local backend's entry in ``workbench.backends``: configuration only (nothing to add to the service)."""

from __future__ import annotations

from workbench_spawner.backend import BackendExtension
from workbench_spawner.backends.local.config import configure

extension = BackendExtension(
    name="local",
    spawner="gpu-local",
    summary="servers as processes of the hub's user, pinned by CUDA_VISIBLE_DEVICES (host placement)",
    configure=configure,
)
