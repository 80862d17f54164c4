"""Deprecated import path: the local backend lives in ``workbench_spawner.backends.local.spawner``.

Kept for one release so that configs naming ``workbench_spawner.local.LocalGPUSpawner`` keep
working; use ``spawner_class = "gpu-local"`` (the entry point) instead.
"""

import warnings

from workbench_spawner.backends.local.spawner import LocalGPUSpawner, copy_missing, pid_runs_jupyter

warnings.warn(
    "workbench_spawner.local is deprecated: use spawner_class = 'gpu-local' (workbench_spawner.backends.local.spawner)",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["LocalGPUSpawner", "copy_missing", "pid_runs_jupyter"]
