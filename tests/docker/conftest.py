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

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

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
