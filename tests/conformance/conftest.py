"""The tiers' own fixtures, shared with the conformance suite: the Docker images, the Slurm and Kubernetes clusters.

Imported rather than moved: ``tests/docker`` and ``tests/slurm`` keep them
where their own tests read them, and pytest registers them here too. Both
build or start idempotently (an image that exists is reused, a running
cluster is kept), so a second registration costs seconds, not a rebuild.
"""

# The engines' fixtures, by name for pytest: explicit re-exports.
from tests.docker.conftest import base_image as base_image
from tests.docker.conftest import docker_engine as docker_engine
from tests.docker.conftest import singleuser_image as singleuser_image
from tests.docker.conftest import wheelhouse as wheelhouse
from tests.kubernetes.conftest import k8s_cluster as k8s_cluster
from tests.kubernetes.conftest import k8s_module_namespace as k8s_module_namespace
from tests.slurm.conftest import slurm_cluster as slurm_cluster
