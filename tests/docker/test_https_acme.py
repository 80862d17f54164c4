"""docker-compose.yml's `https` profile for real: Caddy (built from Debian's package on the test base)
gets a certificate by ACME from Pebble, Let's Encrypt's test server, and serves the hub over HTTPS to
Chromium, which logs in and reaches JupyterLab in a user container.

The compose file is the real one, resolved by `docker-compose --profile https config`; the test then
changes only what this machine needs (each change listed in `derived_compose`): its test images instead
of the registry's, no GPU reservation, names of its own, and Pebble beside Caddy as the ACME CA.
Pebble validates for real (no PEBBLE_VA_ALWAYS_VALID): it resolves workbench.test through Docker's DNS
to Caddy's container and connects to its ports 80 (HTTP-01) or 443 (TLS-ALPN-01).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import requests
import urllib3

from tests.browser.test_login_to_lab import PASSWORD, log_in
from tests.conftest import ARTIFACTS, missing
from tests.docker.conftest import REPO, SINGLEUSER_IMAGE, docker, inspect, remove_user_objects
from tests.https.certs import CA
from tests.https.conftest import trusting_chromium as trusting_chromium  # a fixture, for pytest to find
from tests.lab_browser import explained, wait_for_lab

pytestmark = [pytest.mark.docker, pytest.mark.integration]

DOMAIN = "workbench.test"
HTTPS_IMAGE = "gpu-workbench/https:test"
PEBBLE = "/usr/bin/pebble"


@pytest.fixture(scope="session")
def https_image(base_image) -> str:
    """images/https/Dockerfile on the test base (Debian's caddy from apt), cached by its inputs."""
    context = REPO / "images" / "https"
    digest = hashlib.sha256()
    for path in sorted(context.iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update(inspect(base_image)["Id"].encode())
    h = digest.hexdigest()
    labels = (
        (inspect(HTTPS_IMAGE)["Config"]["Labels"] or {})
        if docker("image", "inspect", HTTPS_IMAGE, check=False).returncode == 0
        else {}
    )
    if labels.get("workbench.input-hash") != h:
        docker(
            "build",
            "-q",
            "--label",
            f"workbench.input-hash={h}",
            "--build-arg",
            f"BASE_IMAGE={base_image}",
            "-t",
            HTTPS_IMAGE,
            str(context),
            timeout=900,
            env={**os.environ, "DOCKER_BUILDKIT": "0"},
        )
    return HTTPS_IMAGE


def compose_tool() -> str:
    tool = shutil.which("docker-compose")
    if tool is None:
        missing("docker-compose not installed (apt-get install docker-compose)")
    return tool


def resolved_https_profile(settings: dict[str, str]) -> dict:
    yaml = pytest.importorskip("yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKBENCH_")} | settings
    proc = subprocess.run(
        [compose_tool(), "-f", str(REPO / "docker-compose.yml"), "--profile", "https", "config"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


def derived_compose(tag: str, pebble_dir: Path, hub_image: str, singleuser_image: str, hub_env: dict) -> dict:
    real = resolved_https_profile({"WORKBENCH_DOMAIN": DOMAIN, "WORKBENCH_ACME_EMAIL": f"gpu-admin@{DOMAIN}"})
    hub, caddy = real["services"]["hub"], real["services"]["caddy"]
    # what the test relies on, from the real file
    assert hub["ports"] == ["127.0.0.1:8000:8000/tcp"]
    assert "caddy" in real["services"]
    assert caddy["environment"]["WORKBENCH_DOMAIN"] == DOMAIN
    net = f"wb-acme-{tag}"
    # 1. the test images instead of building from the registry's bases; no GPU reservation (no NVIDIA runtime here)
    for service in (hub, caddy):
        service.pop("build")
    hub.pop("deploy")
    hub["image"], caddy["image"] = hub_image, HTTPS_IMAGE
    # 2. names of its own (network, volumes, ports) so that nothing of a real deployment is touched
    real["networks"]["workbench"]["name"] = net
    real["volumes"]["workbench-data"]["name"] = f"{net}-data"
    real["volumes"]["caddy-data"]["name"] = f"{net}-caddy-data"
    hub["ports"] = ["127.0.0.1::8000"]
    caddy.pop("ports")  # Chromium and Pebble reach Caddy's own ports 80 and 443 at its container address
    hub["environment"] = {k: v for k, v in hub["environment"].items() if v is not None} | {
        "WORKBENCH_IMAGE": singleuser_image,
        "WORKBENCH_DOCKER_NETWORK": net,
        **hub_env,
    }
    # 3. Pebble as the ACME CA: Caddy asks it and trusts its HTTPS (a test CA's certificate for "pebble")
    caddy["environment"] = {k: v for k, v in caddy["environment"].items() if v is not None} | {
        "WORKBENCH_ACME_CA": "https://pebble:14000/dir",
        "SSL_CERT_FILE": "/pebble/ca.pem",
    }
    caddy["volumes"].append(f"{pebble_dir}:/pebble:ro")
    caddy["networks"] = {"workbench": {"aliases": [DOMAIN]}}  # how Pebble's validation finds Caddy
    caddy["depends_on"] = {"hub": {"condition": "service_started"}, "pebble": {"condition": "service_started"}}
    real["services"] = {
        "hub": hub,
        "caddy": caddy,
        "pebble": {
            "image": "gpu-workbench/base:bookworm",
            "command": ["/usr/local/bin/pebble", "-config", "/pebble/config.json"],
            "environment": {"PEBBLE_VA_NOSLEEP": "1", "PEBBLE_WFE_NONCEREJECT": "0"},
            "volumes": [f"{PEBBLE}:/usr/local/bin/pebble:ro", f"{pebble_dir}:/pebble:ro"],
            "networks": {"workbench": {"aliases": ["pebble"]}},
        },
    }
    return real


def pebble_files(directory: Path) -> CA:
    directory.mkdir(mode=0o755)
    ca = CA.make("Pebble's HTTPS test CA")
    _cert, key = ca.write(directory, "pebble", "pebble")
    key.chmod(0o644)  # read by root in the pebble container; the directory is the test's own
    ca.write_ca(directory / "ca.pem").chmod(0o644)
    (directory / "config.json").write_text(
        json.dumps(
            {
                "pebble": {
                    "listenAddress": "0.0.0.0:14000",
                    "managementListenAddress": "0.0.0.0:15000",
                    "certificate": "/pebble/pebble.pem",
                    "privateKey": "/pebble/pebble-key.pem",
                    # validate at the ports a real CA uses
                    "httpPort": 80,
                    "tlsPort": 443,
                    "ocspResponderURL": "",
                    "externalAccountBindingRequired": False,
                }
            }
        )
    )
    return ca


def container_ip(name: str, network: str) -> str:
    return inspect(name)["NetworkSettings"]["Networks"][network]["IPAddress"]


def https_get(ip: str, port: int, host: str, path: str, ca_file: Path):
    """GET over TLS to ``ip`` with SNI and certificate check for ``host``."""
    pool = urllib3.HTTPSConnectionPool(
        ip, port, ca_certs=str(ca_file), server_hostname=host, assert_hostname=host, timeout=10, retries=False
    )
    return pool.request("GET", path, headers={"Host": host}, redirect=False)


def test_hub_container_refuses_to_be_published_beyond_loopback_without_tls(hub_image):
    """What `WORKBENCH_PUBLISH_IP=0.0.0.0 docker compose up` without a certificate does: the hub stops."""
    proc = docker(
        "run",
        "--rm",
        "-e",
        "WORKBENCH_BACKEND=docker",
        "-e",
        "WORKBENCH_IMAGE=x",
        "-e",
        "WORKBENCH_DOCKER_NETWORK=wb-none",
        "-e",
        "WORKBENCH_IP=0.0.0.0",
        "-e",
        "WORKBENCH_PUBLISH_IP=0.0.0.0",
        "-e",
        "WORKBENCH_SIMULATED_GPUS=1",
        hub_image,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert (
        "GPU Workbench: WORKBENCH_PUBLISH_IP=0.0.0.0 serves other machines over plain HTTP, so passwords "
        "and tokens would cross the network in clear: set WORKBENCH_SSL_CERT and WORKBENCH_SSL_KEY"
    ) in proc.stderr


@pytest.mark.browser
def test_https_profile_gets_a_certificate_from_pebble_and_serves_the_hub(
    request,
    tmp_path,
    hub_image,
    https_image,
    trusting_chromium,
):
    if not Path(PEBBLE).exists():
        missing(f"{PEBBLE} is not installed (apt-get install pebble)")
    singleuser = SINGLEUSER_IMAGE
    if docker("image", "inspect", singleuser, check=False).returncode != 0:
        singleuser = request.getfixturevalue("singleuser_image")
    tag = uuid.uuid4().hex[:8]
    user, token = f"acme{tag}", secrets.token_hex(16)
    project, net = f"wbacme{tag}", f"wb-acme-{tag}"
    datasets = f"{net}-datasets"
    pebble_dir = tmp_path / "pebble"
    pebble_files(pebble_dir)
    yaml = pytest.importorskip("yaml")
    compose_file = tmp_path / "docker-compose.yml"
    compose_file.write_text(
        yaml.safe_dump(
            derived_compose(
                tag,
                pebble_dir,
                hub_image,
                singleuser,
                {
                    "WORKBENCH_SIMULATED_GPUS": "1",
                    "WORKBENCH_ADMIN_USERS": user,
                    # a public domain: the admin's account is made at start (workbench_hub/first_admin.py)
                    "WORKBENCH_ADMIN_PASSWORD": PASSWORD,
                    "WORKBENCH_ADMIN_TOKEN": token,
                    "WORKBENCH_CULL_IDLE_SECONDS": "0",
                    "WORKBENCH_DATASETS_VOLUME": datasets,
                },
            )
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKBENCH_")}

    def compose(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            [compose_tool(), "-p", project, "-f", str(compose_file), "--profile", "https", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=tmp_path,
        )

    try:
        up = compose("up", "-d")  # docker compose --profile https up -d
        assert up.returncode == 0, up.stderr[-3000:]
        names = {s: compose("ps", "-q", s).stdout.strip() for s in ("hub", "caddy", "pebble")}
        assert all(names.values()), (names, compose("ps").stdout)
        caddy_ip, pebble_ip = container_ip(names["caddy"], net), container_ip(names["pebble"], net)

        # Pebble's roots are made at its start: the one its certificates chain to
        deadline = time.monotonic() + 60
        while True:
            try:
                root = https_get(pebble_ip, 15000, "pebble", "/roots/0", pebble_dir / "ca.pem").data
                break
            except urllib3.exceptions.HTTPError:  # not listening yet
                assert time.monotonic() < deadline, compose("logs", "pebble").stdout[-3000:]
                time.sleep(0.5)
        root_pem = tmp_path / "pebble-root.pem"
        root_pem.write_bytes(root)

        # Caddy orders the certificate at start; wait until it serves one that chains to Pebble's root.
        deadline = time.monotonic() + 120
        while True:
            try:
                r = https_get(caddy_ip, 443, DOMAIN, "/hub/api/", root_pem)
                if r.status == 200:
                    break
            except urllib3.exceptions.HTTPError:  # not listening yet, or not yet Pebble's certificate
                pass
            assert time.monotonic() < deadline, compose("logs").stdout[-5000:]
            time.sleep(1)
        assert json.loads(r.data)["version"] == "6.1.1"
        assert r.headers["Strict-Transport-Security"] == "max-age=31536000"

        logs = compose("logs", "caddy", "pebble").stdout
        assert "certificate obtained successfully" in logs, logs[-3000:]
        challenges = set(re.findall(r'"challenge_type":"([a-z0-9-]+)"', logs))
        assert challenges, logs[-3000:]
        assert challenges <= {"http-01", "tls-alpn-01"}, logs[-3000:]
        assert "PEBBLE_VA_ALWAYS_VALID" not in json.dumps(inspect(names["pebble"])["Config"]["Env"])
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / "https-acme-challenges.txt").write_text(
            f"challenges validated by Pebble: {', '.join(sorted(challenges))}\n"
        )

        # HTTP is redirected to HTTPS for the same URL.
        r = requests.get(
            f"http://{caddy_ip}/hub/login?next=%2Fhub%2F", headers={"Host": DOMAIN}, allow_redirects=False, timeout=10
        )
        assert r.status_code in (301, 308)
        assert r.headers["Location"] == f"https://{DOMAIN}/hub/login?next=%2Fhub%2F"
        # Behind Caddy the hub stays published on the host's loopback only.
        (binding,) = inspect(names["hub"])["HostConfig"]["PortBindings"]["8000/tcp"]
        assert binding["HostIp"] == "127.0.0.1"

        # HTTP/1.1 from this browser: Caddy speaks HTTP/2, and Chromium closes every HTTP/2 connection with
        # ERR_NETWORK_CHANGED, requests in flight included, when an address appears on this host, as one does
        # when the student's container joins the compose network. A student's browser on another machine sees
        # no such change; this one, on the Docker host, would lose the lab's first requests (the lab then stays
        # on its splash) in 4 of 10 runs here. Caddy's HTTPS, certificate and redirects are the same.
        browser = trusting_chromium(root_pem, {DOMAIN: caddy_ip}, http2=False)
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        page = context.new_page()
        page.set_default_timeout(60_000)
        url = f"https://{DOMAIN}"

        def hub_log() -> str:
            return compose("logs", "hub").stdout

        with explained(page, f"https-acme-{user}", hub_log):
            log_in(page, url, user)  # the account WORKBENCH_ADMIN_PASSWORD made at start
            page.wait_for_url("**/hub/spawn**")
            page.click("form#spawn_form [type=submit]")
        wait_for_lab(page, url, user, log=hub_log)
        page.screenshot(path=str(ARTIFACTS / "https-acme-lab.png"))
        cookies = {c["name"]: c for c in context.cookies()}
        for name in ("jupyterhub-session-id", "jupyterhub-hub-login", f"jupyterhub-user-{user}"):
            assert cookies[name]["secure"], cookies.get(name)
            assert cookies[name]["httpOnly"], cookies.get(name)
        assert cookies["_xsrf"]["secure"], "behind Caddy the form token is Secure too"
        assert f"Admin account {user} made at start" in hub_log()
        context.close()
    finally:
        compose("down", "-v", "--remove-orphans", timeout=180)
        remove_user_objects(user)
        compose("down", "-v", "--remove-orphans", timeout=180)
        docker("volume", "rm", "-f", datasets, check=False)
        docker("network", "rm", net, check=False)


@pytest.mark.parametrize(
    ("env", "sentence"),
    [
        ({}, "GPU Workbench https: set WORKBENCH_DOMAIN to the host name browsers use"),
        (
            {"WORKBENCH_DOMAIN": DOMAIN},
            "GPU Workbench https: set WORKBENCH_ACME_EMAIL, the admin e-mail the certificate "
            f"authority writes to before {DOMAIN}'s certificate expires",
        ),
    ],
)
def test_caddy_refuses_to_start_without_a_domain_and_an_admin_email(https_image, env, sentence):
    args = [arg for name, value in env.items() for arg in ("-e", f"{name}={value}")]
    proc = docker("run", "--rm", *args, https_image, check=False, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().startswith(sentence), proc.stderr


def test_caddy_runs_unprivileged_from_debians_package(https_image):
    out = docker(
        "run", "--rm", "--entrypoint", "sh", https_image, "-c", "id -un; dpkg-query -W -f '${Version}\\n' caddy"
    ).stdout.split()
    assert out[0] == "caddy", out  # not root
    assert out[1].startswith("2.6."), out  # bookworm's caddy package
