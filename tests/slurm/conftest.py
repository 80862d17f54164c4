"""One real two-node Slurm cluster (tests/slurm/cluster.sh) and one gpu-slurm hub, shared by the Slurm tests.

Starting a cluster and a hub costs seconds each, so the whole module shares
one of each; every test cleans up its own users' servers and jobs. Without
Slurm installed (or not as root) the tests are skipped, and fail under
WORKBENCH_STRICT_TESTS=1.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import requests

from tests.conftest import REPO, hub_pool, let_users_reach, missing, wait_until

CLUSTER = REPO / "tests" / "slurm" / "cluster.sh"
HUB_IP = "10.77.0.1"
USERS = [f"wbslurm{i}" for i in range(1, 8)]  # the 7th signs up in the browser
# The hub's simulated GPUs, in Slurm's index order (cluster.sh): each node takes as many as it has GRES,
# so wbnode1 has the two H100s and wbnode2 the two H100s plus its H200's slices (indices 2-3 the 1g.18gb,
# 4 the 3g.71gb).
SIMULATED = "2xH100-80GB,1xH200-141GB:mig=2x1g.18gb+1x3g.71gb"
WHOLE_GRES = "gpu:h100-80gb:1"  # a whole GPU, by type: a bare gpu:1 could get one of wbnode2's slices


def squeue(*args: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", *args], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if line.strip()]


def our_jobs() -> list[str]:
    """'<id> <state> <node> <comment>' for every job of the test users."""
    return squeue("-u", ",".join(USERS), "-o", "%i %T %N %k")


def jobs_of(user: str) -> list[str]:
    """The workbench's jobs of one user: tagged ``workbench:<hub id>:<user>/<server>``."""
    tag = re.compile(rf" workbench:[0-9a-f]+:{re.escape(user)}/")
    return [line for line in our_jobs() if tag.search(line)]


def job_environment(user: str) -> dict[str, str]:
    """The environment of the user's running single-user server (read from /proc as root)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            raw = (proc / "environ").read_bytes()
        except OSError:
            continue
        env = dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
        if env.get("JUPYTERHUB_USER") == user and env.get("JUPYTERHUB_API_TOKEN") and "SLURM_JOB_ID" in env:
            return env
    raise AssertionError(f"no running server process of {user} found")


def job_record(job_id: str) -> dict[str, str]:
    """Slurm's own record of a job (``scontrol -o show job``), field by field."""
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, check=True).stdout
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def outside_jobs(count: int, seconds: int = 600) -> list[str]:
    """Jobs from outside the workbench (batch jobs of USERS[5]) that hold ``count`` GPUs, running."""
    ids = [
        subprocess.run(
            [
                "sudo",
                "-u",
                USERS[5],
                "sbatch",
                "--parsable",
                f"--gres={WHOLE_GRES}",
                "-c1",
                "--mem=50",
                "-o",
                "/dev/null",
                "--wrap",
                f"sleep {seconds}",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for _ in range(count)
    ]
    wait_until(lambda: len(squeue("-t", "RUNNING", "-u", USERS[5])) == count, 30, "the outside jobs to run")
    return ids


def service(hub, method: str, path: str, **kwargs) -> requests.Response:
    """A call to the workbench service through the hub's proxy, as the hub's admin."""
    return hub.service(method, path, **kwargs)


def stop(hub, user: str, timeout: float = 60) -> None:
    r = hub.api("DELETE", f"/users/{user}/server")
    assert r.status_code in (202, 204), r.text
    hub.wait_stopped(user, timeout)


def cancel_all(timeout: float = 60) -> None:
    """Cancel every job of the test users and wait until Slurm has let go of them (their GPUs are free).

    By job id: ``scancel -u`` takes one user, not a list."""
    ids = [line.split()[0] for line in our_jobs()]
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True)
    deadline = time.monotonic() + timeout
    while our_jobs():
        if time.monotonic() > deadline:
            raise AssertionError(f"the test users' Slurm jobs did not end within {timeout} s: {our_jobs()}")
        time.sleep(0.5)


@pytest.fixture(scope="session")
def slurm_cluster():
    if not shutil.which("slurmctld") or not shutil.which("slurmd") or not shutil.which("munged"):
        missing("Slurm is not installed (apt-get install slurm-wlm munge)")
    if os.geteuid() != 0:
        missing("the Slurm test cluster needs root (munged, slurmctld, two slurmd, mknod)")
    if not shutil.which("sudo"):
        missing("sudo is not installed (batchspawner submits as the user with sudo -u)")
    done = subprocess.run([str(CLUSTER), "start"], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        pytest.fail(f"tests/slurm/cluster.sh start failed:\n{done.stdout}\n{done.stderr}")
    for name in USERS:
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True)
    venv_python = REPO / ".venv" / "bin" / "python"
    let_users_reach(venv_python.resolve(), REPO)
    probe = subprocess.run(
        ["sudo", "-u", USERS[0], str(venv_python), "-c", "import jupyterhub"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        pytest.fail(
            f"the test users cannot run the shared environment {venv_python} (jobs run as the user, "
            f"as on a real cluster): {probe.stderr.strip()[-300:]}. Put the checkout and its Python "
            "where other users can read them (not under /root)."
        )
    cancel_all()
    yield CLUSTER
    cancel_all()


def hub_env(**extra: str) -> dict[str, str]:
    return {
        "WORKBENCH_BACKEND": "slurm",
        "WORKBENCH_SIMULATED_GPUS": SIMULATED,
        "WORKBENCH_HUB_IP": HUB_IP,
        "WORKBENCH_HUB_CONNECT_IP": HUB_IP,
        "WORKBENCH_SLURM_PARTITION": "gpu",
        "WORKBENCH_SLURM_POLL_SECONDS": "2",
        "WORKBENCH_QUEUE_TIMEOUT": "120",
        "WORKBENCH_DEFAULT_MAX_GPUS": "2",
        "WORKBENCH_SLURM_ENV": str(Path(REPO / ".venv")),
        **extra,
    }


@pytest.fixture(scope="module")
def slurm_hub(slurm_cluster, tmp_path_factory):
    """start(**env) -> a gpu-slurm Hub; all hubs of the module stopped, all test jobs cancelled at the end."""
    with hub_pool(tmp_path_factory.mktemp("slurmhub")) as start:
        yield lambda **extra: start(hub_env(**extra))
    cancel_all()
