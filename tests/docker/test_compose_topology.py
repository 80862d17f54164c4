"""The compose topology, tested: the hub image runs as a container against the
same Docker engine and spawns one user container on a shared network."""

from __future__ import annotations

import json
import secrets
import time
import uuid

import pytest
import requests

from tests.docker.conftest import docker, inspect, remove_user_objects, user_container


def docker_network(name: str) -> dict:
    return json.loads(docker("network", "inspect", name).stdout)[0]


pytestmark = [pytest.mark.docker, pytest.mark.integration]


def test_hub_container_spawns_a_pinned_user_container(hub_image, singleuser_image, docker_volume):
    tag = uuid.uuid4().hex[:8]
    network, hub_name, user = f"wb-topo-{tag}", f"wb-topo-hub-{tag}", f"topo{tag}"
    token = secrets.token_hex(16)
    datasets = docker_volume("wb-topo-datasets")
    docker("network", "create", network)
    try:
        docker(
            "run",
            "-d",
            "--name",
            hub_name,
            "--network",
            network,
            "--network-alias",
            "hub",
            "-p",
            "127.0.0.1::8000",
            "-v",
            "/var/run/docker.sock:/var/run/docker.sock",
            "-e",
            "WORKBENCH_BACKEND=docker",
            "-e",
            f"WORKBENCH_IMAGE={singleuser_image}",
            "-e",
            f"WORKBENCH_DOCKER_NETWORK={network}",
            "-e",
            "WORKBENCH_IP=0.0.0.0",
            # published on the host's loopback only (below), as compose does by default
            "-e",
            "WORKBENCH_PUBLISH_IP=127.0.0.1",
            "-e",
            "WORKBENCH_SIMULATED_GPUS=2",
            "-e",
            f"WORKBENCH_ADMIN_TOKEN={token}",
            "-e",
            f"WORKBENCH_DATASETS_VOLUME={datasets}",
            "-e",
            "WORKBENCH_CULL_IDLE_SECONDS=0",
            hub_image,
        )
        port = docker("port", hub_name, "8000/tcp").stdout.split(":")[-1].strip()
        url, headers = f"http://127.0.0.1:{port}", {"Authorization": f"token {token}"}
        deadline = time.monotonic() + 120
        while True:
            try:
                if requests.get(f"{url}/hub/api/", timeout=3).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, docker("logs", hub_name).stderr[-3000:]
            time.sleep(1)

        assert requests.post(f"{url}/hub/api/users/{user}", headers=headers, timeout=10).status_code == 201
        r = requests.post(f"{url}/hub/api/users/{user}/server", headers=headers, json={"gpus": 1}, timeout=30)
        assert r.status_code in (201, 202), r.text
        deadline = time.monotonic() + 180
        while True:
            server = requests.get(f"{url}/hub/api/users/{user}", headers=headers, timeout=10).json()["servers"].get("")
            if server and server["ready"]:
                break
            assert server and time.monotonic() < deadline, docker("logs", hub_name).stderr[-3000:]
            time.sleep(1)

        info = inspect(user_container(user))
        assert info["HostConfig"]["DeviceRequests"][0]["DeviceIDs"] == ["GPU-sim-00-h100-80gb"]
        assert info["Config"]["Labels"]["workbench.user"] == user
        # its own network, which the hub's container joined; not the hub's network
        (own,) = info["NetworkSettings"]["Networks"]
        assert own.endswith(f"-u-{user}") and network != own
        assert inspect(hub_name)["Id"] in docker_network(own)["Containers"]
        assert not any("docker.sock" in m.get("Source", "") for m in info["Mounts"])
        # The proxy in the hub container reaches the user container over the network.
        r = requests.post(f"{url}/hub/api/users/{user}/tokens", headers=headers, json={"expires_in": 600}, timeout=10)
        user_token = r.json()["token"]
        r = requests.get(f"{url}/user/{user}/api/status", headers={"Authorization": f"token {user_token}"}, timeout=10)
        assert r.status_code == 200, r.text
        requests.delete(f"{url}/hub/api/users/{user}/server", headers=headers, timeout=30)
    finally:
        docker("rm", "-f", hub_name, check=False)
        remove_user_objects(user)
        docker("network", "rm", network, check=False)
