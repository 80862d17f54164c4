"""GPU-aware JupyterHub spawners: a shared GPU policy and thin backends."""

from workbench_spawner.mixin import GPUSpawnerMixin
from workbench_spawner.release import version

__all__ = ["GPUSpawnerMixin"]
__version__ = version()
