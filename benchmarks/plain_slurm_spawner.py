"""batchspawner's SlurmSpawner as it comes, for spawn_latency_slurm.py.

The hub's config refuses a spawner class that is not a GPU Workbench spawner
(it stores the GPU policy's settings from the class's traits). This class adds
those settings' traits (``GPUPolicyConfig``: traits only, no behaviour) and
nothing else, so the comparison runs SlurmSpawner's own start, poll and stop.
"""

from batchspawner import SlurmSpawner

from workbench_spawner.policy.config import GPUPolicyConfig


class PlainSlurmSpawner(GPUPolicyConfig, SlurmSpawner):
    """SlurmSpawner, unchanged."""
