"""Fixtures for tests that need a real Docker Engine.

The images are built by ``images/build-test-images.sh`` (the same script as
``make test-images``): a debootstrapped Debian base instead of the registry
images, and a wheelhouse made on the host instead of PyPI inside the build.
Every step is cached, so only the first session on a machine pays for it
(about 2 minutes for the base, a few for the wheelhouse and each image).

Without a Docker Engine the tests are skipped with the reason shown, unless
``WORKBENCH_STRICT_TESTS=1`` (CI), where they fail instead. Start an engine
with ``tests/docker/start-dockerd.sh``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import docker_engine_use

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "images" / "build-test-images.sh"
CACHE = Path(os.environ.get("WORKBENCH_CACHE_DIR", REPO / ".cache"))

BASE_IMAGE = "gpu-workbench/base:bookworm"
SINGLEUSER_IMAGE = "gpu-workbench/singleuser:test"
HUB_IMAGE = "gpu-workbench/hub:test"

STRICT = os.environ.get("WORKBENCH_STRICT_TESTS") == "1"


def docker(*args: str, check: bool = True, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    """Run the docker CLI; return the completed process (text mode)."""
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"docker {' '.join(args)} exited {proc.returncode}\n"
            f"stdout: {proc.stdout[-3000:]}\nstderr: {proc.stderr[-3000:]}"
        )
    return proc


def inspect(obj: str) -> dict:
    return json.loads(docker("inspect", obj).stdout)[0]


def container_env(name: str) -> dict[str, str]:
    """The environment of the container's main process, as the runtime set it."""
    out = docker("exec", name, "sh", "-c", "tr '\\0' '\\n' < /proc/1/environ").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _unavailable(reason: str):
    if STRICT:
        pytest.fail(f"{reason} (WORKBENCH_STRICT_TESTS=1)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_engine() -> dict:
    """The running Docker Engine's `docker info`; skips (or fails if strict) without one."""
    if shutil.which("docker") is None:
        _unavailable("docker CLI not installed (apt-get install docker.io)")
    try:
        proc = docker("info", "--format", "{{json .}}", check=False, timeout=30)
    except subprocess.TimeoutExpired:
        _unavailable("`docker info` timed out: is dockerd hung?")
    if proc.returncode != 0:
        _unavailable(
            "no Docker Engine answers (start one with tests/docker/start-dockerd.sh): " + proc.stderr.strip()[-300:]
        )
    return json.loads(proc.stdout)


def _build(step: str) -> None:
    """Run one step of images/build-test-images.sh; a failure fails the tests."""
    proc = subprocess.run(["bash", str(BUILD_SCRIPT), step], capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        pytest.fail(
            f"images/build-test-images.sh {step} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def base_image(docker_engine) -> str:
    """gpu-workbench/base:bookworm: debootstrap minbase + docker import (cached by input hash)."""
    _build("base")
    return BASE_IMAGE


@pytest.fixture(scope="session")
def wheelhouse(docker_engine) -> Path:
    """.cache/wheelhouse: wheels for both images, made on the host (cached by input hash)."""
    _build("wheelhouse")
    return CACHE / "wheelhouse"


@pytest.fixture(scope="session")
def singleuser_image(base_image, wheelhouse) -> str:
    """gpu-workbench/singleuser:test built from images/singleuser/Dockerfile."""
    _build("singleuser")
    return SINGLEUSER_IMAGE


@pytest.fixture(scope="session")
def hub_image(base_image, wheelhouse) -> str:
    """gpu-workbench/hub:test built from images/hub/Dockerfile (with configurable-http-proxy)."""
    _build("hub")
    return HUB_IMAGE


@pytest.fixture
def docker_volume(docker_engine):
    """Factory for named volumes that are removed after the test."""
    created: list[str] = []

    def make(prefix: str = "wb-test") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        docker("volume", "create", "--label", "workbench.test=1", name)
        created.append(name)
        return name

    yield make
    for name in created:
        docker("volume", "rm", "-f", name, check=False)


@pytest.fixture
def docker_container(docker_engine):
    """Factory: `docker run -d ...` that removes the container after the test."""
    created: list[str] = []

    def run(*args: str) -> str:
        name = f"wb-test-{uuid.uuid4().hex[:10]}"
        docker("run", "-d", "--name", name, "--label", "workbench.test=1", *args)
        created.append(name)
        return name

    yield run
    for name in created:
        docker("rm", "-f", "-v", name, check=False)


def user_container(user: str) -> str:
    """The name of the (one) container labelled as ``user``'s server; '' if none."""
    out = docker("ps", "-a", "--filter", f"label=workbench.user={user}", "--format", "{{.Names}}").stdout.split()
    return out[0] if out else ""


def hub_id_of(data_dir: Path) -> str:
    """The id a hub keeps in its GPU database (the ``workbench.hub`` label of what it makes)."""
    import sqlite3

    with sqlite3.connect(data_dir / "workbench.sqlite") as db:
        (value,) = db.execute("SELECT value FROM workbench_settings WHERE key = 'hub-id'").fetchone()
    return json.loads(value)


def remove_user_objects(*users: str) -> None:
    """Remove the containers, volumes and networks the hub made for these users, then unused hub networks."""
    for kind, list_cmd in (
        ("rm", ["ps", "-aq"]),
        ("volume", ["volume", "ls", "-q"]),
        ("network", ["network", "ls", "-q"]),
    ):
        for user in users:
            ids = docker(*list_cmd, "--filter", f"label=workbench.user={user}").stdout.split()
            if ids:
                args = ["rm", "-f", *ids] if kind == "rm" else [kind, "rm", *(["-f"] if kind == "volume" else []), *ids]
                docker(*args, check=False)
    docker("network", "prune", "-f", "--filter", "label=workbench.hub", check=False)


# -- a real hub with the docker backend, on the host ------------------------------------------


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:6]}"


def container_of(hub, user: str) -> str:
    return hub.server(user)["state"]["object_name"]


@pytest.fixture
def docker_hub(running_hub, singleuser_image, docker_volume):
    datasets = docker_volume("wb-datasets")
    users: list[str] = []

    def start(args: list[str] | None = None, **env: str):
        hub = running_hub(
            {
                "WORKBENCH_BACKEND": "docker",
                "WORKBENCH_IMAGE": singleuser_image,
                "WORKBENCH_SIMULATED_GPUS": "4",
                "WORKBENCH_DATASETS_VOLUME": datasets,
                **env,
            },
            ["--Spawner.poll_interval=2", *(args or [])],
        )
        hub.track_users = users
        return hub

    yield start
    remove_user_objects(*users)


def make_users(hub, *prefixes: str) -> list[str]:
    names = [unique(p) for p in prefixes]
    hub.track_users.extend(names)
    hub.create_users(*names)
    return names


# -- tenant isolation: probes from inside a container, a test host beyond Docker's networks --

PROBE = """
import json, socket, sys
result = {}
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        result[target] = True
    except OSError:
        result[target] = False
print(json.dumps(result))
"""


def reachable(container: str, *targets: str) -> dict[str, bool]:
    """Which ``host:port`` targets a TCP connection from inside ``container`` reaches (3 s each)."""
    out = docker("exec", container, "python3", "-c", PROBE, *targets, timeout=60).stdout
    return json.loads(out)


def serve_in(container: str, port: int) -> None:
    """Start ``python -m http.server`` on 0.0.0.0:port in the container, as the user would, and wait for it."""
    docker("exec", "-d", container, "python3", "-m", "http.server", str(port), "--bind", "0.0.0.0")
    wait = (
        "import socket, time\n"
        "for _ in range(50):\n"
        f"    try: socket.create_connection(('127.0.0.1', {port}), 1); break\n"
        "    except OSError: time.sleep(0.2)"
    )
    docker("exec", container, "python3", "-c", wait)


def container_ip(container: str) -> str:
    (network,) = inspect(container)["NetworkSettings"]["Networks"].values()
    return network["IPAddress"]


TINY_HTTP = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(16)
while True:
    c, _ = s.accept()
    c.recv(4096)
    c.sendall(b"HTTP/1.0 200 OK\\r\\nContent-Length: 7\\r\\n\\r\\noutside")
    c.close()
"""


def _free_test_net() -> ipaddress.IPv4Network:
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True, check=True).stdout
    used = []
    for line in routes.splitlines():
        first = line.split()[0]
        if first != "default":
            used.append(ipaddress.ip_network(first if "/" in first else f"{first}/32", strict=False))
    for net in ipaddress.ip_network("198.18.0.0/15").subnets(new_prefix=30):
        if not any(net.overlaps(u) for u in used):
            return net
    raise AssertionError("no /30 of 198.18.0.0/15 is free for the outside test host")


@pytest.fixture
def outside_host():
    """``ip:port`` of a web server on a test host this machine makes, beyond every Docker network.

    A network namespace behind a veth pair, on a /30 of 198.18.0.0/15 (the
    benchmarking range) that no route of this machine overlaps: traffic to it
    leaves a container's network the way traffic to the internet does (through
    the host, masqueraded), and never leaves this machine.
    """
    name = f"wbt-{uuid.uuid4().hex[:6]}"
    net = _free_test_net()
    host_ip, ns_ip = (str(a) for a in list(net.hosts())[:2])

    def run(*a: str) -> subprocess.CompletedProcess:
        return subprocess.run(a, check=True, capture_output=True, text=True)

    run("ip", "netns", "add", name)
    server = None
    try:
        run("ip", "link", "add", f"{name}-h", "type", "veth", "peer", "name", f"{name}-n")
        run("ip", "link", "set", f"{name}-n", "netns", name)
        run("ip", "addr", "add", f"{host_ip}/30", "dev", f"{name}-h")
        run("ip", "link", "set", f"{name}-h", "up")
        for cmd in (
            ("ip", "addr", "add", f"{ns_ip}/30", "dev", f"{name}-n"),
            ("ip", "link", "set", f"{name}-n", "up"),
            ("ip", "route", "add", "default", "via", host_ip),
        ):
            run("ip", "netns", "exec", name, *cmd)
        server = subprocess.Popen(["ip", "netns", "exec", name, sys.executable, "-c", TINY_HTTP, ns_ip, "8765"])
        for _ in range(50):
            try:
                socket.create_connection((ns_ip, 8765), 1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield f"{ns_ip}:8765"
    finally:
        if server:
            server.kill()
            server.wait(5)
        subprocess.run(["ip", "link", "del", f"{name}-h"], capture_output=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def restart_dockerd() -> None:
    """Stop the Docker daemon (its containers stop with it) and start it again with the test script.

    Alone on the engine (``docker_engine_use``): a Kubernetes test in the other lane, whose pods are
    containers of this daemon, ends first, and none starts until the daemon is back."""
    with docker_engine_use(exclusive=True):
        pid = int(Path("/var/run/docker.pid").read_text().strip())
        os.kill(pid, signal.SIGTERM)
        for _ in range(600):
            if not Path(f"/proc/{pid}").exists():
                break
            time.sleep(0.1)
        script = str(REPO / "tests" / "docker" / "start-dockerd.sh")
        proc = subprocess.run(["bash", script], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]


def lab_in_chromium(browser, hub_url: str, user: str, screenshot: str = "") -> None:
    """``user`` (an admin, so authorized at once) signs up, logs in and sees their running server's JupyterLab."""
    from tests.browser.test_login_to_lab import _artifact, log_in, sign_up

    context = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        page = context.new_page()
        page.set_default_timeout(60_000)
        assert "The signup was successful!" in sign_up(page, hub_url, user)
        log_in(page, hub_url, user)
        page.wait_for_load_state()
        page.goto(f"{hub_url}/user/{user}/lab")
        page.wait_for_selector("#jp-main-dock-panel", timeout=120_000)
        page.wait_for_selector(".jp-DirListing-item:has-text('notebooks')")
        if screenshot:
            page.screenshot(path=str(_artifact(screenshot)))
    finally:
        context.close()
