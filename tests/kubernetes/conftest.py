"""One real Kubernetes 1.20 test cluster (tests/kubernetes/cluster.sh), shared by the Kubernetes tests.

``k8s_cluster`` starts it once per session (``cluster.sh start`` is idempotent: a second start costs
about 3 s, the first about 15 s, and the very first on a machine also builds the binaries, about 10
minutes) and leaves it running: the next session, or a developer, reuses it. Without what it needs
(root, Docker) or when it cannot start, the tests are skipped, and fail under WORKBENCH_STRICT_TESTS=1
(or CI=true), as everywhere in this suite.

``k8s_namespace`` gives each test a namespace of its own, deleted afterwards with everything in it.

The ``kubernetes`` Python client is not installed; ``kubernetes_asyncio`` is (KubeSpawner uses it).
Async tests use ``async with k8s_cluster.client() as api``; sync code calls ``k8s_cluster.run(fn)``,
which awaits ``fn(api)`` on an event loop of its own.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.conftest import missing
from tests.docker.conftest import base_image, docker_engine, singleuser_image, wheelhouse  # noqa: F401

HERE = Path(__file__).resolve().parent
CLUSTER = HERE / "cluster.sh"
STATE = Path(os.environ.get("WB_K8S_STATE", "/var/lib/wb-k8s"))
NODE = "wbk8s-node1"
API_URL = "https://127.0.0.1:16443"
# Four whole GPUs (nvidia.com/gpu) and a fifth laid out as MIG slices (nvidia.com/mig-<profile>): cluster.sh's default.
GPU_SPEC = os.environ.get("WB_K8S_GPUS", "4xH200-141GB,1xH200-141GB:mig=2x1g.18gb+1x3g.71gb")
# Images cluster.sh makes with `docker import` (no registry is reachable): pods must not pull.
BUSYBOX_IMAGE = "workbench/k8s-busybox:test"
PAUSE_IMAGE = "workbench/k8s-pause:3.4"
# A cold start builds Kubernetes first (tests/kubernetes/build.sh, ~10 min on 2 cores).
START_TIMEOUT = float(os.environ.get("WB_K8S_START_TIMEOUT", "1800"))

T = TypeVar("T")


def pytest_collection_modifyitems(config, items):
    # A conftest's hook sees every collected item, not only this folder's.
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.kubernetes)


@dataclass(frozen=True)
class K8sCluster:
    kubeconfig: Path
    node: str
    gpu_uuids: list[str]  # parse_simulated_spec(gpu_spec, node)'s whole GPUs: the nvidia.com/gpu device IDs
    gpu_spec: str  # WB_K8S_GPUS, e.g. "2xH200-141GB": give the hub the same (WORKBENCH_SIMULATED_GPUS)
    api_url: str
    state: Path
    # The spec's MIG slices by profile: the nvidia.com/mig-<profile> device IDs ({"1g.18gb": ["MIG-sim-..."]}).
    slice_uuids: dict[str, list[str]] = field(default_factory=dict)

    @asynccontextmanager
    async def client(self) -> AsyncIterator[Any]:
        """A kubernetes_asyncio ApiClient as cluster-admin, closed on exit."""
        from kubernetes_asyncio import config

        api = await config.new_client_from_config(config_file=str(self.kubeconfig))
        try:
            yield api
        finally:
            await api.close()

    def run(self, fn: Callable[[Any], Awaitable[T]]) -> T:
        """``await fn(api_client)`` from sync code; on a thread of its own when this thread already
        runs an event loop (a sync helper called from an async test)."""

        async def main() -> T:
            async with self.client() as api:
                return await fn(api)

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(main())
        # The future hands the thread's result, or its exception, back to this caller.
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(lambda: asyncio.run(main())).result()


@pytest.fixture(scope="session")
def k8s_cluster() -> K8sCluster:
    if os.geteuid() != 0:
        missing("the Kubernetes test cluster needs root (a kubelet driving Docker, mounts, sysctls)")
    if not shutil.which("docker") and not shutil.which("dockerd"):
        missing("Docker is not installed (apt-get install docker.io): the test node's kubelet drives it")
    try:
        done = subprocess.run(
            [str(CLUSTER), "start"],
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT,
            env={**os.environ, "WB_K8S_STATE": str(STATE), "WB_K8S_GPUS": GPU_SPEC},
        )
    except subprocess.TimeoutExpired:
        missing(f"tests/kubernetes/cluster.sh start did not finish within {START_TIMEOUT:.0f} s")
    if done.returncode != 0:
        missing(f"tests/kubernetes/cluster.sh start failed:\n{done.stdout}\n{done.stderr[-6000:]}")
    from workbench_devices import parse_simulated_spec

    # The backend's own API helpers (cluster.blocking), which tests use too, find the cluster as kubectl does.
    os.environ["KUBECONFIG"] = str(STATE / "admin.kubeconfig")
    devices = parse_simulated_spec(GPU_SPEC, NODE)
    slices: dict[str, list[str]] = {}
    for device in devices:
        if device.mig:
            slices.setdefault(device.profile, []).append(device.uuid)
    return K8sCluster(
        kubeconfig=STATE / "admin.kubeconfig",
        node=NODE,
        gpu_uuids=[gpu.uuid for gpu in devices if not gpu.mig],
        slice_uuids=slices,
        gpu_spec=GPU_SPEC,
        api_url=API_URL,
        state=STATE,
    )


@pytest.fixture
def k8s_namespace(k8s_cluster: K8sCluster) -> Iterator[str]:
    """A fresh namespace ``wbt-<random>``, ready for pods; deleted with everything in it afterwards."""
    from tests.kubernetes.kube import create_namespace, delete_namespace, use_kubeconfig

    use_kubeconfig(k8s_cluster.kubeconfig)
    name = create_namespace("wbt")
    try:
        yield name
    finally:
        delete_namespace(name)


@pytest.fixture(scope="module")
def k8s_module_namespace(k8s_cluster: K8sCluster) -> Iterator[str]:
    """``k8s_namespace`` for a whole module (one hub's namespace)."""
    from tests.kubernetes.kube import create_namespace, delete_namespace, use_kubeconfig

    use_kubeconfig(k8s_cluster.kubeconfig)
    name = create_namespace("wbt-mod")
    try:
        yield name
    finally:
        delete_namespace(name)


def busybox_pod(name: str, command: str, limits: dict[str, int] | None = None) -> dict:
    """A pod of the local busybox image running ``sh -c command``, with ``limits`` (extended
    resources such as ``{"nvidia.com/gpu": 1}``). A 1 s grace period: ``sleep`` under ``sh`` ignores
    SIGTERM, and the default 30 s would make every deletion slow."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"workbench-test": "1"}},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", command],
                    "resources": {"limits": {k: str(v) for k, v in (limits or {}).items()}},
                }
            ],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": False,
        },
    }


async def eventually(probe: Callable[[], Awaitable[T]], timeout: float, what: str, every: float = 0.3) -> T:
    """Await ``probe()`` until it returns something truthy, and return that; fail naming what did not
    happen (and the last value seen) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what} (last seen: {value!r})")
        await asyncio.sleep(every)
