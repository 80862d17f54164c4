"""A Docker server killed for memory says so: the ledger, ``api/usage`` and the spawn page's stop box.

A real OOM kill in a real container with a real memory limit: the hub's servers get a 256 MiB
limit (the profile ``tiny``), a cell in the server's kernel allocates past it, and the kernel's
OOM killer in the container's memory cgroup kills a process. Which process it takes is the
kernel's choice (the largest resident set, weighted by ``oom_score_adj``); left alone it takes
the allocating kernel, and the server lives on (tests/docker/test_docker_kernel_oom.py). So the
cell first raises the ``oom_score_adj`` of the container's PID 1 (jupyterhub-singleuser: the
image's workbench-start execs it; raising one's own processes' score needs no privilege) to
1000. That only steers the choice of the victim to the server process: the kill itself is the
kernel's, Docker records it as ``State.OOMKilled``, and the spawner hears it from Docker as any
other OOM kill of a server.
"""

from __future__ import annotations

import html
import json
import selectors
import subprocess
import time

import pytest
import requests

from tests.conftest import wait_until
from tests.docker.conftest import container_of, docker, inspect, make_users
from tests.kernel_ws import Kernel
from workbench_spawner.ledger import reasons

pytestmark = [pytest.mark.docker, pytest.mark.integration]

LIMIT = 256 << 20
PROFILES = "tiny*:1:256M,roomy:1:1G"

# Run in the server's kernel: steer the OOM killer to the server (PID 1), then allocate past the limit.
# Touching every page (b"x" * n, not a zero-filled bytearray) makes the memory resident at once.
TAKE_THE_SERVER = """
with open("/proc/1/oom_score_adj", "w") as f:
    f.write("1000")
print("pid1", open("/proc/1/cmdline").read().replace("\\0", " ")[:80], open("/proc/1/oom_score_adj").read().strip())
held = []
while True:
    held.append(b"x" * (8 << 20))
"""


def cgroup_memory(name: str) -> dict[str, str]:
    """The container's memory cgroup (v1) files the test reports."""
    files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.max_usage_in_bytes", "memory.oom_control")
    out = docker("exec", name, "sh", "-c", " ".join(f"echo {f}:$(cat /sys/fs/cgroup/memory/{f});" for f in files))
    return dict(line.split(":", 1) for line in out.stdout.splitlines() if ":" in line)


class ContainerEvents:
    """``docker events`` for one container from now on: what the engine said happened to it, kept even
    after the container is removed (the spawner removes a stopped server's container)."""

    def __init__(self, name: str):
        self.proc = subprocess.Popen(
            ["docker", "events", "--filter", f"container={name}", "--format", "{{json .}}"],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.seen: list[dict] = []

    def until(self, action: str, timeout: float) -> list[dict]:
        """The events up to the first ``action`` (e.g. "die"), or all seen when ``timeout`` passes."""
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not any(e.get("Action") == action for e in self.seen):
            if sel.select(max(0.0, deadline - time.monotonic())):
                line = self.proc.stdout.readline()
                if not line:
                    break
                self.seen.append(json.loads(line))
        return self.seen

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def test_a_server_killed_for_memory_shows_out_of_memory_with_its_limit(docker_hub):
    hub = docker_hub(WORKBENCH_PROFILES=PROFILES)
    (ann,) = make_users(hub, "ann")
    r = hub.spawn(ann, gpus=1)
    assert r.status_code in (201, 202), r.text
    hub.wait_ready(ann, timeout=180)
    name = container_of(hub, ann)
    info = inspect(name)
    assert info["HostConfig"]["Memory"] == LIMIT
    print("the server's cgroup once ready:", cgroup_memory(name))

    kernel = Kernel.start(hub.url, ann, hub.user_token(ann))
    events = ContainerEvents(name)
    try:
        print("the server's cgroup with a kernel:", cgroup_memory(name))
        outcome = kernel.execute(TAKE_THE_SERVER, timeout=120)
        # The engine's account: the cgroup's OOM killer struck ("oom"), and the server's process died of
        # its SIGKILL (exit code 137).
        seen = events.until("die", timeout=30)
    finally:
        events.close()
        kernel.close()
    print("the cell:", outcome)
    print("docker events:", [(e.get("Action"), e.get("Actor", {}).get("Attributes", {}).get("exitCode")) for e in seen])
    # The server died under the cell: the websocket closed, no reply.
    assert not outcome.timed_out, f"the cell still ran after 120 s: {outcome}"
    assert outcome.status is None, f"the cell finished, so nothing was killed: {outcome}"
    actions = [e.get("Action") for e in seen]
    assert "oom" in actions, actions
    assert "die" in actions, actions
    died = next(e for e in seen if e.get("Action") == "die")
    assert died["Actor"]["Attributes"]["exitCode"] == "137", died

    hub.wait_stopped(ann, timeout=60)
    assert ann not in hub.leases()
    # The dead container does not linger once the hub has read why it ended.
    wait_until(
        lambda: docker("inspect", "--type", "container", name, check=False).returncode != 0,
        30,
        f"{name} removed after its end",
        log=hub.log,
    )

    told = "This server was stopped because it ran out of memory: it reached its limit of 256 MiB."
    wait_until(lambda: hub.usage_reasons().get(ann), 30, "the ledger row", hub.log)
    assert hub.usage_reasons() == {ann: [f"{reasons.OUT_OF_MEMORY}: 256 MiB limit"]}
    r = hub.service("GET", f"api/usage?user={ann}")
    assert r.status_code == 200, r.text
    assert r.json()["ends_by_reason"] == {reasons.OUT_OF_MEMORY: 1}, r.text
    assert hub.stop_box(ann) == told

    # The student reads it on the spawn page (the admin renders ann's form, as ann's browser would get it),
    # with the profile that offers more memory.
    r = hub.admin_pages().get(f"{hub.url}/hub/spawn/{ann}", timeout=30)
    page = html.unescape(r.text)
    assert r.status_code == 200, page[-3000:]
    assert "workbench-stopped" in page, page[-3000:]
    assert told in page, page[-3000:]
    assert "ran out of memory: it reached its limit of 256 MiB" in page
    assert "(1 GiB of memory)" in page, page[-3000:]

    # A new start reads the box: it is gone, and the server runs again.
    assert hub.spawn(ann, gpus=1).status_code in (201, 202)
    hub.wait_ready(ann, timeout=180)
    assert hub.stop_box(ann) is None
    token = hub.user_token(ann)
    r = requests.get(f"{hub.url}/user/{ann}/api/status", headers={"Authorization": f"token {token}"}, timeout=10)
    assert r.status_code == 200, r.text
