"""Tenant isolation with the hub on the host: real hub, proxy and Docker engine.

Student B tries what a curious student would: A's TensorBoard-style server on
``0.0.0.0:6006`` by address and by container name, A's Jupyter port, the
hub's internal ports. None answers; the hub and the proxy still reach both;
the hub's API answers B; egress follows ``WORKBENCH_USER_EGRESS``; all of it
holds after a hub restart and after a dockerd restart. Two hubs on one engine
keep each other's servers and homes. (The compose topology:
test_compose_topology.py.)
"""

from __future__ import annotations

from urllib.parse import urlparse

import pytest
import requests

from tests.docker.conftest import (
    container_env,
    container_ip,
    container_of,
    docker,
    hub_id_of,
    inspect,
    lab_in_chromium,
    make_users,
    reachable,
    restart_dockerd,
    serve_in,
    unique,
)

pytestmark = [pytest.mark.docker, pytest.mark.integration]
browser = pytest.mark.browser

BOARD = 6006  # where a student's TensorBoard would listen
JUPYTER = 8888


def through_proxy(hub, user: str) -> int:
    token = hub.user_token(user)
    r = requests.get(f"{hub.url}/user/{user}/api/status", headers={"Authorization": f"token {token}"}, timeout=10)
    return r.status_code


def hub_api_answers(container: str) -> bool:
    """The hub API the server needs, from inside its container (JUPYTERHUB_API_URL, as the server uses it)."""
    api = container_env(container)["JUPYTERHUB_API_URL"]
    code = "import urllib.request,sys; print(urllib.request.urlopen(sys.argv[1] + '/', timeout=5).status)"
    return docker("exec", container, "python3", "-c", code, api, check=False).stdout.strip() == "200"


def assert_isolated(hub, a: str, b: str) -> None:
    """B reaches nothing of A's and none of the hub's internal ports; the hub and proxy reach both."""
    ca, cb = container_of(hub, a), container_of(hub, b)
    serve_in(ca, BOARD)
    gateway = urlparse(container_env(cb)["JUPYTERHUB_API_URL"]).hostname
    internal = [f"{gateway}:{hub.env['WORKBENCH_PROXY_API_PORT']}", f"{gateway}:{hub.env['WORKBENCH_SERVICE_PORT']}"]
    ip = container_ip(ca)
    seen = reachable(cb, f"{ip}:{BOARD}", f"{ca}:{BOARD}", f"{ip}:{JUPYTER}", *internal)
    assert not any(seen.values()), f"{b}'s container reaches {[t for t, ok in seen.items() if ok]}"
    assert hub_api_answers(cb), "the hub API must answer the user's server"
    assert requests.get(f"http://{ip}:{BOARD}/", timeout=5).status_code == 200, "the host reaches A's container"
    assert through_proxy(hub, a) == 200
    assert through_proxy(hub, b) == 200


@browser
def test_users_cannot_reach_each_other_and_it_survives_restarts(docker_hub, outside_host, chromium_browser):
    a, b = unique("ann"), unique("ben")
    hub = docker_hub(WORKBENCH_ADMIN_USERS=f"{a},{b}")  # admins: authorized at sign-up, for Chromium below
    hub.track_users.extend((a, b))
    for user in (a, b):
        hub.spawn(user, gpus=1)
    for user in (a, b):
        hub.wait_ready(user, timeout=180)
    hub_id = hub_id_of(hub.data_dir)
    network = f"workbench-{hub_id}-users"
    attrs = inspect(network)
    assert attrs["Options"]["com.docker.network.bridge.enable_icc"] == "false"
    assert not attrs["Internal"]
    assert attrs["Labels"] == {"workbench.hub": hub_id}
    assert_isolated(hub, a, b)
    assert reachable(container_of(hub, b), outside_host) == {outside_host: True}, "egress=internet reaches out"
    for user in (a, b):  # both labs work in a browser, through the proxy
        lab_in_chromium(chromium_browser, hub.url, user, screenshot=f"isolated-lab-{user[:3]}.png")

    # A hub restart with egress turned off: running servers keep their network and
    # stay isolated; a server started now is on an internal network, with no way out.
    hub.stop()
    hub.env["WORKBENCH_USER_EGRESS"] = "none"
    hub.start()
    hub.wait_ready(a, timeout=60)
    assert_isolated(hub, a, b)
    hub.api("DELETE", f"/users/{b}/server")
    hub.wait_stopped(b)
    hub.spawn(b, gpus=1)
    hub.wait_ready(b, timeout=180)
    cb = container_of(hub, b)
    assert list(inspect(cb)["NetworkSettings"]["Networks"]) == [f"{network}-internal"]
    assert reachable(cb, outside_host) == {outside_host: False}, "egress=none must not reach out"
    assert_isolated(hub, a, b)
    assert_isolated(hub, b, a)

    # dockerd restarts (its containers stop with it): the servers come back isolated.
    restart_dockerd()
    for user in (a, b):
        hub.wait_stopped(user, timeout=60)
        hub.spawn(user, gpus=1)
    for user in (a, b):
        hub.wait_ready(user, timeout=180)
    assert_isolated(hub, a, b)
    assert reachable(container_of(hub, a), outside_host) == {outside_host: False}


def test_two_hubs_on_one_engine_keep_each_others_servers_and_homes(docker_hub):
    first, second = docker_hub(), docker_hub()
    (user,) = make_users(first, "twin")
    second.create_users(user)
    # A home from before hub ids: the first hub to start the user's server takes it over.
    legacy = f"workbench-home-{user}"
    docker("volume", "create", legacy)
    docker(
        "run",
        "--rm",
        "-v",
        f"{legacy}:/home/jovyan",
        "--entrypoint",
        "sh",
        "gpu-workbench/singleuser:test",
        "-c",
        "echo kept > /home/jovyan/legacy.txt",
    )
    first.spawn(user, gpus=1)
    first.wait_ready(user, timeout=180)
    second.spawn(user, gpus=1)
    second.wait_ready(user, timeout=180)
    one, two = container_of(first, user), container_of(second, user)
    assert one != two
    assert hub_id_of(first.data_dir) != hub_id_of(second.data_dir)
    assert docker("exec", one, "cat", "/home/jovyan/legacy.txt").stdout.strip() == "kept", "the old home moved"
    assert docker("exec", two, "test", "-e", "/home/jovyan/legacy.txt", check=False).returncode != 0
    assert docker("volume", "inspect", legacy, check=False).returncode != 0, "the old volume is gone once moved"
    homes = [m["Name"] for c in (one, two) for m in inspect(c)["Mounts"] if m["Destination"] == "/home/jovyan"]
    assert homes == [f"workbench-{hub_id_of(h.data_dir)}-home-{user}" for h in (first, second)]

    # Each hub restarts (reconcile) and stops its own server; the other's runs on.
    for hub, other, theirs in ((second, first, one), (first, second, two)):
        hub.stop()  # the hub's own server keeps running (cleanup_servers is off)
        hub.start()
        hub.api("GET", f"/users/{user}")
        assert inspect(theirs)["State"]["Running"], "a hub's reconcile touched another hub's container"
        assert through_proxy(other, user) == 200
    second.api("DELETE", f"/users/{user}/server")
    second.wait_stopped(user)
    assert inspect(one)["State"]["Running"]
    assert through_proxy(first, user) == 200
    assert first.leases()[user]
    assert user not in second.leases()
