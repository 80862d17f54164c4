"""GPU-aware JupyterHub spawners: a shared GPU policy and thin backends."""

from workbench_spawner.mixin import GPUSpawnerMixin

__all__ = ["GPUSpawnerMixin"]
__version__ = "0.1.0"
