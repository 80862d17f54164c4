"""Deprecated import path: the Slurm backend lives in ``workbench_spawner.backends.slurm.spawner``.

Kept for one release so that configs naming ``workbench_spawner.slurm_backend.SlurmGPUSpawner``
keep working; use ``spawner_class = "gpu-slurm"`` (the entry point) instead.
"""

import warnings

from workbench_spawner.backends.slurm.spawner import SlurmGPUSpawner

warnings.warn(
    "workbench_spawner.slurm_backend is deprecated: use spawner_class = 'gpu-slurm' "
    "(workbench_spawner.backends.slurm.spawner)",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["SlurmGPUSpawner"]
