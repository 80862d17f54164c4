"""A Slurm node that dies under a user's server, on the real two-node cluster (tests/slurm/cluster.sh).

One test, as short as Slurm allows: the node's slurmd and the user's job are killed as a power cut
would kill them; slurmctld marks the node DOWN once it has not answered for SlurmdTimeout (30 s in
cluster.sh) and ends its job as NODE_FAIL. Then the hub must close the user's lease with "node
failed", count the dead node's GPUs as neither free nor in use on the spawn form, on the fleet page
and in the sentence a waiting user reads, and name the node's state. The slurmd is started again at
the end (ReturnToService=2 puts the node back as soon as it answers), so the cluster is healthy for
the tests after this one.
"""

from __future__ import annotations

import html
import os
import re
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest
import requests

from tests.conftest import hub_form, native_sign_up, wait_until
from tests.slurm.conftest import CLUSTER, USERS, cancel_all, outside_jobs, service, squeue

pytestmark = [pytest.mark.slurm, pytest.mark.integration]

STATE = Path(os.environ.get("WB_SLURM_STATE", "/var/lib/wb-slurm"))  # cluster.sh's state directory
PASSWORD = "correct-horse-battery"


@pytest.fixture(scope="module")
def hub(slurm_hub):
    hub = slurm_hub(WORKBENCH_SLURM_POLL_SECONDS="1")
    hub.create_users(*USERS[:2])
    return hub


@pytest.fixture(scope="module")
def browser(hub) -> requests.Session:
    """The hub's admin, signed up and logged in as in a browser (the spawn form is a page, not an API)."""
    assert "The signup was successful" in native_sign_up(requests.Session(), hub.url, "admin", PASSWORD)
    session = requests.Session()
    r = hub_form(session, hub.url, "/hub/login", {"username": "admin", "password": PASSWORD})
    assert r.status_code == 302, r.text
    return session


def lease_of(hub, user: str) -> tuple[str, str, str] | None:
    """(GPU UUID, node, ref) of the user's lease, or None."""
    with sqlite3.connect(hub.data_dir / "workbench.sqlite") as db:
        rows = db.execute("SELECT gpu_uuid, node, ref FROM gpu_leases WHERE user = ?", (user,)).fetchall()
    return rows[0] if rows else None


def ended_reasons(hub, user: str) -> list[str]:
    with sqlite3.connect(hub.data_dir / "workbench.sqlite") as db:
        return [r for (r,) in db.execute("SELECT reason FROM gpu_usage WHERE user = ? AND ended IS NOT NULL", (user,))]


def free_text(hub, browser: requests.Session) -> str:
    """The spawn form's "N of M GPUs free now" line, as the browser gets it."""
    r = browser.get(f"{hub.url}/hub/spawn", timeout=30)
    assert r.status_code == 200, r.text[-2000:]
    found = re.search(r'<span id="workbench-free">(.*?)</span>', r.text, re.S)
    assert found, r.text[-3000:]
    return html.unescape(found.group(1))


def pids(matches) -> list[int]:
    """Processes whose (cmdline, environ) ``matches`` accepts."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (proc / "environ").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if matches(cmdline, environ):
            out.append(int(proc.name))
    return out


def kill_node(node: str, job_id: str) -> None:
    """Kill the node's slurmd and the job's processes with SIGKILL, as a power cut would.

    slurmd first, then the job's slurmstepd (alive, it would tell slurmctld the batch script ended
    and the job would end COMPLETED, not NODE_FAIL), then the server it ran."""
    pid_file = STATE / node / "run" / "slurmd.pid"
    slurmd = int(pid_file.read_text().strip())
    assert Path(f"/proc/{slurmd}/comm").read_text().strip() == "slurmd", f"{pid_file} names no slurmd"
    os.kill(slurmd, signal.SIGKILL)
    for pid in pids(lambda cmd, env: cmd.startswith(f"slurmstepd: [{job_id}.")):
        os.kill(pid, signal.SIGKILL)
    for pid in pids(lambda cmd, env: f"SLURM_JOB_ID={job_id}" in env):
        os.kill(pid, signal.SIGKILL)


def test_a_dead_node_leaves_the_free_count_and_the_wait_and_its_lease_closes_as_node_failed(hub, browser):
    user, waiter = USERS[:2]
    # Both nodes up: the form counts every GPU (and reads as the user's browser gets it).
    assert free_text(hub, browser) == "4 of 4 GPUs and 3 of 3 MIG slices free now"
    assert hub.spawn(user, gpus=1).status_code in (201, 202)
    hub.wait_ready(user, 120)
    _uuid, node, ref = lease_of(hub, user)
    job_id = ref.removeprefix("slurm:")
    dead_devices = 2 if node == "wbnode1" else 5  # wbnode2 also has the H200's 3 MIG slices
    outside: list[str] = []
    try:
        kill_node(node, job_id)
        # slurmctld marks the node DOWN after SlurmdTimeout and ends its job as NODE_FAIL; the hub's next poll
        # (1 s) closes the lease with the reason Slurm gave.
        wait_until(
            lambda: lease_of(hub, user) is None, 90, f"the lease on {node} to close after its slurmd died", hub.log
        )
        assert squeue("-t", "all", "-j", job_id, "-o", "%T") == ["NODE_FAIL"]
        assert ended_reasons(hub, user)[-1] == f"node failed: {node}"
        hub.wait_stopped(user, 30)
        # The student reads why on the spawn page: the node, and why Slurm holds it down.
        r = browser.get(f"{hub.url}/hub/spawn/{user}", timeout=30)
        assert r.status_code == 200, r.text[-2000:]
        told = f"The node {node} this server ran on failed (Slurm: down, not responding"
        assert told in html.unescape(r.text), r.text[-3000:]
        assert hub.stop_box(user).startswith(told)

        # The spawn form: the dead node's devices are neither free nor counted among those one may get.
        down = f"node {node} is down, not responding"  # Slurm's state DOWN+NOT_RESPONDING, its reason said once
        usable = "2 of 2 GPUs and 3 of 3 MIG slices" if node == "wbnode1" else "2 of 2 GPUs"
        assert free_text(hub, browser) == f"{usable} free now; {dead_devices} more unavailable ({down})"

        # The fleet page: no free slot on the dead node, with its state and reason; the other node as before.
        gpus = service(hub, "GET", "api/gpus").json()["gpus"]
        dead = [g for g in gpus if g["node"] == node]
        alive = [g for g in gpus if g["node"] != node]
        assert len(dead) == dead_devices, dead
        assert all(g["free_slots"] == 0 for g in dead), dead
        assert all(g["unavailable"] == down for g in dead), dead
        assert all(g["slurm"]["node_state"] == "down+not_responding" for g in dead), dead
        assert all(g["slurm"]["node_reason"] == "Not responding" for g in dead), dead
        assert all(g["unavailable"] is None and g["free_slots"] == 1 for g in alive), alive

        # The wait: the live node's two whole GPUs taken by jobs from outside, a user waits for one.
        outside = outside_jobs(2, 300)
        assert hub.spawn(waiter, gpus=1).status_code == 202
        # Slurm's first word is "None" (not looked at yet), then Resources or ReqNodeNotAvail.
        messages = hub.progress_messages(waiter, until="(Slurm: Re", timeout=40)
        waiting = [m for m in messages if "(Slurm: Re" in m]
        assert waiting, messages
        assert waiting[-1] == (
            "Waiting for 1 GPU: all 2 GPUs that fit are in use (Slurm: Resources), next in line; "
            f"2 more GPUs are on {node}, which takes no jobs now: down, not responding"
        )
    finally:
        if outside:
            subprocess.run(["scancel", *outside])
        cancel_all()
        # Back in service: ReturnToService=2 takes the node back once its slurmd answers (cluster.sh waits).
        done = subprocess.run([str(CLUSTER), "start"], capture_output=True, text=True, timeout=150)
        assert done.returncode == 0, done.stderr[-2000:]
