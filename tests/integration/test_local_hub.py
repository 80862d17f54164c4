"""A real JupyterHub with the real proxy and the local backend, driven over REST."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from tests.conftest import REPO, process_env

pytestmark = pytest.mark.integration

SIM = {f"gpu{i}": f"GPU-sim-{i:02d}-h100-80gb" for i in range(4)}


def server_pid(hub, user: str) -> int:
    return int(hub.server(user)["state"]["pid"])


def stored_policy_settings(hub) -> dict:
    """What the hub published for the workbench service (spawner/workbench_spawner/policy/settings.py)."""
    import json
    import sqlite3

    with sqlite3.connect(hub.data_dir / "workbench.sqlite") as db:
        (value,) = db.execute("SELECT value FROM workbench_settings WHERE key = 'policy'").fetchone()
    return json.loads(value)


def test_servers_are_pinned_to_their_gpus_and_never_share(running_hub):
    hub = running_hub(
        {"WORKBENCH_SIMULATED_GPUS": "4", "WORKBENCH_PROFILES": "small:1:2G,large:2:4G"},
        ["--GPUSpawnerMixin.default_max_gpus=2"],
    )
    hub.create_users("alice", "bob", "carol")
    assert hub.spawn("alice", gpus=2).status_code in (201, 202)
    assert hub.spawn("bob", user_options={"gpus": 1, "profile": "large"}).status_code in (201, 202)
    assert hub.spawn("carol", gpus=0).status_code in (201, 202)
    for user in ("alice", "bob", "carol"):
        hub.wait_ready(user)

    envs = {user: process_env(server_pid(hub, user)) for user in ("alice", "bob", "carol")}
    alice = envs["alice"]["WORKBENCH_GPUS"].split(",")
    bob = envs["bob"]["WORKBENCH_GPUS"].split(",")
    assert len(alice) == 2
    assert len(bob) == 1
    assert not set(alice) & set(bob)
    assert set(alice + bob) <= set(SIM.values())
    for user in ("alice", "bob"):
        assert envs[user]["CUDA_VISIBLE_DEVICES"] == envs[user]["WORKBENCH_GPUS"]
    # The resource profile reaches the server (the local backend passes it on; docker enforces it).
    assert (envs["alice"]["MEM_LIMIT"], envs["alice"]["CPU_LIMIT"]) == (str(2 << 30), "1.0")
    assert (envs["bob"]["MEM_LIMIT"], envs["bob"]["CPU_LIMIT"]) == (str(4 << 30), "2.0")
    # A CPU-only server is told it has no GPU and sees none.
    assert envs["carol"]["WORKBENCH_GPUS"] == ""
    assert envs["carol"]["CUDA_VISIBLE_DEVICES"] == ""
    assert hub.leases() == {"alice": sorted(alice), "bob": bob}
    # The service reads the settings the hub resolved, command line included.
    assert stored_policy_settings(hub)["default_quota"]["max_gpus"] == 2

    # The server answers through the proxy with the user's own token.
    token = hub.user_token("alice")
    r = requests.get(f"{hub.url}/user/alice/api/status", headers={"Authorization": f"token {token}"}, timeout=10)
    assert r.status_code == 200, r.text

    # Stopping gives the GPUs back.
    assert hub.api("DELETE", "/users/alice/server").status_code in (202, 204)
    hub.wait_stopped("alice")
    assert hub.leases() == {"bob": bob}


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"gpus": "two"}, 400, "gpus must be a whole number"),
        ({"gpus": -1}, 400, "cannot be negative"),
        ({"gpus": 1.5}, 400, "whole number of GPUs"),
        ({"gpus": 5}, 400, "asked for 5 GPUs but this hub has only 4"),
        ({"gpus": 2}, 403, "the default quota allows 1 at once"),
        ({"gpus": 1, "gpu_model": "V100"}, 400, "unknown gpu_model"),
        ({"gpus": 1, "colour": "red"}, 400, "unknown spawn option"),
        ({"gpus": 1, "profile": "large"}, 400, "this hub does not offer a choice of resource profiles"),
    ],
)
def test_bad_spawn_requests_get_a_readable_4xx(running_hub_module, body, status, message):
    hub = running_hub_module
    r = hub.spawn("dave", **body)
    assert r.status_code == status, r.text
    assert message in r.json()["message"]
    assert hub.leases().get("dave") is None
    assert hub.server("dave") is None


@pytest.fixture(scope="module")
def running_hub_module(tmp_path_factory):
    from tests.conftest import Hub

    hub = Hub(tmp_path_factory.mktemp("hub"), {"WORKBENCH_SIMULATED_GPUS": "4"}, [])
    hub.start()
    hub.create_users("dave")
    yield hub
    hub.kill_everything()


def test_full_hub_queues_in_order_then_times_out(running_hub):
    hub = running_hub(
        {"WORKBENCH_SIMULATED_GPUS": "2", "WORKBENCH_QUEUE_TIMEOUT": "60"},
        ["--GPUSpawnerMixin.gpu_queue_recheck_interval=0.5"],
    )
    hub.create_users("u1", "u2", "w1", "w2")
    for user in ("u1", "u2"):
        hub.spawn(user, gpus=1)
    for user in ("u1", "u2"):
        hub.wait_ready(user)
    first = hub.leases()
    assert sorted(first["u1"] + first["u2"]) == [SIM["gpu0"], SIM["gpu1"]]

    # Both GPUs are taken: w1 then w2 wait in line, and the spawn page says so.
    assert hub.spawn("w1", gpus=1).status_code == 202
    assert "you are next in line" in hub.progress_messages("w1", until="next in line")[-1]
    assert hub.spawn("w2", gpus=1).status_code == 202
    assert "1 ahead of you" in hub.progress_messages("w2", until="ahead of you")[-1]

    # One GPU frees up: the first in line gets it, not the second.
    hub.api("DELETE", "/users/u1/server")
    hub.wait_ready("w1")
    assert hub.server("w2")["pending"] == "spawn"
    # w1 holds exactly the GPU u1 gave back; w2, still in line, holds nothing.
    assert hub.leases() == {"u2": first["u2"], "w1": first["u1"]}


def test_queue_timeout_gives_a_clear_error(running_hub):
    hub = running_hub({"WORKBENCH_SIMULATED_GPUS": "1", "WORKBENCH_QUEUE_TIMEOUT": "3"})
    hub.create_users("holder", "late")
    hub.spawn("holder", gpus=1)
    hub.wait_ready("holder")
    # The timeout is shorter than the hub's slow-spawn wait (10 s), so the
    # REST call itself answers with the reason.
    r = hub.spawn("late", gpus=1)
    assert r.status_code == 503, r.text
    assert "No 1 GPU became free within 3 seconds" in r.json()["message"]
    assert "CPU-only server (0 GPUs)" in r.json()["message"]
    hub.wait_stopped("late", timeout=30)
    assert set(hub.leases()) == {"holder"}


def test_a_server_that_dies_releases_its_gpu_on_poll(running_hub):
    hub = running_hub({"WORKBENCH_SIMULATED_GPUS": "1"}, ["--Spawner.poll_interval=2"])
    hub.create_users("crash", "next")
    hub.spawn("crash", gpus=1)
    hub.wait_ready("crash")
    os.kill(server_pid(hub, "crash"), signal.SIGKILL)
    hub.wait_stopped("crash", timeout=30)
    assert hub.leases() == {}
    hub.spawn("next", gpus=1)
    hub.wait_ready("next")
    assert hub.leases() == {"next": [SIM["gpu0"]]}


def test_hub_restart_loses_nothing(running_hub):
    hub = running_hub({"WORKBENCH_SIMULATED_GPUS": "2"}, ["--GPUSpawnerMixin.gpu_queue_recheck_interval=0.5"])
    hub.create_users("alice", "bob", "carol")
    hub.spawn("alice", gpus=1)
    hub.wait_ready("alice")
    alice_pid = server_pid(hub, "alice")
    before = hub.leases()
    assert list(before) == ["alice"]
    assert len(before["alice"]) == 1
    (free,) = {SIM["gpu0"], SIM["gpu1"]} - set(before["alice"])
    token = hub.user_token("alice")

    # bob is in the middle of starting when the hub goes down: he holds the
    # other GPU, his server is not up yet.
    def spawn_bob():
        with contextlib.suppress(requests.ConnectionError):  # the hub goes down under the request, as it should here
            hub.spawn("bob", gpus=1)

    spawning = threading.Thread(target=spawn_bob)
    spawning.start()
    deadline = time.monotonic() + 30
    while "bob" not in hub.leases() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hub.leases() == {"alice": before["alice"], "bob": [free]}
    hub.stop()
    spawning.join()
    # Whatever bob's start had got to, it does not survive the hub's absence.
    for pid in set(hub.server_pids()) - {alice_pid}:
        os.kill(pid, signal.SIGKILL)
    # The first start knew one account (the admin); this one finds the users in the hub's database, and
    # the local backend's banner says what that means (workbench_hub/accounts.py counts them).
    first_log = hub.log()
    assert "can use this hub" not in first_log
    hub.start()
    assert "WARNING: 4 accounts can use this hub (admin, alice, bob, carol)," in hub.log()[len(first_log) :]

    hub.wait_ready("alice")
    assert server_pid(hub, "alice") == alice_pid, "alice's server was not restarted"
    r = requests.get(f"{hub.url}/user/alice/api/status", headers={"Authorization": f"token {token}"}, timeout=10)
    assert r.status_code == 200, r.text
    # alice kept her GPU; bob's half-started lease was released, and his server is gone.
    deadline = time.monotonic() + 30
    while hub.leases() != before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert hub.leases() == before
    assert hub.server("bob") is None

    # The freed GPU is handed out again, once: bob gets it, carol waits in line.
    assert hub.spawn("bob", gpus=1).status_code in (201, 202)
    hub.wait_ready("bob")
    assert process_env(server_pid(hub, "bob"))["WORKBENCH_GPUS"] == free
    assert hub.spawn("carol", gpus=1).status_code == 202
    assert "you are next in line" in hub.progress_messages("carol", until="next in line")[-1]
    assert hub.leases() == {"alice": before["alice"], "bob": [free]}


@pytest.mark.parametrize(
    ("env", "args", "message"),
    [
        # A typo in WORKBENCH_PROFILES stops `make run` at once instead of failing spawns later.
        (
            {"WORKBENCH_PROFILES": "small:1:2G,big:lots:16G"},
            [],
            "GPU Workbench: WORKBENCH_PROFILES: resource profile 'big': cpu_limit must be a number of cores",
        ),
        ({"WORKBENCH_PORT": "80a"}, [], "GPU Workbench: WORKBENCH_PORT must be a port number, not '80a'"),
        # Found when the policy's settings are resolved, after the local config file.
        ({"WORKBENCH_SIMULATED_GPUS": "lots"}, [], "GPU Workbench: WORKBENCH_SIMULATED_GPUS: cannot read 'lots'"),
        ({}, ["--GPUSpawnerMixin.simulated_gpus=100"], "GPU Workbench: WORKBENCH_SIMULATED_GPUS=100: at most 64"),
        # Where SSH forwards may lead, checked on the final config (docs/ssh.md, "Where forwards lead").
        (
            {"WORKBENCH_SSH_PERMIT_OPEN": "db.internal"},
            [],
            "GPU Workbench: WORKBENCH_SSH_PERMIT_OPEN: 'db.internal' has no port: write host:port",
        ),
        (
            {},
            ["--GPUSpawnerMixin.ssh_permit_open=db.internal:http"],
            "GPU Workbench: ssh_permit_open: in 'db.internal:http' the port must be a number from 1 to 65535 or *",
        ),
        # The docker backend's lock-down, checked on the final config (no engine is asked: both addresses given).
        (
            {
                "WORKBENCH_BACKEND": "docker",
                "WORKBENCH_IMAGE": "x",
                "WORKBENCH_HUB_IP": "127.0.0.1",
                "WORKBENCH_HUB_CONNECT_IP": "127.0.0.1",
            },
            ["--DockerGPUSpawner.network_name=host"],
            "GPU Workbench: c.DockerGPUSpawner.network_name is 'host'",
        ),
    ],
)
def test_bad_settings_stop_the_hub_with_a_message(tmp_path, env, args, message):
    env = {**os.environ, "WORKBENCH_DATA_DIR": str(tmp_path), "WORKBENCH_SIMULATED_GPUS": "2", **env}
    r = subprocess.run(
        [str(Path(sys.executable).parent / "jupyterhub"), "-f", str(REPO / "hub" / "jupyterhub_config.py"), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert message in r.stderr
    assert "GPU Workbench: GPU Workbench:" not in r.stderr
    assert "Traceback" not in r.stderr
