"""Spawn latency of gpu-kubernetes against plain KubeSpawner, same image, same cluster, same run.

`benchmarks/spawn_latency.py --backend kubernetes` runs this. Two real hubs
on this host beside the Kubernetes test cluster (`tests/kubernetes/cluster.sh
start`), each in a namespace of its own: one with GPU Workbench's
`gpu-kubernetes` (admission, the NetworkPolicy, the pod with its GPU request,
the scheduler followed, the pod's GPU report, the lease and its annotation),
one with `kubespawner.KubeSpawner` 7.1 as it comes, given what a fair
comparison needs to do the same work: one `nvidia.com/gpu` (the same
scheduling and device plugin), a home claim of the same storage class
mounted at the image's home, the same image. Spawns are interleaved with the
order flipped every run; each is stopped before the next.

Figure: REST call to `ready`, median of --runs (target ratio <= 1.10).
Needs root and the cluster running.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository: tests' hub

from spawn_latency_slurm import spawn_once  # REST spawn to ready, then stopped: the same figure
from tests.conftest import Hub
from tests.kubernetes import kube

REPO = Path(__file__).resolve().parent.parent

BACKENDS = ("gpu-kubernetes", "KubeSpawner")
USERS = {"gpu-kubernetes": "benchk8sgpu", "KubeSpawner": "benchk8splain"}
STATE = Path(os.environ.get("WB_K8S_STATE", "/var/lib/wb-k8s"))
# Plain JupyterHub with plain KubeSpawner: the workbench's config file refuses a spawner that is not
# the workbench's, so the baseline hub reads this one instead (same ports, token and data dir as Hub sets).
PLAIN_CONFIG = """
import os
c.JupyterHub.bind_url = "http://127.0.0.1:" + os.environ["WORKBENCH_PORT"]
c.JupyterHub.hub_ip = c.JupyterHub.hub_connect_ip = {hub_ip!r}
c.JupyterHub.hub_port = int(os.environ["WORKBENCH_HUB_API_PORT"])
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:" + os.environ["WORKBENCH_PROXY_API_PORT"]
c.ConfigurableHTTPProxy.command = [{chp!r}]
c.JupyterHub.db_url = "sqlite:///" + os.path.join(os.environ["WORKBENCH_DATA_DIR"], "jupyterhub.sqlite")
c.JupyterHub.cookie_secret_file = os.path.join(os.environ["WORKBENCH_DATA_DIR"], "cookie_secret")
c.ConfigurableHTTPProxy.pid_file = os.path.join(os.environ["WORKBENCH_DATA_DIR"], "jupyterhub-proxy.pid")
c.JupyterHub.services = [{{"name": "workbench-admin", "api_token": os.environ["WORKBENCH_ADMIN_TOKEN"]}}]
c.JupyterHub.load_roles = [{{"name": "bench-admin", "scopes": ["admin:users", "admin:servers", "tokens"],
                             "services": ["workbench-admin"]}}]
c.JupyterHub.cleanup_servers = False
c.JupyterHub.authenticator_class = "null"  # users come from the REST API only (a loopback benchmark hub)
c.JupyterHub.spawner_class = "kubespawner.KubeSpawner"
c.KubeSpawner.namespace = {namespace!r}
c.KubeSpawner.image = {image!r}
c.KubeSpawner.image_pull_policy = "IfNotPresent"
c.KubeSpawner.extra_resource_limits = {{"nvidia.com/gpu": "1"}}
c.KubeSpawner.storage_pvc_ensure = True
c.KubeSpawner.storage_class = {storage!r}
c.KubeSpawner.storage_capacity = "1Gi"
c.KubeSpawner.volumes = [{{"name": "home", "persistentVolumeClaim": {{"claimName": "{{pvc_name}}"}}}}]
c.KubeSpawner.volume_mounts = [{{"name": "home", "mountPath": "/home/jovyan"}}]
c.KubeSpawner.uid = 1000
c.KubeSpawner.fs_gid = 100
"""


class Cluster:
    kubeconfig = STATE / "admin.kubeconfig"
    gpu_spec = os.environ.get("WB_K8S_GPUS", "4xH200-141GB")


def main(runs: int, image: str) -> None:
    kube.use_kubeconfig(Cluster.kubeconfig)
    namespaces = {name: kube.create_namespace("bench") for name in BACKENDS}
    ready: dict[str, list[float]] = {name: [] for name in BACKENDS}
    with tempfile.TemporaryDirectory() as tmp:
        plain_config = Path(tmp) / "plain_config.py"
        plain_config.write_text(
            PLAIN_CONFIG.format(
                namespace=namespaces["KubeSpawner"],
                image=image,
                storage=kube.STORAGE_CLASS,
                hub_ip=kube.NODE_IP,
                chp=str(REPO / "node_modules" / ".bin" / "configurable-http-proxy"),
            )
        )
        hubs = {
            name: Hub(
                Path(tmp) / name,
                kube.hub_env(Cluster, namespaces[name], image),
                [],
                **({"config_file": plain_config} if name == "KubeSpawner" else {}),
            )
            for name in BACKENDS
        }
        options = {"gpu-kubernetes": {"gpus": 1}, "KubeSpawner": {}}
        try:
            for name, hub in hubs.items():
                hub.data_dir.mkdir()
                hub.start()
                hub.create_users(USERS[name])
            for run in range(runs):
                order = list(BACKENDS) if run % 2 == 0 else list(reversed(BACKENDS))
                for name in order:
                    ready[name].append(spawn_once(hubs[name], USERS[name], options[name]))
                print(
                    f"run {run + 1:2d}: ready  gpu-kubernetes {ready['gpu-kubernetes'][-1]:6.2f} s   "
                    f"KubeSpawner {ready['KubeSpawner'][-1]:6.2f} s",
                    flush=True,
                )
        finally:
            for hub in hubs.values():
                hub.kill_everything()
            for namespace in namespaces.values():
                kube.delete_namespace(namespace)
    med = {k: statistics.median(v) for k, v in ready.items()}
    print(f"\n{runs} runs each, interleaved, Kubernetes 1.20 test cluster (one node, stand-in device plugin)")
    print(
        f"kubernetes ready median gpu-kubernetes {med['gpu-kubernetes']:.2f} s, KubeSpawner "
        f"{med['KubeSpawner']:.2f} s, ratio {med['gpu-kubernetes'] / med['KubeSpawner']:.3f} (target <= 1.10)"
    )
