"""gpu-slurm through the real hub and proxy on the real two-node Slurm cluster (tests/slurm/cluster.sh).

One hub for the module (4 simulated whole GPUs: 2 per node; wbnode2's MIG slices are
test_slurm_slices.py's), tests in the order a
term goes: four users fill the cluster, a fifth waits with Slurm's reason and
starts when one stops, scancel releases within a poll, a hub restart
reattaches, refusals submit nothing, the ledger has every job's time, the
queue timeout cancels the job.
"""

from __future__ import annotations

import sqlite3
import subprocess
import time
from datetime import UTC, datetime, timedelta

import pytest
import requests

from tests.conftest import wait_until
from tests.slurm.conftest import USERS, cancel_all, job_record, jobs_of, our_jobs, outside_jobs, service, squeue, stop

pytestmark = [pytest.mark.slurm, pytest.mark.integration]


@pytest.fixture(scope="module")
def hub(slurm_hub):
    hub = slurm_hub(WORKBENCH_QUEUE_TIMEOUT="40", WORKBENCH_ADMIN_USERS=f"admin,{USERS[6]}")
    hub.create_users(*USERS[:6])
    return hub


def gpus_seen_by(hub, user: str) -> list[str]:
    """The GPUs the user's own GPU monitor shows, read through the proxy."""
    token = hub.user_token(user)
    r = requests.get(f"{hub.url}/user/{user}/api/gpu/metrics", headers={"Authorization": f"token {token}"}, timeout=20)
    assert r.status_code == 200, r.text
    return [g["uuid"] for g in r.json()["gpus"]]


def fleet(hub) -> dict:
    """The fleet view's whole GPUs (wbnode2's MIG slices are test_slurm_slices.py's)."""
    r = service(hub, "GET", "api/gpus")
    assert r.status_code == 200, r.text
    data = r.json()
    return {**data, "gpus": [g for g in data["gpus"] if not g["mig"]]}


def ledger(hub) -> list[tuple]:
    with sqlite3.connect(hub.data_dir / "workbench.sqlite") as db:
        return db.execute("SELECT user, gpu_uuid, node, started, ended, reason FROM gpu_usage").fetchall()


def lease_rows(hub) -> list[tuple]:
    with sqlite3.connect(hub.data_dir / "workbench.sqlite") as db:
        return db.execute("SELECT user, gpu_uuid, node, ref FROM gpu_leases ORDER BY user").fetchall()


def test_four_users_get_four_distinct_gpus_on_two_nodes_and_a_fifth_waits_for_slurm(hub):
    four = USERS[:4]
    for user in four:
        assert hub.spawn(user, gpus=1).status_code in (201, 202)
    servers = {user: hub.wait_ready(user, 120) for user in four}
    rows = lease_rows(hub)
    placed = {(node, uuid) for _user, uuid, node, _ref in rows}
    assert len(rows) == 4, rows
    assert len(placed) == 4, rows
    assert {node for node, _ in placed} == {"wbnode1", "wbnode2"}
    for user, uuid, node, ref in rows:
        # The lease names the node Slurm chose and the job; the UUID is that node's GPU.
        job_id = ref.removeprefix("slurm:")
        assert squeue("-j", job_id, "-o", "%T %N") == [f"RUNNING {node}"]
        assert uuid.startswith(f"GPU-sim-{node}-")
        assert servers[user]["state"]["slurm_node"] == node
        # The user's monitor shows exactly that GPU of that node.
        assert gpus_seen_by(hub, user) == [uuid]

    # The fleet view lists both nodes' GPUs with the holder Slurm placed there; none outside the workbench.
    gpus = fleet(hub)["gpus"]
    held = {(g["node"], g["uuid"]): [h["user"] for h in g["holders"]] for g in gpus}
    assert {(node, uuid) for node, uuid in held} == placed
    assert {tuple(users) for users in held.values()} == {(u,) for u in four}
    assert all(g["slurm"]["allocated"] and not g["slurm"]["held_outside_workbench"] for g in gpus)

    fifth = USERS[4]
    assert hub.spawn(fifth, gpus=1).status_code == 202
    messages = hub.progress_messages(fifth, until="Slurm: Resources", timeout=30)
    waiting = [m for m in messages if "Slurm: Resources" in m]
    assert waiting, messages
    # Nobody else waits: Slurm's reason in words, and the position.
    assert waiting[-1].endswith("Waiting for 1 GPU: all 4 GPUs that fit are in use (Slurm: Resources), next in line")
    assert [line.split()[1] for line in jobs_of(fifth)] == ["PENDING"]

    freed_user = four[0]
    freed = next((node, uuid) for user, uuid, node, _ in rows if user == freed_user)
    stop(hub, freed_user)
    hub.wait_ready(fifth, 60)
    mine = [(node, uuid) for user, uuid, node, _ in lease_rows(hub) if user == fifth]
    assert mine == [freed]
    assert not jobs_of(freed_user)


def test_scancel_releases_the_gpu_within_one_poll(hub):
    user = USERS[1]
    lease = [row for row in lease_rows(hub) if row[0] == user]
    assert lease, lease_rows(hub)
    job_id = lease[0][3].removeprefix("slurm:")
    subprocess.run(["scancel", job_id], check=True)
    # Poll interval 2 s (10 % jitter): the GPU is back within one poll, plus squeue's and the
    # database's own time on a loaded 2-core host.
    began = time.monotonic()
    while time.monotonic() - began < 10 and any(r[0] == user for r in lease_rows(hub)):
        time.sleep(0.1)
    took = time.monotonic() - began
    assert not any(r[0] == user for r in lease_rows(hub)), "scancel did not release the lease"
    assert took < 2.2 + 2.5, f"released {took:.1f} s after scancel: more than one 2 s poll"
    ended = [row for row in ledger(hub) if row[0] == user]
    # An admin's scancel, not the hub's stop: the ledger says so.
    assert ended
    assert ended[-1][5] == f"job cancelled outside the hub: {job_id}"
    assert ended[-1][2] == lease[0][2]
    hub.wait_stopped(user, 30)
    assert hub.stop_box(user) == f"The Slurm job {job_id} running this server was cancelled outside the hub."


def test_hub_restart_reattaches_running_jobs_with_no_double_use(hub):
    before = lease_rows(hub)
    running = {user for user, *_ in before}
    assert len(running) == 3, before
    hub.stop()
    hub.start()
    for user in running:
        assert hub.server(user)["ready"], user
    assert lease_rows(hub) == before
    # The one free GPU goes to a new spawn; the reattached ones are not handed out twice.
    newcomer = USERS[5]
    assert hub.spawn(newcomer, gpus=1).status_code in (201, 202)
    hub.wait_ready(newcomer, 90)
    rows = lease_rows(hub)
    assert len({(node, uuid) for _u, uuid, node, _r in rows}) == len(rows) == 4
    for user in running:
        assert [line.split()[1] for line in jobs_of(user)] == ["RUNNING"]


@pytest.mark.parametrize(
    ("options", "status", "words"),
    [
        ({"gpus": 3}, 403, "allows 2 at once"),
        ({"gpus": -1}, 400, "gpus cannot be negative"),
        ({"gpus": 1, "gpu_model": "B200-192GB"}, 400, "B200-192GB"),
        (
            {"gpus": 1, "partition": "nosuch"},
            400,
            "partition 'nosuch' is not a partition you may use on this cluster; choose one of: debug, gpu.",
        ),
    ],
)
def test_refusals_are_a_sentence_and_submit_nothing(hub, options, status, words):
    user = USERS[1]
    r = hub.spawn(user, **options)
    assert r.status_code == status, r.text
    assert words in r.json()["message"]
    assert r.json()["message"].endswith(".")
    assert not jobs_of(user)
    assert not any(row[0] == user for row in lease_rows(hub))


def slurm_times(job_id: str) -> tuple[datetime, datetime]:
    """StartTime and EndTime of a finished job, from Slurm's own record (kept MinJobAge = 30 s)."""
    fields = job_record(job_id)
    # scontrol prints the machine's local time
    return tuple(datetime.fromisoformat(fields[k]).astimezone(UTC) for k in ("StartTime", "EndTime"))


def utc(text: str) -> datetime:
    value = datetime.fromisoformat(text)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def test_the_ledger_records_each_jobs_time_and_node(hub):
    running = lease_rows(hub)
    assert running
    times = {}
    for user, _uuid, _node, ref in running:
        stop(hub, user)
        times[user] = slurm_times(ref.removeprefix("slurm:"))  # before Slurm forgets the job (MinJobAge)
    assert not lease_rows(hub)
    assert not our_jobs()
    rows = ledger(hub)
    assert {r[0] for r in rows} == set(USERS[:6])
    for _user, uuid, node, started, ended, _reason in rows:
        assert uuid.startswith(f"GPU-sim-{node}-")
        assert utc(started) < utc(ended)
    # The jobs just stopped: the ledger's time is Slurm's run time, give or take the start report.
    for user, uuid, node, _ref in running:
        slurm_start, slurm_end = times[user]
        ((_, _, _, started, ended, reason),) = [r for r in rows if r[0] == user and r[1] == uuid][-1:]
        # Stopped through the API with the hub's admin token (a service), never "job cancelled outside the hub".
        assert reason == "stopped by a service: workbench-admin"
        assert node
        assert timedelta(0) <= utc(started) - slurm_start < timedelta(seconds=20), (started, slurm_start)
        assert abs(utc(ended) - slurm_end) < timedelta(seconds=10), (ended, slurm_end)


def test_queue_timeout_cancels_the_job_and_says_so(hub):
    # Four jobs from outside the workbench hold every GPU.
    outside = outside_jobs(4, 300)
    try:
        # The fleet view tells these apart from the workbench's own, on both nodes; metrics carry the node.
        # (Slurm's node records, which the view reads, follow the jobs by a scheduling pass.)
        gpus = wait_until(
            lambda: (
                lambda g: g if all(x["slurm"]["held_outside_workbench"] and not x["holders"] for x in g) else None
            )(fleet(hub)["gpus"]),
            15,
            "the fleet view to show every GPU held outside the workbench",
        )
        assert len(gpus) == 4
        metrics = requests.get(
            f"{hub.url}/services/workbench/metrics", headers={"Authorization": f"token {hub.token}"}, timeout=20
        ).text
        # Devices per node (prometheus_client writes floats): wbnode2's 2 GPUs and 3 MIG slices.
        for node, devices in (("wbnode1", 2), ("wbnode2", 5)):
            assert f'workbench_gpus{{Hostname="{node}"}} {devices:.1f}' in metrics, metrics
            assert any(
                line.startswith("workbench_gpu_held_outside") and f'Hostname="{node}"' in line and line.endswith(" 1.0")
                for line in metrics.splitlines()
            ), metrics
        user = USERS[2]
        assert hub.spawn(user, gpus=1).status_code == 202
        messages = hub.progress_messages(user, until="cancelled", timeout=70)
        assert any("Slurm: Resources" in m for m in messages), messages
        assert "the job was cancelled" in messages[-1], messages
        assert not jobs_of(user)
        assert hub.server(user) is None
    finally:
        subprocess.run(["scancel", *outside])
        cancel_all()


@pytest.mark.browser
def test_a_person_logs_in_spawns_one_gpu_and_the_status_bar_shows_the_nodes_gpu(hub, chromium_browser):
    from playwright.sync_api import expect

    from tests.browser.test_login_to_lab import log_in, sign_up

    user = USERS[6]
    page = chromium_browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(60_000)
    assert "The signup was successful!" in sign_up(page, hub.url, user)
    log_in(page, hub.url, user)
    page.wait_for_url("**/hub/spawn**")
    page.locator("#workbench-gpus").fill("1")
    page.click("form#spawn_form [type=submit]")
    page.wait_for_url(f"**/user/{user}/lab**", timeout=120_000)
    status = page.locator(".jp-WorkbenchGPU-status .jp-WorkbenchGPU-gpu")
    expect(status).to_have_count(1, timeout=90_000)
    uuid = status.get_attribute("data-uuid")
    (lease,) = [row for row in lease_rows(hub) if row[0] == user]
    _user, leased, node, ref = lease
    # JupyterLab runs inside the user's Slurm job, and its status bar shows that job's GPU on that node.
    assert squeue("-j", ref.removeprefix("slurm:"), "-o", "%T %N %u") == [f"RUNNING {node} {user}"]
    assert uuid == leased
    assert uuid.startswith(f"GPU-sim-{node}-")
    stop(hub, user)
    assert not jobs_of(user)
