"""The tiers' own fixtures, shared with the conformance suite: the Docker images, the Slurm and Kubernetes clusters.

Imported rather than moved: ``tests/docker`` and ``tests/slurm`` keep them
where their own tests read them, and pytest registers them here too. Both
build or start idempotently (an image that exists is reused, a running
cluster is kept), so a second registration costs seconds, not a rebuild.
"""

from tests.docker.conftest import base_image, docker_engine, singleuser_image, wheelhouse  # noqa: F401
from tests.kubernetes.conftest import k8s_cluster, k8s_module_namespace  # noqa: F401
from tests.slurm.conftest import slurm_cluster  # noqa: F401
