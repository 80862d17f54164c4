"""docker-compose.yml: valid for Compose, and shaped as the design says.

Validated by `docker-compose config` (Debian's docker-compose package) when it
is installed, and structurally with PyYAML on the resolved file. No engine
needed for these.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from tests.docker.conftest import REPO

pytestmark = pytest.mark.docker

COMPOSE_FILE = REPO / "docker-compose.yml"


def resolved_compose(settings: dict[str, str]) -> dict:
    """`docker-compose config` with only these WORKBENCH_* variables in the environment."""
    yaml = pytest.importorskip("yaml")
    tool = shutil.which("docker-compose")
    if tool is None:
        if os.environ.get("WORKBENCH_STRICT_TESTS") == "1":
            pytest.fail("docker-compose not installed (apt-get install docker-compose)")
        pytest.skip("docker-compose not installed (apt-get install docker-compose)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKBENCH_")} | settings
    proc = subprocess.run(
        [tool, "-f", str(COMPOSE_FILE), "config"],
        capture_output=True, text=True, timeout=60, cwd=REPO, env=env,
    )
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


@pytest.fixture(scope="module")
def compose() -> dict:
    return resolved_compose({})


# Set by the compose file itself (the container's own paths, ports and network).
SET_BY_COMPOSE = {"WORKBENCH_BACKEND", "WORKBENCH_IP", "WORKBENCH_PORT", "WORKBENCH_DATA_DIR",
                  "WORKBENCH_SERVICE_PORT", "WORKBENCH_HUB_API_PORT", "WORKBENCH_PROXY_API_PORT"}


def test_every_documented_setting_reaches_the_hub_container():
    """What the README's configuration table (and its docker settings) documents, an operator can set
    in .env for `docker compose up`; a setting compose silently dropped would look ignored."""
    readme = (REPO / "README.md").read_text()
    table = re.findall(r"^\| (`WORKBENCH_[A-Z_]+`(?:, `WORKBENCH_[A-Z_]+`)*) \|", readme, re.MULTILINE)
    documented = {name for cell in table for name in re.findall(r"WORKBENCH_[A-Z_]+", cell)}
    documented |= {"WORKBENCH_IMAGES", "WORKBENCH_MEM_LIMIT", "WORKBENCH_CPU_LIMIT"}
    assert {"WORKBENCH_PROFILES", "WORKBENCH_QUEUE_TIMEOUT"} <= documented, "the README table was not found"
    settings = {name: f"value-of-{name.lower()}" for name in documented - SET_BY_COMPOSE}
    env = resolved_compose(settings)["services"]["hub"]["environment"]
    dropped = sorted(name for name, value in settings.items() if env.get(name) != value)
    assert not dropped, f"docker-compose.yml does not pass these through to the hub: {dropped}"


def test_compose_builds_both_images_from_the_real_dockerfiles(compose):
    services = compose["services"]
    for name, dockerfile in [("hub", "images/hub/Dockerfile"), ("singleuser", "images/singleuser/Dockerfile")]:
        build = services[name]["build"]
        assert os.path.realpath(build["context"]) == str(REPO)
        assert build["dockerfile"] == dockerfile
        assert (REPO / dockerfile).is_file()
    assert services["singleuser"]["build"]["args"]["BASE_IMAGE"].startswith("pytorch/pytorch:2.7.1-cuda12")
    assert services["hub"]["environment"]["WORKBENCH_IMAGE"] == services["singleuser"]["image"]


def test_hub_service(compose):
    hub = compose["services"]["hub"]
    env = hub["environment"]
    assert env["WORKBENCH_BACKEND"] == "docker"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert any(p["target"] == 8000 for p in hub["ports"])
    devices = hub["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in hub["volumes"]}
    assert mounts["/var/run/docker.sock"] == "/var/run/docker.sock"
    data = mounts[env["WORKBENCH_DATA_DIR"]]
    assert data in compose["volumes"], "the data dir must be a named volume"
    net = compose["networks"][hub["networks"] and next(iter(hub["networks"]))]
    assert net["name"] == env["WORKBENCH_DOCKER_NETWORK"]


def test_docker_socket_only_in_the_hub(compose):
    for name, service in compose["services"].items():
        if name == "hub":
            continue
        assert not any("docker.sock" in str(v) for v in service.get("volumes", [])), name
        assert not service.get("privileged"), name


def test_singleuser_service_only_builds(compose):
    su = compose["services"]["singleuser"]
    assert su["entrypoint"] == ["/bin/true"]
    assert su["restart"] == "no"


def test_hub_listens_beyond_its_container(compose):
    assert compose["services"]["hub"]["environment"]["WORKBENCH_IP"] == "0.0.0.0"


def test_monitoring_profile_mounts_the_shipped_config(compose):
    yaml = pytest.importorskip("yaml")
    for name in ("prometheus", "grafana"):
        assert compose["services"][name]["profiles"] == ["monitoring"], "monitoring starts only with its profile"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKBENCH_")}
    proc = subprocess.run(
        [shutil.which("docker-compose"), "-f", str(COMPOSE_FILE), "--profile", "monitoring", "config"],
        capture_output=True, text=True, timeout=60, cwd=REPO, env=env,
    )
    assert proc.returncode == 0, proc.stderr
    services = yaml.safe_load(proc.stdout)["services"]
    for name in ("prometheus", "grafana"):
        for volume in services[name]["volumes"]:
            source = volume["source"] if isinstance(volume, dict) else volume.split(":")[0]
            if source.startswith(("/", ".")):
                assert os.path.exists(source if source.startswith("/") else REPO / source), source
    assert "WORKBENCH_METRICS_TOKEN" in services["prometheus"]["environment"]
    assert "WORKBENCH_METRICS_TOKEN" in services["hub"]["environment"]
