"""The docker backend's entry in ``workbench.backends``: its configuration and the lock-down check at hub start."""

from __future__ import annotations

from traitlets.config import Config

from workbench_spawner.backend import BackendExtension
from workbench_spawner.backends.docker.config import configure


def check(config: Config) -> list[str]:
    """Every way the final config undoes the containers' lock-down (``lockdown.py``), one sentence each."""
    from workbench_spawner.backends.docker.spawner import check_lockdown

    return check_lockdown(config)


extension = BackendExtension(
    name="docker",
    spawner="gpu-docker",
    summary="one locked-down container per server, pinned by a device request for its GPU UUIDs (host placement)",
    configure=configure,
    check=check,
)
