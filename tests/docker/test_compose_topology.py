"""The compose topology, tested: the hub image runs as a container against the
same Docker engine, as ``docker compose up`` runs it, and spawns pinned user
containers, each on a network of its own that the hub's container joins.

Student B tries what a curious student would: A's server on ``0.0.0.0:6006``
by address and by container name, A's Jupyter port, the monitoring profile's
Prometheus on the compose network. None answers; the hub's API and the
internet (a test host on this machine) do; the proxy in the hub reaches both
servers, also after the hub's container is recreated (``docker compose up``
after an upgrade), which has to join its users' networks again.
"""

from __future__ import annotations

import secrets
import time
import uuid

import pytest
import requests

from tests.docker.conftest import (
    container_ip,
    docker,
    inspect,
    lab_in_chromium,
    reachable,
    remove_user_objects,
    serve_in,
    user_container,
)

pytestmark = [pytest.mark.docker, pytest.mark.integration]


def run_hub(
    name: str, network: str, data: str, token: str, image: str, singleuser: str, datasets: str, admins: str
) -> str:
    """Start the hub's container as compose does; return its URL on the host's loopback once it answers."""
    env = {
        "WORKBENCH_BACKEND": "docker",
        "WORKBENCH_IMAGE": singleuser,
        "WORKBENCH_DOCKER_NETWORK": network,
        "WORKBENCH_IP": "0.0.0.0",
        # published on the host's loopback only (below), as compose does by default
        "WORKBENCH_PUBLISH_IP": "127.0.0.1",
        "WORKBENCH_SIMULATED_GPUS": "2",
        "WORKBENCH_ADMIN_TOKEN": token,
        "WORKBENCH_DATASETS_VOLUME": datasets,
        "WORKBENCH_CULL_IDLE_SECONDS": "0",
        "WORKBENCH_DATA_DIR": "/srv/workbench/data",
        "WORKBENCH_ADMIN_USERS": admins,
    }
    docker(
        "run",
        "-d",
        "--name",
        name,
        "--network",
        network,
        "--network-alias",
        "hub",
        "-p",
        "127.0.0.1::8000",
        "-v",
        "/var/run/docker.sock:/var/run/docker.sock",
        "-v",
        f"{data}:/srv/workbench/data",
        *[a for key, value in env.items() for a in ("-e", f"{key}={value}")],
        image,
    )
    port = docker("port", name, "8000/tcp").stdout.split(":")[-1].strip()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if requests.get(f"{url}/hub/api/", timeout=3).status_code == 200:
                return url
        except requests.RequestException:
            pass
        assert time.monotonic() < deadline, docker("logs", name).stderr[-3000:]
        time.sleep(1)


@pytest.mark.browser
def test_hub_container_spawns_isolated_pinned_user_containers(
    hub_image, singleuser_image, docker_volume, outside_host, chromium_browser
):
    tag = uuid.uuid4().hex[:8]
    network, hub_name, prometheus = f"wb-topo-{tag}", f"wb-topo-hub-{tag}", f"wb-topo-prometheus-{tag}"
    a, b = f"topoa{tag}", f"topob{tag}"
    token = secrets.token_hex(16)
    datasets, data = docker_volume("wb-topo-datasets"), docker_volume("wb-topo-data")
    start = (hub_name, network, data, token, hub_image, singleuser_image, datasets, f"{a},{b}")
    docker("network", "create", network)
    try:
        # what the monitoring profile puts on the compose network: Prometheus, no authentication
        docker("run", "-d", "--name", prometheus, "--network", network, "--entrypoint", "python3", singleuser_image,
               "-m", "http.server", "9090")  # fmt: skip
        url = run_hub(*start)
        headers = {"Authorization": f"token {token}"}
        for user in (a, b):
            # admins (authorized at sign-up, for Chromium below) exist from the hub's start
            assert requests.get(f"{url}/hub/api/users/{user}", headers=headers, timeout=10).status_code == 200
            r = requests.post(f"{url}/hub/api/users/{user}/server", headers=headers, json={"gpus": 1}, timeout=30)
            assert r.status_code in (201, 202), r.text
        deadline = time.monotonic() + 180
        for user in (a, b):
            while True:
                r = requests.get(f"{url}/hub/api/users/{user}", headers=headers, timeout=10)
                server = r.json()["servers"].get("")
                if server and server["ready"]:
                    break
                assert server, docker("logs", hub_name).stderr[-3000:]
                assert time.monotonic() < deadline, docker("logs", hub_name).stderr[-3000:]
                time.sleep(1)

        tokens = {}
        for user in (a, b):
            r = requests.post(
                f"{url}/hub/api/users/{user}/tokens", headers=headers, json={"expires_in": 600}, timeout=10
            )
            tokens[user] = r.json()["token"]

        def through_proxy(user: str) -> int:
            auth = {"Authorization": f"token {tokens[user]}"}
            return requests.get(f"{url}/user/{user}/api/status", headers=auth, timeout=10).status_code

        ca, cb = user_container(a), user_container(b)
        info = inspect(ca)
        assert info["HostConfig"]["DeviceRequests"][0]["DeviceIDs"] == ["GPU-sim-00-h100-80gb"]
        assert info["Config"]["Labels"]["workbench.user"] == a
        assert not any("docker.sock" in m.get("Source", "") for m in info["Mounts"])
        # Its own network, which the hub's container joined; not the compose network.
        (own,) = info["NetworkSettings"]["Networks"]
        assert own.endswith(f"-u-{a}")
        assert own != network
        assert set(inspect(own)["Containers"]) == {info["Id"], inspect(hub_name)["Id"]}

        def assert_isolated() -> None:
            serve_in(ca, 6006)
            ip = container_ip(ca)
            targets = [
                f"{ip}:6006",
                f"{ca}:6006",
                f"{ip}:8888",
                f"{container_ip(prometheus)}:9090",
                f"{prometheus}:9090",
                "hub:8001",  # the proxy's API
                "hub:10101",  # the workbench service
            ]
            seen = reachable(cb, *targets)
            assert not any(seen.values()), f"{b}'s container reaches {[t for t, ok in seen.items() if ok]}"
            assert reachable(cb, "hub:8081") == {"hub:8081": True}, "the hub API must answer the user's server"
            assert through_proxy(a) == 200
            assert through_proxy(b) == 200

        assert_isolated()
        assert reachable(cb, outside_host) == {outside_host: True}, "egress=internet reaches out"
        for user in (a, b):  # both labs work in a browser, through the proxy in the hub's container
            lab_in_chromium(chromium_browser, url, user, screenshot=f"compose-lab-{user[:5]}.png")

        # `docker compose up` after an upgrade recreates the hub's container: it is on
        # none of its users' networks until it joins them again.
        docker("rm", "-f", hub_name)
        url = run_hub(*start)
        assert_isolated()

        requests.delete(f"{url}/hub/api/users/{a}/server", headers=headers, timeout=30)
        deadline = time.monotonic() + 60
        while docker("network", "inspect", own, check=False).returncode == 0:
            assert time.monotonic() < deadline, "a stopped user's network is removed"
            time.sleep(1)
    finally:
        docker("rm", "-f", hub_name, prometheus, check=False)
        remove_user_objects(a, b)
        docker("network", "rm", network, check=False)
