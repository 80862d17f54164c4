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
from pathlib import Path

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
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


@pytest.fixture(scope="module")
def compose() -> dict:
    return resolved_compose({})


# Set by the compose file itself (the container's own paths, ports and network).
SET_BY_COMPOSE = {
    "WORKBENCH_BACKEND",
    "WORKBENCH_IP",
    "WORKBENCH_PORT",
    "WORKBENCH_DATA_DIR",
    "WORKBENCH_SERVICE_PORT",
    "WORKBENCH_HUB_API_PORT",
    "WORKBENCH_PROXY_API_PORT",
}


# Settings compose also uses itself (a port mapping, a mount) need a value of their shape.
SHAPED_VALUES = {
    "WORKBENCH_PUBLISH_IP": "192.0.2.10",
    "WORKBENCH_SSL_CERT": "/etc/ssl/wb/cert.pem",
    "WORKBENCH_SSL_KEY": "/etc/ssl/wb/key.pem",
}


def test_every_documented_setting_reaches_the_hub_container():
    """What the README's configuration table (and its docker settings) documents, an operator can set
    in .env for `docker compose up`; a setting compose silently dropped would look ignored."""
    readme = (REPO / "README.md").read_text()
    table = re.findall(r"^\| (`WORKBENCH_[A-Z_]+`(?:, `WORKBENCH_[A-Z_]+`)*) \|", readme, re.MULTILINE)
    documented = {name for cell in table for name in re.findall(r"WORKBENCH_[A-Z_]+", cell)}
    documented |= {"WORKBENCH_IMAGES", "WORKBENCH_MEM_LIMIT", "WORKBENCH_CPU_LIMIT"}
    assert {"WORKBENCH_PROFILES", "WORKBENCH_QUEUE_TIMEOUT"} <= documented, "the README table was not found"
    settings = {name: SHAPED_VALUES.get(name, f"value-of-{name.lower()}") for name in documented - SET_BY_COMPOSE}
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
    assert any(target == "8000/tcp" for _, _, target in host_ports(hub))
    devices = hub["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia"
    assert "gpu" in devices[0]["capabilities"]
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
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=env,
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


# -- HTTPS: nothing is served beyond this host without TLS --------------------------------------


def host_ports(service: dict) -> list[tuple[str, str, str]]:
    """(host address, host port, container port/protocol) of each published port, '' for every address."""
    result = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            result.append(
                (
                    port.get("host_ip", ""),
                    str(port.get("published", "")),
                    f"{port['target']}/{port.get('protocol', 'tcp')}",
                )
            )
        else:
            *host, published, target = port.split(":")
            result.append((host[0] if host else "", published, target if "/" in target else f"{target}/tcp"))
    return result


def test_plain_compose_up_publishes_the_hub_on_loopback_only(compose):
    hub = compose["services"]["hub"]
    assert host_ports(hub) == [("127.0.0.1", "8000", "8000/tcp")]
    # inside its container the hub listens on every address; it checks the host side
    assert hub["environment"]["WORKBENCH_IP"] == "0.0.0.0"
    assert hub["environment"]["WORKBENCH_PUBLISH_IP"] == "127.0.0.1"
    assert hub["environment"].get("WORKBENCH_ALLOW_HTTP") is None, "compose must not switch the refusal off"


def test_the_hub_checks_the_address_its_port_is_published_on():
    hub = resolved_compose({"WORKBENCH_PUBLISH_IP": "0.0.0.0", "WORKBENCH_PORT": "443"})["services"]["hub"]
    assert host_ports(hub) == [("0.0.0.0", "443", "8000/tcp")]
    assert hub["environment"]["WORKBENCH_PUBLISH_IP"] == "0.0.0.0"


def test_the_operators_certificate_is_mounted_read_only_at_the_same_path():
    cert, key = (
        "/etc/letsencrypt/live/gpu.example.org/fullchain.pem",
        "/etc/letsencrypt/live/gpu.example.org/privkey.pem",
    )
    hub = resolved_compose({"WORKBENCH_SSL_CERT": cert, "WORKBENCH_SSL_KEY": key})["services"]["hub"]
    assert hub["environment"]["WORKBENCH_SSL_CERT"] == cert
    assert hub["environment"]["WORKBENCH_SSL_KEY"] == key
    assert f"{cert}:{cert}:ro" in hub["volumes"]
    assert f"{key}:{key}:ro" in hub["volumes"]
    # without them, placeholders nothing reads (and no variable points at them)
    plain = resolved_compose({})["services"]["hub"]
    assert {"/dev/null:/run/workbench-no-cert:ro", "/dev/null:/run/workbench-no-key:ro"} <= set(plain["volumes"])
    assert plain["environment"].get("WORKBENCH_SSL_CERT") is None


def _profile(profile: str, settings: dict[str, str]) -> dict:
    yaml = pytest.importorskip("yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKBENCH_")} | settings
    proc = subprocess.run(
        [shutil.which("docker-compose"), "-f", str(COMPOSE_FILE), "--profile", profile, "config"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


HTTPS_SETTINGS = {"WORKBENCH_DOMAIN": "gpu.example.org", "WORKBENCH_ACME_EMAIL": "gpu-admin@example.org"}


def test_https_profile_puts_caddy_in_front(compose):
    assert compose["services"]["caddy"]["profiles"] == ["https"], "Caddy starts only with its profile"
    resolved = _profile("https", HTTPS_SETTINGS)
    caddy, hub = resolved["services"]["caddy"], resolved["services"]["hub"]
    assert os.path.realpath(caddy["build"]["context"]) == str(REPO / "images" / "https")
    assert (REPO / "images" / "https" / "Dockerfile").is_file()
    assert caddy["build"]["args"]["BASE_IMAGE"] == "debian:bookworm-slim"
    assert sorted(host_ports(caddy)) == [("", "443", "443/tcp"), ("", "443", "443/udp"), ("", "80", "80/tcp")]
    assert caddy["environment"]["WORKBENCH_DOMAIN"] == "gpu.example.org"
    assert caddy["environment"]["WORKBENCH_ACME_EMAIL"] == "gpu-admin@example.org"
    assert "WORKBENCH_ACME_CA" in caddy["environment"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in caddy["volumes"]}
    assert Path(mounts["/etc/caddy/Caddyfile"]) == REPO / "images" / "https" / "Caddyfile"
    assert resolved["volumes"][mounts["/data"]]["name"] == "gpu-workbench-caddy-data", "certificates must persist"
    assert caddy["networks"].keys() == hub["networks"].keys()
    # the hub learns its public https:// address and stays on loopback behind Caddy
    assert hub["environment"]["WORKBENCH_DOMAIN"] == "gpu.example.org"
    assert host_ports(hub) == [("127.0.0.1", "8000", "8000/tcp")]
    assert not any("docker.sock" in str(v) for v in caddy["volumes"])


def test_caddyfile_gets_certificates_redirects_and_proxies_to_the_hub():
    """`caddy adapt` (Debian's caddy, as in the image) turns the shipped Caddyfile into Caddy's JSON."""
    import json

    caddy = shutil.which("caddy")
    if caddy is None:
        if os.environ.get("WORKBENCH_STRICT_TESTS") == "1":
            pytest.fail("caddy not installed (apt-get install caddy)")
        pytest.skip("caddy not installed (apt-get install caddy)")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("WORKBENCH_")}, **HTTPS_SETTINGS}
    proc = subprocess.run(
        [caddy, "adapt", "--adapter", "caddyfile", "--config", str(REPO / "images/https/Caddyfile")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "warn" not in proc.stderr.lower(), proc.stderr
    config = json.loads(proc.stdout)
    (server,) = config["apps"]["http"]["servers"].values()
    assert server["listen"] == [":443"]
    # automatic HTTPS (certificates and the http -> https redirect) is not switched off
    assert "automatic_https" not in server
    (route,) = server["routes"]
    assert route["match"] == [{"host": ["gpu.example.org"]}]
    handlers = [h for sub in route["handle"][0]["routes"] for h in sub["handle"]]
    headers = next(h for h in handlers if h["handler"] == "headers")
    assert headers["response"]["set"]["Strict-Transport-Security"] == ["max-age=31536000"]
    assert headers["response"]["deferred"] is True
    proxy = next(h for h in handlers if h["handler"] == "reverse_proxy")
    assert proxy["upstreams"] == [{"dial": "hub:8000"}]
    (policy,) = config["apps"]["tls"]["automation"]["policies"]
    assert policy["subjects"] == ["gpu.example.org"]
    assert policy["issuers"] == [
        {"ca": "https://acme-v02.api.letsencrypt.org/directory", "email": "gpu-admin@example.org", "module": "acme"}
    ]
    assert config["admin"] == {"disabled": True}


def test_monitoring_is_reachable_from_this_host_only():
    services = _profile("monitoring", {})["services"]
    assert host_ports(services["grafana"]) == [("127.0.0.1", "3000", "3000/tcp")]
    assert host_ports(services["prometheus"]) == []


@pytest.mark.parametrize(
    ("cert", "scheme", "tls_config"),
    [("", "http", None), ("/etc/ssl/wb/cert.pem", "https", {"insecure_skip_verify": True})],
)
def test_prometheus_scrapes_the_hub_in_its_scheme(tmp_path, cert, scheme, tls_config):
    """The prometheus service's start command, run with sh against the shipped prometheus.yml
    (the prom/prometheus image is not needed): with the operator's certificate the hub's port speaks HTTPS."""
    yaml = pytest.importorskip("yaml")
    command = _profile("monitoring", {})["services"]["prometheus"]["command"][0].replace("$$", "$")
    # /tmp/ first: the checkout itself may live under /tmp (CI clones there)
    command = (
        command.replace("/tmp/", f"{tmp_path}/")
        .replace("/etc/prometheus/prometheus.yml", str(REPO / "monitoring" / "prometheus.yml"))
        .replace("exec /bin/prometheus", "exec echo prometheus")
    )
    proc = subprocess.run(
        ["sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": os.environ["PATH"], "WORKBENCH_METRICS_TOKEN": "t" * 32, "WORKBENCH_SSL_CERT": cert},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("prometheus --config.file="), proc.stderr
    (job,) = yaml.safe_load((tmp_path / "prometheus.yml").read_text())["scrape_configs"]
    assert job["scheme"] == scheme
    assert job.get("tls_config") == tls_config
    assert (tmp_path / "workbench-token").read_text() == "t" * 32
