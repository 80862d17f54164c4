"""Spawn latency of the gpu-docker backend against plain DockerSpawner.

Two real hubs run side by side from the same config and image: one with
GPU Workbench's docker backend (GPU lease, device request, labels, lock-down,
home/checkpoints/datasets volumes), one with `dockerspawner.DockerSpawner` as
it comes. Spawns are interleaved (A B, B A, A B, ...: the order flips every
run so neither backend always goes first) so both see the same machine load.
Each spawn is stopped before the next one starts.

Two figures per spawn, both from the REST call that starts the server:

- **ready**: until the hub reports the server `ready` (what the issue pins).
  JupyterHub finds a new server by polling it with exponential backoff and
  random jitter (gaps of up to several seconds), so this figure carries up to
  ~4 s of noise that has nothing to do with the spawner.
- **answering**: until the single-user server itself answers
  `/user/<name>/api` on the container's published port, polled by this script
  every 50 ms. This is the spawner's and container's own cost, without the
  hub's backoff, and is the steadier figure to compare.

Prints medians and ratios (target: ready ratio at most 1.10).

    .venv/bin/python benchmarks/spawn_latency.py [--runs 10] [--image gpu-workbench/singleuser:test]
        [--plain-home-volume]
    .venv/bin/python benchmarks/spawn_latency.py --backend slurm [--runs 10]   # gpu-slurm vs SlurmSpawner
    .venv/bin/python benchmarks/spawn_latency.py --backend kubernetes [--runs 10]   # vs KubeSpawner

Needs a running Docker engine with the image built (`make test-images`).
Both hubs keep their volumes under names starting with `bench-`, removed
before and after the run, so every run starts from empty homes and the
script never touches a real user's volumes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import docker
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import contextlib

from tests.conftest import Hub

BACKENDS = ("gpu-docker", "DockerSpawner")
VOLUME_PREFIX = "bench-"


def remove_bench_volumes(client: docker.DockerClient) -> None:
    for volume in client.volumes.list():
        if volume.name.startswith(VOLUME_PREFIX):
            volume.remove(force=True)


def server_address(client: docker.DockerClient, container: str, user: str) -> str:
    """host:port where the user's server answers: the published port (plain DockerSpawner), else the
    container's address on its network (gpu-docker: isolated networks, nothing published)."""
    try:
        attrs = client.containers.get(container).attrs
    except docker.errors.NotFound:
        found = client.containers.list(all=True, filters={"label": f"workbench.user={user}"})
        if not found:
            raise
        attrs = found[0].attrs
    ports = attrs["NetworkSettings"].get("Ports") or {}
    if ports.get("8888/tcp"):
        return f"127.0.0.1:{ports['8888/tcp'][0]['HostPort']}"
    (network,) = attrs["NetworkSettings"]["Networks"].values()
    return f"{network['IPAddress']}:8888"


class AnsweringClock:
    """Times, from `started`, until the user's container answers its API (where the proxy would reach it)."""

    def __init__(self, client: docker.DockerClient, container: str, user: str, started: float):
        self.elapsed: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(client, container, user, started), daemon=True)
        self._thread.start()

    def _watch(self, client: docker.DockerClient, container: str, user: str, started: float) -> None:
        while not self._stop.is_set():
            try:
                address = server_address(client, container, user)
                r = requests.get(f"http://{address}/user/{user}/api", timeout=1)
                if r.status_code < 500:
                    self.elapsed = time.perf_counter() - started
                    return
            except (docker.errors.NotFound, KeyError, IndexError, TypeError, requests.RequestException):
                pass
            time.sleep(0.05)

    def result(self) -> float:
        self._thread.join(timeout=5)
        self._stop.set()
        if self.elapsed is None:
            raise SystemExit("the server was ready for the hub but never answered at its address")
        return self.elapsed


def spawn_once(hub: Hub, client: docker.DockerClient, user: str, options: dict) -> tuple[float, float]:
    started = time.perf_counter()
    clock = AnsweringClock(client, f"jupyter-{user}", user, started)
    r = hub.spawn(user, **options)
    if r.status_code not in (201, 202):
        raise SystemExit(f"spawn failed: {r.status_code} {r.text}")
    hub.wait_ready(user, timeout=300)
    ready = time.perf_counter() - started
    answering = clock.result()
    hub.api("DELETE", f"/users/{user}/server")
    hub.wait_stopped(user, timeout=120)
    return ready, answering


def summary(label: str, times: dict[str, list[float]], target: str = "") -> str:
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["gpu-docker"] / med["DockerSpawner"]
    return (
        f"{label:<10} median gpu-docker {med['gpu-docker']:.2f} s, DockerSpawner {med['DockerSpawner']:.2f} s, "
        f"ratio {ratio:.3f}{target}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--backend",
        choices=("docker", "slurm", "kubernetes"),
        default="docker",
        help="slurm: gpu-slurm against batchspawner's SlurmSpawner (spawn_latency_slurm.py); kubernetes: "
        "gpu-kubernetes against KubeSpawner on the test cluster (spawn_latency_kubernetes.py)",
    )
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--image", default="gpu-workbench/singleuser:test")
    parser.add_argument(
        "--plain-home-volume",
        action="store_true",
        help="give plain DockerSpawner a named home volume too, as gpu-docker has, so the "
        "comparison leaves out the first-start work of an empty home",
    )
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.backend == "slurm":
        from spawn_latency_slurm import main as slurm_main

        slurm_main(args.runs)
        return
    if args.backend == "kubernetes":
        from spawn_latency_kubernetes import main as kubernetes_main

        kubernetes_main(args.runs, args.image)
        return
    client = docker.from_env()

    env = {"WORKBENCH_BACKEND": "docker", "WORKBENCH_IMAGE": args.image, "WORKBENCH_SIMULATED_GPUS": "4"}
    # User names without characters DockerSpawner escapes: plain DockerSpawner's container is
    # jupyter-<name>; gpu-docker's is workbench-<hub id>-<name>, found by its workbench.user label.
    users = {"gpu-docker": "benchgpu", "DockerSpawner": "benchplain"}
    options = {"gpu-docker": {"gpus": 1}, "DockerSpawner": {}}
    with tempfile.TemporaryDirectory() as tmp:
        workbench_args = [
            f"--DockerGPUSpawner.home_volume_template={VOLUME_PREFIX}gpu-home-{{username}}",
            f"--DockerGPUSpawner.checkpoints_volume_template={VOLUME_PREFIX}gpu-ckpt-{{username}}",
            f"--DockerGPUSpawner.datasets_volume={VOLUME_PREFIX}datasets",
        ]
        plain_args = [
            "--JupyterHub.spawner_class=dockerspawner.DockerSpawner",
            "--DockerSpawner.remove=True",
            f"--DockerSpawner.image={args.image}",
        ]
        if args.plain_home_volume:
            plain_args.append(f"--DockerSpawner.volumes={VOLUME_PREFIX}plain-home-{{username}}=/home/jovyan")
        hubs = {
            "gpu-docker": Hub(Path(tmp) / "workbench", env, workbench_args),
            "DockerSpawner": Hub(Path(tmp) / "plain", env, plain_args),
        }
        ready: dict[str, list[float]] = {name: [] for name in BACKENDS}
        answering: dict[str, list[float]] = {name: [] for name in BACKENDS}
        remove_bench_volumes(client)
        try:
            for name, hub in hubs.items():
                hub.data_dir.mkdir()
                hub.start()
                hub.create_users(users[name])
            for run in range(args.runs):
                order = list(BACKENDS) if run % 2 == 0 else list(reversed(BACKENDS))
                for name in order:
                    r, a = spawn_once(hubs[name], client, users[name], options[name])
                    ready[name].append(r)
                    answering[name].append(a)
                print(
                    f"run {run + 1:2d}: ready      gpu-docker {ready['gpu-docker'][-1]:6.2f} s   "
                    f"DockerSpawner {ready['DockerSpawner'][-1]:6.2f} s\n"
                    f"        answering  gpu-docker {answering['gpu-docker'][-1]:6.2f} s   "
                    f"DockerSpawner {answering['DockerSpawner'][-1]:6.2f} s",
                    flush=True,
                )
        finally:
            for hub in hubs.values():
                hub.kill_everything()
            for name in BACKENDS:
                for container in client.containers.list(all=True, filters={"label": f"workbench.user={users[name]}"}):
                    container.remove(force=True)
                with contextlib.suppress(docker.errors.NotFound):
                    client.containers.get(f"jupyter-{users[name]}").remove(force=True)
            remove_bench_volumes(client)
            client.networks.prune(filters={"label": "workbench.hub"})
    print(
        f"\n{args.runs} runs each, interleaved"
        + (", plain DockerSpawner with a home volume" if args.plain_home_volume else "")
    )
    print(summary("ready", ready, " (target <= 1.10)"))
    print(summary("answering", answering))


if __name__ == "__main__":
    main()
