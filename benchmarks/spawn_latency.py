"""Spawn latency of the gpu-docker backend against plain DockerSpawner.

Two real hubs run side by side from the same config and image: one with
GPU Workbench's docker backend (GPU lease, device request, labels, lock-down),
one with `dockerspawner.DockerSpawner` as it comes. Spawns are interleaved
(A, B, A, B, ...) so both see the same machine load; each is timed from the
REST call to the server reporting `ready`, then stopped. Prints the medians
and their ratio (target: at most 1.10).

    .venv/bin/python benchmarks/spawn_latency.py [--runs 10] [--image gpu-workbench/singleuser:test]

Needs a running Docker engine with the image built (`make test-images`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.conftest import Hub  # noqa: E402


def spawn_once(hub: Hub, user: str, options: dict) -> float:
    started = time.perf_counter()
    r = hub.spawn(user, **options)
    if r.status_code not in (201, 202):
        raise SystemExit(f"spawn failed: {r.status_code} {r.text}")
    hub.wait_ready(user, timeout=300)
    elapsed = time.perf_counter() - started
    hub.api("DELETE", f"/users/{user}/server")
    hub.wait_stopped(user, timeout=120)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--image", default="gpu-workbench/singleuser:test")
    args = parser.parse_args()

    env = {"WORKBENCH_BACKEND": "docker", "WORKBENCH_IMAGE": args.image, "WORKBENCH_SIMULATED_GPUS": "4"}
    with tempfile.TemporaryDirectory() as tmp:
        ours = Hub(Path(tmp) / "workbench", env, [])
        plain = Hub(Path(tmp) / "plain", env, ["--JupyterHub.spawner_class=dockerspawner.DockerSpawner",
                                                "--DockerSpawner.remove=True", f"--DockerSpawner.image={args.image}"])
        for hub in (ours, plain):
            hub.data_dir.mkdir()
            hub.start()
        ours.create_users("bench-gpu")
        plain.create_users("bench-plain")
        times: dict[str, list[float]] = {"gpu-docker": [], "DockerSpawner": []}
        try:
            for run in range(args.runs):
                a = spawn_once(ours, "bench-gpu", {"gpus": 1})
                b = spawn_once(plain, "bench-plain", {})
                times["gpu-docker"].append(a)
                times["DockerSpawner"].append(b)
                print(f"run {run + 1:2d}: gpu-docker {a:6.2f} s   DockerSpawner {b:6.2f} s", flush=True)
        finally:
            for hub in (ours, plain):
                hub.kill_everything()
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\nmedian of {args.runs}: gpu-docker {med['gpu-docker']:.2f} s, "
          f"DockerSpawner {med['DockerSpawner']:.2f} s, ratio {med['gpu-docker'] / med['DockerSpawner']:.3f} "
          "(target <= 1.10)")


if __name__ == "__main__":
    main()
