"""Spawn latency of gpu-slurm against plain batchspawner SlurmSpawner, same batch script, same run.

`benchmarks/spawn_latency.py --backend slurm` runs this. Two real hubs on
the two-node test cluster (`tests/slurm/cluster.sh start`): one with
GPU Workbench's `gpu-slurm` (admission, the tag, Slurm placement followed
in the queue, the job's GPU report, the lease), one with batchspawner's
`SlurmSpawner` as it comes, given the batch script gpu-slurm renders for a
1-GPU server (same #SBATCH lines, same PATH line, no job step). Both send
their jobs to partition `debug` (node wbnode1 only), so plain SlurmSpawner's
server address can be the node's NodeAddr (`state_exechost_exp`): the stock
one, the node name, does not resolve on this host. Spawns are interleaved
with the order flipped every run; each is stopped before the next.

Figure: REST call to `ready`, median of --runs (target ratio <= 1.10).
Needs root (sudo -u as the two bench users) and the cluster running.
"""

from __future__ import annotations

import pwd
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository: tests' hub

from tests.conftest import Hub
from tests.slurm.conftest import hub_env
from workbench_spawner.backends.slurm.sbatch import sbatch_options
from workbench_spawner.backends.slurm.spawner import BATCH_SCRIPT

REPO = Path(__file__).resolve().parent.parent

BACKENDS = ("gpu-slurm", "SlurmSpawner")
USERS = {"gpu-slurm": "benchslurmgpu", "SlurmSpawner": "benchslurmplain"}


def plain_script(user: str) -> str:
    """gpu-slurm's batch script for a 1-GPU server of ``user``, as a fixed template for SlurmSpawner."""
    lines = "".join(f"#SBATCH {o}\n" for o in sbatch_options(user=user, server="", gpus=1, cpus=1, partition="debug"))
    head, _, rest = BATCH_SCRIPT.partition("{% for opt in sbatch_lines %}")
    _, _, rest = rest.partition("{% endfor %}")
    return (head + lines + rest).replace("{{env_bin}}", str(REPO / ".venv" / "bin"))


def spawn_once(hub: Hub, user: str, options: dict) -> float:
    started = time.perf_counter()
    r = hub.spawn(user, **options)
    if r.status_code not in (201, 202):
        raise SystemExit(f"spawn failed: {r.status_code} {r.text}")
    hub.wait_ready(user, timeout=180)
    ready = time.perf_counter() - started
    hub.api("DELETE", f"/users/{user}/server")
    hub.wait_stopped(user, timeout=120)
    return ready


def main(runs: int) -> None:
    for user in USERS.values():
        try:
            pwd.getpwnam(user)
        except KeyError:
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", user], check=True)
    env = hub_env(WORKBENCH_SLURM_PARTITION="debug")
    plain_env = {**env, "PYTHONPATH": str(REPO / "benchmarks")}
    plain_args = [
        "--JupyterHub.spawner_class=plain_slurm_spawner.PlainSlurmSpawner",
        f"--SlurmSpawner.batch_script={plain_script(USERS['SlurmSpawner'])}",
        "--SlurmSpawner.req_srun=",
        "--SlurmSpawner.state_exechost_exp=10.77.0.1",
        f"--SlurmSpawner.batchspawner_singleuser_cmd={REPO / '.venv' / 'bin' / 'batchspawner-singleuser'}",
    ]
    options = {"gpu-slurm": {"gpus": 1}, "SlurmSpawner": {}}
    ready: dict[str, list[float]] = {name: [] for name in BACKENDS}
    with tempfile.TemporaryDirectory() as tmp:
        hubs = {
            "gpu-slurm": Hub(Path(tmp) / "workbench", env, []),
            "SlurmSpawner": Hub(Path(tmp) / "plain", plain_env, plain_args),
        }
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
                    f"run {run + 1:2d}: ready  gpu-slurm {ready['gpu-slurm'][-1]:6.2f} s   "
                    f"SlurmSpawner {ready['SlurmSpawner'][-1]:6.2f} s",
                    flush=True,
                )
        finally:
            for hub in hubs.values():
                hub.kill_everything()
            subprocess.run(["scancel", "-u", ",".join(USERS.values())], capture_output=True)
    med = {k: statistics.median(v) for k, v in ready.items()}
    print(f"\n{runs} runs each, interleaved, 2-node Slurm 22.05 test cluster (partition debug)")
    print(
        f"slurm ready median gpu-slurm {med['gpu-slurm']:.2f} s, SlurmSpawner {med['SlurmSpawner']:.2f} s, "
        f"ratio {med['gpu-slurm'] / med['SlurmSpawner']:.3f} (target <= 1.10)"
    )
