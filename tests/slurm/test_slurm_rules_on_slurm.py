"""gpu-slurm's rules on the real two-node cluster, beyond the common path of test_slurm_hub.py.

One hub (4 simulated GPUs, 2 per node; fair-share order; a test clock for reservations; every server
the "small" profile of 2 CPUs and 300 MiB), tests in order:

1. a job carries what admission decided (profile, session limit, GPU model, tag, no requeue), and its
   start report can set only its port and GPUs: batchspawner's handler would let the job rewrite the
   command the hub runs to cancel it;
2. a CPU-only server runs as a job with no GPU and no lease;
3. system accounts, names with no Unix account and partitions users may not pick submit nothing;
4. a spawn cancelled while Slurm keeps its job pending leaves no job behind;
5. fair share: of two users waiting in Slurm's queue, the one with fewer GPU-hours runs first;
6. a reservation holds a non-member back before submitting, lets a member in, and lets go when deleted.
"""

from __future__ import annotations

import subprocess
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests

from tests.conftest import wait_until
from tests.slurm.conftest import (
    USERS,
    cancel_all,
    job_environment,
    job_record,
    jobs_of,
    outside_jobs,
    service,
    squeue,
    stop,
)
from workbench_spawner.ledger.store import AllocationStore, UsageRow
from workbench_spawner.policy.clock import set_test_clock

pytestmark = [pytest.mark.slurm, pytest.mark.integration]

TUE = datetime(2026, 12, 8, tzinfo=UTC)


@pytest.fixture(scope="module")
def hub(slurm_hub, tmp_path_factory):
    clock = tmp_path_factory.mktemp("clock") / "now"
    set_test_clock(clock, TUE.replace(hour=9))
    hub = slurm_hub(
        WORKBENCH_QUEUE_ORDER="fair-share",
        WORKBENCH_TEST_CLOCK_FILE=str(clock),
        WORKBENCH_TIME_ZONE="UTC",
        WORKBENCH_QUEUE_TIMEOUT="90",
        WORKBENCH_PROFILES="small:2:300M",
        WORKBENCH_RESERVATION_CHECK_SECONDS="0",
        WORKBENCH_SLURM_POLL_SECONDS="1",
        WORKBENCH_SLURM_PARTITIONS="gpu",
    )
    hub.clock = clock
    hub.create_users(*USERS[:6], "daemon", "wbnoaccount")
    assert hub.api("POST", "/groups/ml-course").status_code in (201, 409)
    assert hub.api("POST", "/groups/ml-course/users", json={"users": [USERS[3]]}).status_code == 200
    return hub


def states(user: str) -> list[str]:
    return [line.split()[1] for line in jobs_of(user)]


def test_the_job_carries_what_admission_decided_and_its_report_sets_nothing_else(hub):
    user = USERS[0]
    r = service(hub, "PUT", f"api/quotas/users/{user}", json={"max_gpus": 2, "max_session_hours": 0.5})
    assert r.status_code == 200, r.text
    assert hub.spawn(user, gpus=1, gpu_model="H100-80GB").status_code in (201, 202)
    hub.wait_ready(user, 120)
    (line,) = jobs_of(user)
    job = job_record(line.split()[0])
    assert job["JobState"] == "RUNNING"
    assert job["TimeLimit"] == "00:30:00"
    assert job["NumCPUs"] == "2"
    assert job["MinMemoryNode"] == "300M"
    assert job["Requeue"] == "0"
    assert job["TresPerNode"] == "gres:gpu:h100-80gb:1"
    hub_id = job["Comment"].split(":")[1]
    assert job["Comment"] == f"workbench:{hub_id}:{user}/"
    assert len(hub_id) == 8

    # The job's own server token, as a user inside the job holds it.
    env = job_environment(user)
    url = env["JUPYTERHUB_API_URL"].rstrip("/") + "/batchspawner"
    marker = Path("/tmp") / f"wb-pwned-{uuid.uuid4().hex}"
    evil = {"exec_prefix": "", "batch_cancel_cmd": f"touch {marker}", "port": 1}
    r = requests.post(url, json=evil, headers={"Authorization": f"token {env['JUPYTERHUB_API_TOKEN']}"}, timeout=20)
    assert r.status_code == 400, r.text
    assert "may carry only port and workbench_report; refused: batch_cancel_cmd, exec_prefix" in r.json()["message"]
    r = requests.post(
        url, json={"port": 1}, headers={"Authorization": f"token {env['JUPYTERHUB_API_TOKEN']}"}, timeout=20
    )
    assert r.status_code == 409, r.text
    assert "not starting" in r.json()["message"], r.text
    r = requests.post(url, json={"port": 1}, headers={"Authorization": f"token {hub.user_token(user)}"}, timeout=20)
    assert r.status_code == 403, r.text
    assert "only a server's own start-up" in r.json()["message"], r.text
    assert hub.server(user)["ready"]  # still served on its real port

    stop(hub, user)
    assert not jobs_of(user)
    assert not marker.exists(), "the job made the hub run a command of its choosing"


def test_a_cpu_only_server_is_a_job_with_no_gpu_and_no_lease(hub):
    user = USERS[1]
    assert hub.spawn(user, gpus=0).status_code in (201, 202)
    hub.wait_ready(user, 120)
    (line,) = jobs_of(user)
    assert line.split()[1] == "RUNNING"
    assert squeue("-j", line.split()[0], "-o", "%b") == ["N/A"]  # no GRES asked for
    assert job_environment(user)["WORKBENCH_GPUS"] == ""
    leases = service(hub, "GET", "api/allocations").json()["allocations"]
    assert not [a for a in leases if a["user"] == user]
    stop(hub, user)
    assert not jobs_of(user)


@pytest.mark.parametrize(
    ("user", "options", "status", "words"),
    [
        ("daemon", {}, 403, "'daemon' is a system account (uid 1), and Slurm jobs never run as one"),
        ("wbnoaccount", {}, 403, "there is no Unix account named 'wbnoaccount' on the hub's host"),
        # the cluster has "debug" too, but this hub lets users pick only "gpu"
        (
            USERS[1],
            {"partition": "debug"},
            400,
            "partition 'debug' is not a partition you may use on this cluster; choose one of: gpu.",
        ),
    ],
)
def test_refused_accounts_and_partitions_submit_nothing(hub, user, options, status, words):
    before = squeue("-o", "%i")
    r = hub.spawn(user, gpus=1, **options)
    assert r.status_code == status, r.text
    assert words in r.json()["message"]
    # nothing was submitted, as that user or any other (earlier jobs may still leave the queue)
    assert not set(squeue("-o", "%i")) - set(before)
    assert hub.server(user) is None


def test_a_spawn_cancelled_while_its_job_is_pending_leaves_no_job(hub):
    held = outside_jobs(4)
    try:
        user = USERS[2]
        assert hub.spawn(user, gpus=1).status_code == 202
        wait_until(lambda: states(user) == ["PENDING"], 30, "the job to be pending")
        assert hub.api("DELETE", f"/users/{user}/server").status_code in (202, 204)
        wait_until(lambda: not jobs_of(user), 15, "the pending job to be cancelled")
        hub.wait_stopped(user, 30)
        leases = service(hub, "GET", "api/allocations").json()["allocations"]
        assert not [a for a in leases if a["user"] == user]
    finally:
        subprocess.run(["scancel", *held])


def test_fair_share_runs_the_lighter_user_first_in_slurms_queue(hub):
    heavy, light = USERS[4], USERS[0]
    store = AllocationStore(f"sqlite:///{hub.data_dir / 'workbench.sqlite'}")
    try:
        now = datetime.now(UTC)
        with store.writes().begin() as session:  # heavy used one GPU for 20 hours this week
            session.add(
                UsageRow(
                    gpu_uuid="GPU-sim-wbnode1-00-h100-80gb",
                    user=heavy,
                    server="",
                    node="wbnode1",
                    started=now - timedelta(hours=21),
                    ended=now - timedelta(hours=1),
                    reason="stopped",
                )
            )
    finally:
        store.dispose()
    held = outside_jobs(4)
    try:
        assert hub.spawn(heavy, gpus=1).status_code == 202
        wait_until(lambda: states(heavy) == ["PENDING"], 30, "heavy's job to be pending")
        assert hub.spawn(light, gpus=1).status_code == 202
        wait_until(lambda: states(light) == ["PENDING"], 30, "light's job to be pending")
        messages = hub.progress_messages(heavy, until="who used less is ahead", timeout=30)
        assert "you used 20.0 GPU-hours this week; 1 user who used less is ahead" in messages[-1], messages

        def priority(user: str) -> int:
            (line,) = jobs_of(user)
            return int(squeue("-j", line.split()[0], "-o", "%Q")[0])

        wait_until(lambda: priority(light) > priority(heavy), 15, "Slurm to rank the lighter user first")
        subprocess.run(["scancel", held[0]], check=True)
        hub.wait_ready(light, 60)
        assert states(heavy) == ["PENDING"], "the heavier user came first but must wait"
        stop(hub, light)
        hub.wait_ready(heavy, 60)
        stop(hub, heavy)
    finally:
        subprocess.run(["scancel", *held])
        cancel_all()


def test_a_reservation_holds_non_members_back_before_they_submit(hub):
    r = service(
        hub, "POST", "api/reservations", json={"group": "ml-course", "gpus": 3, "window": "2026-12-08 10:00-12:00"}
    )
    assert r.status_code == 201, r.text
    rid = r.json()["id"]
    set_test_clock(hub.clock, TUE.replace(hour=10, minute=5))
    outsider, waiter, member = USERS[0], USERS[1], USERS[3]
    try:
        # 4 free, 3 kept for ml-course: one non-member gets one.
        assert hub.spawn(outsider, gpus=1).status_code in (201, 202)
        hub.wait_ready(outsider, 120)
        # The next non-member waits in the hub, with nothing pending in Slurm that could take a member's GPU.
        # (201 or 202: after an earlier refused spawn of the same user, JupyterHub 6.1 answers 201 for a
        # spawn that is still pending.)
        assert hub.spawn(waiter, gpus=1).status_code in (201, 202)
        messages = hub.progress_messages(waiter, until="outside reserved ones", timeout=30)
        assert "3 free in the cluster, but 3 of 4 GPUs reserved for ml-course until 12:00" in messages[-1], messages
        assert not jobs_of(waiter)
        assert not hub.server(waiter)["ready"]
        # A member goes straight to Slurm.
        assert hub.spawn(member, gpus=1).status_code in (201, 202)
        hub.wait_ready(member, 120)
        assert not jobs_of(waiter)
        # The reservation deleted, the waiting non-member submits and runs.
        assert service(hub, "DELETE", f"api/reservations/{rid}").status_code in (200, 204)
        hub.wait_ready(waiter, 90)
        for user in (outsider, waiter, member):
            assert states(user) == ["RUNNING"]
    finally:
        for user in (outsider, waiter, member):
            if hub.server(user) is not None:
                stop(hub, user)
        cancel_all()
