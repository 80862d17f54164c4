"""MIG slices on the real two-node Slurm cluster (tests/slurm/cluster.sh), through the real hub and proxy.

wbnode2 has, besides its two whole H100s (GRES indices 0-1), an H200 laid out as two ``1g.18gb``
slices (indices 2-3) and one ``3g.71gb`` (index 4), each a GRES of its profile's type, as a site writes
gres.conf by hand. The hub's simulated spec (conftest.SIMULATED) lists the same devices in the same
order, so the node's report names index 2 ``MIG-sim-wbnode2-02-h200-141gb-0-1g.18gb`` and so on.

Tests in order: two users get the two 1g.18gb slices of one GPU, each pinned to exactly the MIG UUID
the node reported for the index Slurm gave its job; a third waits in Slurm's queue with Slurm's reason
and gets the slice freed when one stops; the ledger charges a slice-hour as 1/7 of a GPU-hour; a
profile no node has is refused with a sentence and submits nothing; a quota of slices only refuses a
whole GPU and picks a slice for a plain request.
"""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

import pytest
import requests

from tests.conftest import wait_until
from tests.slurm.conftest import USERS, job_environment, job_record, jobs_of, squeue, stop
from workbench_spawner.backends.slurm.records import parse_gres

pytestmark = [pytest.mark.slurm, pytest.mark.integration]

SLICE = "1g.18gb"


def slice_uuid(index: int) -> str:
    """The MIG UUID wbnode2 reports for Slurm's GRES index 2 or 3: the H200's first or second slice."""
    return f"MIG-sim-wbnode2-02-h200-141gb-{index - 2}-{SLICE}"


@pytest.fixture(scope="module")
def hub(slurm_hub):
    hub = slurm_hub(WORKBENCH_QUEUE_TIMEOUT="90")
    hub.create_users(*USERS[:5])
    return hub


def leases(hub) -> dict[str, tuple[str, str, str, float]]:
    """user -> (MIG UUID, node, job id, share) of every lease."""
    with sqlite3.connect(hub.data_dir / "workbench.sqlite") as db:
        rows = db.execute("SELECT user, gpu_uuid, node, ref, share FROM gpu_leases").fetchall()
    return {user: (uuid, node, ref.removeprefix("slurm:"), share) for user, uuid, node, ref, share in rows}


def gres_index(job_id: str) -> tuple[str, list[int]]:
    """(GRES type, indices) Slurm gave the running job, from its own detail (``scontrol show job -d``)."""
    text = subprocess.run(["scontrol", "show", "job", "-d", job_id], capture_output=True, text=True, check=True).stdout
    (detail,) = [f.removeprefix("GRES=") for f in text.split() if f.startswith("GRES=gpu")]
    ((kind, _count, indices),) = parse_gres(detail)
    return kind, indices


def fleet(hub) -> list[dict]:
    """Every GPU and slice of the workbench service's fleet view."""
    r = hub.service("GET", "api/gpus")
    assert r.status_code == 200, r.text
    return r.json()["gpus"]


def kernel_environment(hub, user: str) -> dict[str, str]:
    """The environment a kernel of the user's server starts with: what the user's own code sees.

    Read from /proc as root. Not the server's own /proc environ: that is the batch script's, from before
    the job's start-up (workbench-slurm-singleuser) set its GPUs in the server's environment."""
    url = f"{hub.url}/user/{user}/api/kernels"
    headers = {"Authorization": f"token {hub.user_token(user)}"}
    r = requests.post(url, json={}, headers=headers, timeout=30)
    assert r.status_code == 201, r.text
    kernel = r.json()["id"]

    def find() -> dict[str, str] | None:
        for proc in Path("/proc").iterdir():
            try:
                if kernel not in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    continue
                raw = (proc / "environ").read_bytes().decode(errors="replace")
            except OSError:
                continue
            return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)
        return None

    try:
        return wait_until(find, 30, f"a kernel of {user}'s server")
    finally:
        requests.delete(f"{url}/{kernel}", headers=headers, timeout=30)


def test_two_users_get_the_two_slices_of_one_gpu_pinned_to_the_mig_uuids_of_their_indices(hub):
    two = USERS[:2]
    for user in two:
        assert hub.spawn(user, gpus=1, gpu_profile=SLICE).status_code in (201, 202)
    for user in two:
        hub.wait_ready(user, 120)
    held = leases(hub)
    assert sorted(held) == sorted(two), held
    seen = set()
    for user in two:
        uuid, node, job_id, share = held[user]
        job = job_record(job_id)
        assert job["JobState"] == "RUNNING"
        assert job["NodeList"] == "wbnode2"
        assert job["TresPerNode"] == f"gres:gpu:{SLICE}:1"  # a GRES of the profile's type
        kind, indices = gres_index(job_id)
        assert kind == SLICE, (kind, indices)
        assert len(indices) == 1, (kind, indices)
        assert indices[0] in (2, 3), (kind, indices)
        # The lease names exactly the slice the node reported for the index Slurm gave the job.
        assert node == "wbnode2"
        assert uuid == slice_uuid(indices[0])
        assert share == pytest.approx(1 / 7)
        assert job_environment(user)["SLURM_JOB_GPUS"] == str(indices[0])
        # The user's code sees the slice by its MIG UUID only: CUDA would read Slurm's bare index as a whole GPU.
        env = kernel_environment(hub, user)
        assert env["WORKBENCH_GPUS"] == uuid
        assert env["CUDA_VISIBLE_DEVICES"] == uuid
        seen.add(uuid)
    assert seen == {slice_uuid(2), slice_uuid(3)}

    gpus = {g["uuid"]: g for g in fleet(hub)}
    for user in two:
        row = gpus[held[user][0]]
        assert row["mig"]
        assert row["profile"] == SLICE
        assert row["node"] == "wbnode2"
        assert row["parent_uuid"] == "GPU-sim-wbnode2-02-h200-141gb"
        assert [h["user"] for h in row["holders"]] == [user]
        assert row["slurm"]["allocated"]


def test_a_third_waits_in_slurms_queue_for_a_slice_then_gets_the_one_freed(hub):
    third = USERS[2]
    assert hub.spawn(third, gpus=1, gpu_profile=SLICE).status_code == 202
    messages = hub.progress_messages(third, until="Slurm: Resources", timeout=40)
    waiting = [m for m in messages if "Slurm: Resources" in m]
    assert waiting, messages
    assert waiting[-1].endswith(
        f"Waiting for 1 {SLICE} slice: all 2 {SLICE} slices that fit are in use (Slurm: Resources), next in line"
    )
    (line,) = jobs_of(third)
    assert line.split()[1] == "PENDING"
    assert squeue("-j", line.split()[0], "-o", "%b") == [f"gres:gpu:{SLICE}:1"]
    # The whole GPUs and the 3g.71gb slice are free: a slice request waits for its own profile only.
    assert not any(g["holders"] for g in fleet(hub) if g["profile"] != SLICE)

    first = USERS[0]
    freed = leases(hub)[first][0]
    stop(hub, first)
    hub.wait_ready(third, 90)
    uuid, node, job_id, _share = leases(hub)[third]
    assert (uuid, node) == (freed, "wbnode2")
    assert uuid == slice_uuid(gres_index(job_id)[1][0])
    assert kernel_environment(hub, third)["WORKBENCH_GPUS"] == freed


def test_the_ledger_charges_a_slice_hour_as_a_seventh_of_a_gpu_hour(hub):
    with sqlite3.connect(hub.data_dir / "workbench.sqlite") as db:
        rows = db.execute("SELECT user, gpu_uuid, share FROM gpu_usage WHERE user = ?", (USERS[0],)).fetchall()
    assert rows, rows
    assert all(uuid.startswith("MIG-sim-wbnode2-") for _u, uuid, _s in rows), rows
    assert all(share == pytest.approx(1 / 7) for _u, _uuid, share in rows), rows
    for user in (USERS[1], USERS[2]):
        stop(hub, user)
    assert not leases(hub)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"gpus": 1, "gpu_profile": "2g.35gb"}, "this hub has no MIG slices of '2g.35gb'"),
        ({"gpus": 2, "gpu_profile": "1g.18gb"}, "a server gets one MIG slice at most, not 2 slices of 1g.18gb"),
    ],
)
def test_a_slice_no_node_has_is_a_sentence_and_submits_nothing(hub, options, words):
    user = USERS[3]
    r = hub.spawn(user, **options)
    assert r.status_code == 400, r.text
    assert words in r.json()["message"], r.text
    assert r.json()["message"].endswith("."), r.text
    assert not jobs_of(user)
    assert user not in leases(hub)


def test_a_quota_of_slices_only_refuses_a_whole_gpu_and_picks_a_slice(hub):
    user = USERS[4]
    assert hub.api("POST", "/groups/students").status_code in (201, 409)
    assert hub.api("POST", "/groups/students/users", json={"users": [user]}).status_code == 200
    quota = {"max_gpus": 1, "whole_gpus": False, "allowed_profiles": [SLICE]}
    assert hub.service("PUT", "api/quotas/groups/students", json=quota).status_code == 200
    r = hub.spawn(user, gpus=1, gpu_model="H100-80GB")
    assert r.status_code == 403, r.text
    assert "group students allows no whole GPUs" in r.json()["message"], r.text
    assert not jobs_of(user)
    # A plain request is a slice the quota allows, submitted as its GRES type.
    assert hub.spawn(user, gpus=1).status_code in (201, 202)
    hub.wait_ready(user, 120)
    uuid, node, job_id, _share = leases(hub)[user]
    assert job_record(job_id)["TresPerNode"] == f"gres:gpu:{SLICE}:1"
    assert uuid == slice_uuid(gres_index(job_id)[1][0])
    assert node == "wbnode2"
    stop(hub, user)
    assert not jobs_of(user)
