"""The gpu-docker backend on a real Docker Engine: a real hub spawns real containers.

The engine has the stand-in NVIDIA hook on its PATH (tests/docker/start-dockerd.sh),
so it honours GPU device requests and sets NVIDIA_VISIBLE_DEVICES; the hub runs
with simulated GPUs.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import requests

from tests.conftest import wait_until
from tests.docker.conftest import container_env, container_of, docker, hub_id_of, inspect, make_users, unique
from workbench_spawner.ledger import reasons

pytestmark = [pytest.mark.docker, pytest.mark.integration]


def test_containers_are_pinned_locked_down_and_labelled(docker_hub):
    hub = docker_hub(["--GPUSpawnerMixin.default_max_gpus=2"], WORKBENCH_PROFILES="small:1.5:1G,standard*:2:2G")
    alice, bob = make_users(hub, "alice", "bob")
    hub.spawn(alice, gpus=2, profile="small")
    hub.spawn(bob, gpus=0)  # no profile named: the default one, "standard"
    hub.wait_ready(alice, timeout=180)
    hub.wait_ready(bob, timeout=180)
    leased = hub.leases()[alice]
    assert len(leased) == 2
    assert bob not in hub.leases()

    info = inspect(container_of(hub, alice))
    host = info["HostConfig"]
    assert [(r["Driver"], sorted(r["DeviceIDs"]), r["Capabilities"]) for r in host["DeviceRequests"]] == [
        ("nvidia", leased, [["gpu"]])
    ]
    labels = info["Config"]["Labels"]
    hub_id = hub_id_of(hub.data_dir)
    assert labels["workbench.user"] == alice
    assert labels["workbench.server"] == ""
    assert labels["workbench.hub"] == hub_id
    assert info["Name"] == f"/workbench-{hub_id}-{alice}"
    assert sorted(labels["workbench.gpus"].split(",")) == leased
    assert host["CapDrop"] == ["ALL"]
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["Privileged"] is False
    assert (host["Memory"], host["CpuPeriod"], host["CpuQuota"]) == (1 << 30, 100_000, 150_000)
    mounts = {m["Destination"]: m for m in info["Mounts"]}
    assert mounts["/home/jovyan"]["Name"] == f"workbench-{hub_id}-home-{alice}"
    assert mounts["/home/jovyan"]["RW"]
    for volume in (mounts["/home/jovyan"]["Name"], mounts["/checkpoints"]["Name"]):
        assert inspect(volume)["Labels"] == {"workbench.hub": hub_id, "workbench.user": alice}
    assert mounts["/checkpoints"]["RW"]
    assert not mounts["/datasets"]["RW"]
    assert not any("docker.sock" in m.get("Source", "") for m in info["Mounts"])

    name = container_of(hub, alice)
    env = container_env(name)
    assert sorted(env["NVIDIA_VISIBLE_DEVICES"].split(",")) == leased
    assert env["WORKBENCH_GPUS"] == env["NVIDIA_VISIBLE_DEVICES"]
    assert (env["MEM_LIMIT"], env["CPU_LIMIT"]) == (str(1 << 30), "1.5")
    assert docker("exec", name, "id", "-u").stdout.strip() != "0", "user servers never run as root"
    assert docker("exec", name, "touch", "/datasets/x", check=False).returncode != 0, "datasets are read-only"
    docker("exec", name, "touch", "/checkpoints/model.pt")

    # A CPU-only container gets no device request and sees no GPU.
    cpu = inspect(container_of(hub, bob))
    assert not cpu["HostConfig"]["DeviceRequests"]
    assert (cpu["HostConfig"]["Memory"], cpu["HostConfig"]["CpuQuota"]) == (2 << 30, 200_000)
    env = container_env(container_of(hub, bob))
    assert env["WORKBENCH_GPUS"] == ""
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"

    # Reachable through the proxy, and stopping removes the container and frees the GPUs.
    token = hub.user_token(alice)
    r = requests.get(f"{hub.url}/user/{alice}/api/status", headers={"Authorization": f"token {token}"}, timeout=10)
    assert r.status_code == 200, r.text
    hub.api("DELETE", f"/users/{alice}/server")
    hub.wait_stopped(alice)
    assert alice not in hub.leases()
    # DockerSpawner's stop returns once Docker has the removal in hand (a 409 "removal already in progress"
    # counts as done); on a busy engine (CI, both lanes) the container may still be listed a moment later.
    wait_until(
        lambda: docker("inspect", "--type", "container", name, check=False).returncode != 0,
        30,
        f"{name} removed after the stop",
        log=hub.log,
    )


def test_killed_container_releases_its_gpu_within_a_poll(docker_hub):
    hub = docker_hub(WORKBENCH_SIMULATED_GPUS="1")
    victim, nxt = make_users(hub, "victim", "next")
    hub.spawn(victim, gpus=1)
    hub.wait_ready(victim, timeout=180)
    docker("kill", container_of(hub, victim))
    started = time.monotonic()
    hub.wait_stopped(victim, timeout=30)
    assert hub.leases() == {}
    print(f"released {time.monotonic() - started:.1f} s after docker kill (poll interval 2 s)")
    hub.spawn(nxt, gpus=1)
    hub.wait_ready(nxt, timeout=180)
    assert hub.leases() == {nxt: ["GPU-sim-00-h100-80gb"]}
    # The ledger says why each ended: the container died on its own; the next was stopped by a script.
    assert hub.api("DELETE", f"/users/{nxt}/server").status_code in (202, 204)
    hub.wait_stopped(nxt, timeout=60)
    # (with the facts after the reason: the kill's signal and exit code, the service's name)
    assert hub.usage_reasons() == {
        victim: [f"{reasons.SERVER_EXITED}: killed by SIGKILL, exit code 137"],
        nxt: [f"{reasons.STOPPED_BY_SERVICE}: workbench-admin"],
    }
    assert hub.stop_box(victim) == "This server exited on its own (killed by SIGKILL, exit code 137)."


def test_home_survives_stop_removal_and_an_image_upgrade(docker_hub, singleuser_image):
    upgraded = f"{singleuser_image}-upgrade"
    build = subprocess.run(
        ["docker", "build", "-t", upgraded, "-"],
        input=f"FROM {singleuser_image}\nLABEL workbench.test-upgrade=1\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    hub = docker_hub(WORKBENCH_IMAGES=f"{singleuser_image},{upgraded}")
    (carol,) = make_users(hub, "carol")
    hub.spawn(carol, gpus=1)
    hub.wait_ready(carol, timeout=180)
    name = container_of(hub, carol)
    # Fill the home a little, and edit a bundled notebook.
    docker(
        "exec",
        name,
        "sh",
        "-c",
        "head -c 50000000 /dev/urandom > ~/data.bin && sha256sum ~/data.bin | cut -c1-64 > ~/data.sha "
        "&& echo '{\"edited\": true}' > ~/notebooks/00-environment-check.ipynb",
    )
    digest = docker("exec", name, "cat", "/home/jovyan/data.sha").stdout.strip()
    hub.api("DELETE", f"/users/{carol}/server")
    hub.wait_stopped(carol)
    assert docker("inspect", name, check=False).returncode != 0, "the container was removed"

    r = hub.spawn(carol, gpus=1, image=upgraded)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(carol, timeout=180)
    name = container_of(hub, carol)
    assert inspect(name)["Config"]["Image"] == upgraded
    out = docker("exec", name, "sh", "-c", "sha256sum ~/data.bin | cut -c1-64").stdout.strip()
    assert out == digest, "the home volume lost or changed data"
    notebook = docker("exec", name, "cat", "/home/jovyan/notebooks/00-environment-check.ipynb").stdout
    assert json.loads(notebook) == {"edited": True}, "an edited notebook was overwritten"
    assert docker("exec", name, "test", "-f", "/home/jovyan/notebooks/01-torch-compile.ipynb").returncode == 0
    r = hub.spawn(unique("x"), image="alpine:latest")
    assert r.status_code in (400, 404)
    docker("rmi", "-f", upgraded, check=False)


def test_hub_restart_keeps_containers_and_reconciles_with_labels(docker_hub, base_image, docker_container):
    hub = docker_hub()
    alice, bob = make_users(hub, "alice", "bob")
    for user in (alice, bob):
        hub.spawn(user, gpus=1)
    for user in (alice, bob):
        hub.wait_ready(user, timeout=180)
    alice_container = inspect(container_of(hub, alice))["Id"]
    alice_gpus = hub.leases()[alice]
    bob_gpus = hub.leases()[bob]
    bob_container = container_of(hub, bob)
    token = hub.user_token(alice)

    hub.stop()
    # While the hub is down: bob's container dies, and two containers appear
    # that the database knows nothing about (a lost row).
    docker("kill", bob_container)
    free_gpu = next(g for g in (f"GPU-sim-{i:02d}-h100-80gb" for i in range(4)) if g not in alice_gpus + bob_gpus)
    hub_label = f"workbench.hub={hub_id_of(hub.data_dir)}"

    def server_without_lease(hub_label: str, user: str, gpu: str) -> str:
        labels = [hub_label, f"workbench.user={user}", "workbench.server=", f"workbench.gpus={gpu}"]
        return docker_container(*(a for label in labels for a in ("--label", label)), base_image, "sleep", "600")

    # Another hub's server on the same engine, on one of alice's GPUs: not this hub's to adopt or stop.
    foreign = server_without_lease("workbench.hub=0therhub", "neighbour", alice_gpus[0])
    adopt = server_without_lease(hub_label, "orphan", free_gpu)
    clash = server_without_lease(hub_label, "intruder", alice_gpus[0])
    hub.start()

    hub.wait_ready(alice, timeout=60)
    assert inspect(container_of(hub, alice))["Id"] == alice_container, "alice's container was replaced"
    r = requests.get(f"{hub.url}/user/{alice}/api/status", headers={"Authorization": f"token {token}"}, timeout=10)
    assert r.status_code == 200, r.text
    hub.api("GET", f"/users/{bob}")  # the first request creates the spawners and runs reconcile
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and bob in hub.leases():
        time.sleep(1)
    leases = hub.leases()
    assert bob not in leases, "the lease of a dead container was not released"
    assert leases[alice] == alice_gpus
    assert leases.get("orphan") == [free_gpu], "a lease-less container with free GPUs is adopted"
    assert "intruder" not in leases
    assert inspect(clash)["State"]["Running"] is False, "a container on someone else's GPU is stopped"
    assert inspect(foreign)["State"]["Running"] is True, "another hub's container was touched"
    assert "neighbour" not in leases
    held = [g for gs in leases.values() for g in gs]
    assert len(held) == len(set(held))
    docker("rm", "-f", adopt, check=False)


H200_SLICES = "1xH200-141GB:mig=7x1g.18gb"
SLICE_UUIDS = [f"MIG-sim-00-h200-141gb-{i}-1g.18gb" for i in range(7)]


def pinned_slice(hub, user: str) -> str:
    """The one slice ``user``'s lease holds, after checking that the container asks Docker for exactly it:
    its device request, NVIDIA_VISIBLE_DEVICES (what the NVIDIA runtime hands the container) and
    WORKBENCH_GPUS all name that MIG UUID and nothing else."""
    (leased,) = hub.leases()[user]
    name = container_of(hub, user)
    assert [r["DeviceIDs"] for r in inspect(name)["HostConfig"]["DeviceRequests"]] == [[leased]]
    env = container_env(name)
    assert env["NVIDIA_VISIBLE_DEVICES"] == env["WORKBENCH_GPUS"] == leased, env
    assert inspect(name)["Config"]["Labels"]["workbench.gpus"] == leased
    return leased


def test_seven_containers_get_the_seven_slices_and_an_eighth_gets_the_first_freed(docker_hub):
    """Seven students on one simulated H200 laid out 7x1g.18gb: seven containers, each pinned to its own
    slice by MIG UUID; an eighth waits in line, then gets exactly the slice a stopped server gave back."""
    hub = docker_hub(
        ["--GPUSpawnerMixin.gpu_queue_recheck_interval=0.5"],
        WORKBENCH_SIMULATED_GPUS=H200_SLICES,
        WORKBENCH_QUEUE_TIMEOUT="300",
    )
    students = make_users(hub, *(f"s{i}" for i in range(8)))
    for i, user in enumerate(students[:7]):
        # Half name the profile; on a hub of slices only, the others get one all the same.
        options = {"gpus": 1, "gpu_profile": "1g.18gb"} if i % 2 else {"gpus": 1}
        assert hub.spawn(user, **options).status_code in (201, 202)
    for user in students[:7]:
        hub.wait_ready(user, timeout=300)
    slices = {user: pinned_slice(hub, user) for user in students[:7]}
    assert sorted(slices.values()) == SLICE_UUIDS, "seven distinct slices, one each"

    eighth, leaving = students[7], students[2]
    assert hub.spawn(eighth, gpus=1, gpu_profile="1g.18gb").status_code == 202
    waiting = hub.progress_messages(eighth, until="next in line")[-1]
    assert "Waiting for 1 1g.18gb slice to become free (you are next in line)" in waiting, waiting
    assert eighth not in hub.leases()
    assert hub.api("DELETE", f"/users/{leaving}/server").status_code in (202, 204)
    hub.wait_ready(eighth, timeout=180)
    assert pinned_slice(hub, eighth) == slices[leaving]
    assert leaving not in hub.leases()
