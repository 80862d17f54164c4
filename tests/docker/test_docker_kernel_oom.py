"""A kernel that allocates past its Docker server's memory limit is killed for memory, and the server says so.

A real OOM kill in a real container with a real memory limit, nothing steered: the server
runs with a 512 MiB limit (its profile), a cell allocates until the container's memory cgroup
is full, and the kernel's OOM killer takes the largest process in it, the allocating kernel
(the server, some 100 MiB resident, is left alone; nobody touched an ``oom_score_adj``). The
server lives on and jupyter_server restarts the kernel. The monitor extension's
``GET api/gpu/memory`` reads the container's cgroup (v1 on this host: ``memory.oom_control``'s
``oom_kill`` line) and reports the kill, which is what JupyterLab reads to say "Your kernel was
stopped because this server reached its memory limit (512 MiB): ..." when a notebook's kernel dies
(the frontend's ``memoryModel.ts``; its browser test uses a fake cgroup: tests/monitor).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
import requests

from tests.docker.conftest import container_of, docker, inspect, make_users
from tests.kernel_ws import Kernel

pytestmark = [pytest.mark.docker, pytest.mark.integration]

LIMIT = 512 << 20
PROFILES = "small*:1:512M,large:1:2G"
# Touch every page (b"x" * n, not a zero-filled bytearray): resident at once, charged to the cgroup.
ALLOCATE = """
held = []
while True:
    held.append(b"x" * (8 << 20))
"""


def memory(hub_url: str, user: str, token: str) -> dict:
    r = requests.get(f"{hub_url}/user/{user}/api/gpu/memory", headers={"Authorization": f"token {token}"}, timeout=10)
    assert r.status_code == 200, f"{r.status_code} {r.text[:2000]}"
    return r.json()


def wait_for(predicate, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    value = None
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"not within {seconds} s: {what} (last: {value!r})")


def oom_kill_count(name: str) -> int:
    """The container's own cgroup v1 count of OOM kills (``memory.oom_control``'s ``oom_kill`` line)."""
    out = docker("exec", name, "cat", "/sys/fs/cgroup/memory/memory.oom_control").stdout
    return int(dict(line.split() for line in out.splitlines())["oom_kill"])


def test_a_kernel_killed_for_memory_is_reported_and_the_server_survives(docker_hub):
    hub = docker_hub(WORKBENCH_PROFILES=PROFILES)
    (bea,) = make_users(hub, "bea")
    assert hub.spawn(bea, gpus=1).status_code in (201, 202)
    hub.wait_ready(bea, timeout=180)
    name = container_of(hub, bea)
    assert inspect(name)["HostConfig"]["Memory"] == LIMIT
    token = hub.user_token(bea)

    before = memory(hub.url, bea, token)
    print("api/gpu/memory before:", before)
    assert before["cgroup"] == "v1", before  # this host's Docker uses cgroup v1 (docker info: Cgroup Version 1)
    assert before["limit_bytes"] == LIMIT, before
    assert before["oom_kills"] == 0, before
    assert before["last_oom_kill_at"] is None, before
    server_pid = inspect(name)["State"]["Pid"]

    kernel = Kernel.start(hub.url, bea, token)
    try:
        started = datetime.now(UTC)
        outcome = kernel.execute(ALLOCATE, timeout=120)
        print("the cell:", outcome)
        assert outcome.kernel_died, f"the kernel was not killed under the cell: {outcome}"
        assert not outcome.closed, f"the kernel was not killed under the cell: {outcome}"
        assert outcome.status is None, outcome

        # The server counted the kill (it reads its cgroup every second) and says when.
        after = wait_for(
            lambda: (m := memory(hub.url, bea, token))["oom_kills"] and m, 15, "api/gpu/memory counts the OOM kill"
        )
        print("api/gpu/memory after:", after)
        assert after["cgroup"] == "v1", after
        assert after["limit_bytes"] == LIMIT, after
        assert after["oom_kills"] >= 1, after
        assert after["oom_kills"] == oom_kill_count(name), after
        at = datetime.fromisoformat(after["last_oom_kill_at"].replace("Z", "+00:00"))
        assert started.timestamp() - 2 <= at.timestamp() <= time.time() + 2, (started, at)

        # The server survived: same container, same process, still ready; the restarted kernel runs code.
        state = inspect(name)["State"]
        assert state["Running"], state
        assert not state["OOMKilled"], state
        assert state["Pid"] == server_pid, state
        assert hub.server(bea)["ready"]
        r = requests.get(f"{hub.url}/user/{bea}/api/status", headers={"Authorization": f"token {token}"}, timeout=10)
        assert r.status_code == 200, r.text
        again = wait_for(lambda: (o := kernel.execute("print('alive')", timeout=30)).stdout and o, 60, "a new kernel")
        assert again.stdout.strip() == "alive", again
        assert again.status == "ok", again
    finally:
        kernel.close()
    assert bea not in hub.usage_reasons(), "the server did not end"
