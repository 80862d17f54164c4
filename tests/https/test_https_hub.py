"""The hub serves other machines over HTTPS only: the operator's certificate, a proxy in front, or nothing.

A real hub with its real proxy (configurable-http-proxy) and the local backend;
the certificates come from a CA the test makes (tests/https/certs.py).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.browser.test_login_to_lab import PASSWORD, log_in
from tests.conftest import ARTIFACTS, REPO, free_port, missing
from tests.https.certs import NOW
from tests.https.conftest import TEST_NAME
from tests.lab_browser import wait_for_lab

pytestmark = pytest.mark.integration

HSTS = "max-age=31536000"


def start_refused(tmp_path: Path, env: dict[str, str], prefix: list[str] | None = None) -> subprocess.CompletedProcess:
    """Start the hub as `make run` does; it must stop before anything listens."""
    env = {
        **os.environ,
        "WORKBENCH_DATA_DIR": str(tmp_path / "data"),
        "WORKBENCH_SIMULATED_GPUS": "1",
        "WORKBENCH_PORT": str(free_port()),
        **env,
    }
    command = [str(Path(sys.executable).parent / "jupyterhub"), "-f", str(REPO / "hub" / "jupyterhub_config.py")]
    return subprocess.run(
        [*(prefix or []), *command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )


def assert_one_sentence_exit_2(r: subprocess.CompletedProcess, sentence: str) -> None:
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [line for line in r.stderr.splitlines() if line.startswith("GPU Workbench: ")]
    assert len(lines) == 1, r.stderr[-2000:]
    assert sentence in lines[0], lines[0]
    assert "Traceback" not in r.stderr
    # nothing started: no proxy, no database
    assert "Starting proxy" not in r.stderr
    assert not (Path(r.args[0]).parent / "jupyterhub.sqlite").exists()


def test_plain_http_on_every_address_is_refused_with_the_two_ways_out(tmp_path):
    r = start_refused(tmp_path, {"WORKBENCH_IP": "0.0.0.0"})
    assert_one_sentence_exit_2(
        r,
        "GPU Workbench: the proxy's address 0.0.0.0 serves other machines over plain HTTP, so passwords and tokens "
        "would cross the network in clear: set WORKBENCH_SSL_CERT and WORKBENCH_SSL_KEY (PEM files) to serve HTTPS, "
        "or set WORKBENCH_ALLOW_HTTP=1 if a TLS-terminating proxy in front forwards X-Forwarded-Proto",
    )


@pytest.fixture(scope="module")
def bad_certs(test_ca):
    d, ca = test_ca["dir"], test_ca["ca"]
    expired = ca.write(
        d, "expired", TEST_NAME, not_before=NOW - dt.timedelta(days=400), not_after=NOW - dt.timedelta(days=3)
    )
    other = ca.write(d, "other", TEST_NAME)
    (d / "not-a-cert.pem").write_text("this is a password, not a certificate\n")
    return {"expired": expired, "other": other, "garbage": d / "not-a-cert.pem"}


@pytest.mark.parametrize(
    ("case", "sentence"),
    [
        ("missing", "WORKBENCH_SSL_CERT={cert}.missing does not exist"),
        ("not PEM", "WORKBENCH_SSL_CERT={garbage} is not a PEM certificate"),
        (
            "key of another certificate",
            "WORKBENCH_SSL_KEY={other_key} is not the key of the certificate in "
            "WORKBENCH_SSL_CERT={cert} (their public keys differ)",
        ),
        ("expired", "the certificate in WORKBENCH_SSL_CERT={expired} (CN=workbench.test) expired on {expired_on}"),
        ("only the certificate", "WORKBENCH_SSL_KEY is not set: set both WORKBENCH_SSL_CERT and WORKBENCH_SSL_KEY"),
    ],
)
def test_a_bad_certificate_stops_the_hub_at_start(tmp_path, test_ca, bad_certs, case, sentence):
    cert, key = str(test_ca["cert"]), str(test_ca["key"])
    env = {
        "missing": {"WORKBENCH_SSL_CERT": cert + ".missing", "WORKBENCH_SSL_KEY": key},
        "not PEM": {"WORKBENCH_SSL_CERT": str(bad_certs["garbage"]), "WORKBENCH_SSL_KEY": key},
        "key of another certificate": {"WORKBENCH_SSL_CERT": cert, "WORKBENCH_SSL_KEY": str(bad_certs["other"][1])},
        "expired": {
            "WORKBENCH_SSL_CERT": str(bad_certs["expired"][0]),
            "WORKBENCH_SSL_KEY": str(bad_certs["expired"][1]),
        },
        "only the certificate": {"WORKBENCH_SSL_CERT": cert},
    }[case]
    r = start_refused(tmp_path, {"WORKBENCH_IP": "0.0.0.0", **env})
    assert_one_sentence_exit_2(
        r,
        "GPU Workbench: "
        + sentence.format(
            cert=cert,
            garbage=bad_certs["garbage"],
            other_key=bad_certs["other"][1],
            expired=bad_certs["expired"][0],
            expired_on=f"{NOW - dt.timedelta(days=3):%Y-%m-%d}",
        ),
    )


def test_an_unreadable_key_stops_the_hub_at_start(tmp_path, test_ca):
    key = tmp_path / "key.pem"
    key.write_bytes(test_ca["key"].read_bytes())
    key.chmod(0)
    prefix = []
    if os.geteuid() == 0:
        # root reads every file: start the hub without the capabilities that let it (util-linux's setpriv)
        if shutil.which("setpriv") is None:
            missing("setpriv is not installed (apt-get install util-linux)")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]
    r = start_refused(tmp_path, {"WORKBENCH_SSL_CERT": str(test_ca["cert"]), "WORKBENCH_SSL_KEY": str(key)}, prefix)
    assert_one_sentence_exit_2(
        r, f"GPU Workbench: WORKBENCH_SSL_KEY={key} cannot be read by the hub (uid {os.geteuid()})"
    )


# -- behind a TLS-terminating proxy ---------------------------------------------------------------


# These hubs serve other machines (or stand for one that does): the admin's account is made at start from
# WORKBENCH_ADMIN_PASSWORD, not by whoever signs up first (workbench_hub/first_admin.py).
FIRST_ADMIN = {"WORKBENCH_ADMIN_PASSWORD": PASSWORD}


def logged_in_as_admin(url: str, headers: dict[str, str]) -> requests.Response:
    """Log in as the admin (made at start from ``FIRST_ADMIN``) with the form, as a browser would; the
    login's answer (not followed)."""
    s = requests.Session()
    s.get(f"{url}/hub/login", headers=headers, timeout=30)
    xsrf = s.cookies.get("_xsrf")
    # Sent by hand: requests keeps a Secure cookie to https:// URLs, and here the "TLS proxy in front" is
    # this test, talking plain HTTP to our proxy (a browser talks HTTPS to the real one, and sends it).
    cookies = {"_xsrf": xsrf}
    return s.post(
        f"{url}/hub/login?next=",
        data={"username": "admin", "password": PASSWORD, "_xsrf": xsrf},
        headers=headers,
        cookies=cookies,
        allow_redirects=False,
        timeout=30,
    )


def set_cookies(r: requests.Response) -> dict[str, str]:
    """name -> the whole Set-Cookie line (attributes lower-cased), from the raw answer."""
    return {line.split("=", 1)[0]: line.lower() for line in r.raw.headers.getlist("Set-Cookie")}


def test_behind_a_tls_proxy_the_hub_trusts_x_forwarded_proto(running_hub):
    """WORKBENCH_ALLOW_HTTP=1: no refusal on 0.0.0.0, and what a TLS proxy in front says about the
    browser's connection reaches the hub through our proxy, so its session cookies are Secure."""
    hub = running_hub(
        {"WORKBENCH_IP": "0.0.0.0", "WORKBENCH_ALLOW_HTTP": "1", "WORKBENCH_SIMULATED_GPUS": "1", **FIRST_ADMIN}
    )
    assert "--no-x-forward" in _proxy_command(hub)
    login = logged_in_as_admin(hub.url, {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.9"})
    assert login.status_code == 302, login.text[-1000:]
    cookies = set_cookies(login)
    for name in ("jupyterhub-session-id", "jupyterhub-hub-login"):
        assert "; secure" in cookies[name], cookies
        assert "; httponly" in cookies[name], cookies
        assert "; samesite=lax" in cookies[name], cookies
    # _xsrf too (JupyterHub leaves it out; workbench_hub/xsrf_cookie.py), on the hub's path as JupyterHub sets it
    assert "; secure" in cookies["_xsrf"], cookies
    assert "; path=/hub/" in cookies["_xsrf"], cookies
    assert login.headers["Strict-Transport-Security"] == HSTS
    assert "HTTPS: terminated by the proxy in front" in hub.log()

    # A request that did not come through the TLS proxy (no header) is not taken for HTTPS: none of the
    # cookies it gets is Secure, _xsrf included (a browser would drop a Secure one on plain HTTP).
    r = requests.get(f"{hub.url}/hub/login", timeout=30)
    assert "_xsrf" in set_cookies(r), set_cookies(r)
    assert all("; secure" not in line for line in set_cookies(r).values()), set_cookies(r)
    # And the header still decides per request, after the plain one, on the same hub.
    r = requests.get(f"{hub.url}/hub/login", headers={"X-Forwarded-Proto": "https"}, timeout=30)
    assert "; secure" in set_cookies(r)["_xsrf"], set_cookies(r)


def _proxy_command(hub) -> str:
    pid = int((hub.data_dir / "jupyterhub-proxy.pid").read_text())
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def test_why_our_proxy_must_not_add_its_own_x_forwarded_proto(running_hub, tmp_path):
    """The reason for --no-x-forward, kept as a fact: configurable-http-proxy appends ",http" to the
    front proxy's X-Forwarded-Proto and JupyterHub (tornado: the last entry) then sets no Secure.
    If a JupyterHub release reads the first entry instead, this test says the flag is no longer needed."""
    local = tmp_path / "local_config.py"
    chp = REPO / "node_modules" / ".bin" / "configurable-http-proxy"
    local.write_text(f"c = get_config()\nc.ConfigurableHTTPProxy.command = [{str(chp)!r}]\n")
    hub = running_hub(
        {
            "WORKBENCH_IP": "0.0.0.0",
            "WORKBENCH_ALLOW_HTTP": "1",
            "WORKBENCH_SIMULATED_GPUS": "1",
            "WORKBENCH_LOCAL_CONFIG": str(local),
            **FIRST_ADMIN,
        }
    )
    assert "--no-x-forward" not in _proxy_command(hub)
    login = logged_in_as_admin(hub.url, {"X-Forwarded-Proto": "https"})
    assert login.status_code == 302, login.text[-1000:]
    assert "; secure" not in set_cookies(login)["jupyterhub-session-id"], set_cookies(login)


# -- the operator's certificate -------------------------------------------------------------------


def test_with_the_operators_certificate_every_cookie_is_secure_xsrf_included(tls_hub, test_ca):
    """Over HTTPS the hub's _xsrf cookie carries Secure, as its session cookies do: on the login page
    a browser gets first, and on the login's answer."""
    hub = tls_hub(
        {
            "WORKBENCH_SSL_CERT": str(test_ca["cert"]),
            "WORKBENCH_SSL_KEY": str(test_ca["key"]),
            "WORKBENCH_SIMULATED_GPUS": "1",
            **FIRST_ADMIN,
        },
        ca_pem=test_ca["ca_pem"],
    )
    assert hub.url.startswith("https://")
    page = requests.get(f"{hub.url}/hub/login", timeout=30)
    assert page.status_code == 200
    assert "; secure" in set_cookies(page)["_xsrf"], set_cookies(page)
    login = logged_in_as_admin(hub.url, {})
    assert login.status_code == 302, login.text[-1000:]
    cookies = set_cookies(login)
    assert {"_xsrf", "jupyterhub-session-id", "jupyterhub-hub-login"} <= set(cookies), cookies
    assert all("; secure" in line for line in cookies.values()), cookies
    assert all("; samesite=lax" in line for line in cookies.values()), cookies


@pytest.mark.browser
def test_with_the_operators_certificate_chromium_logs_in_over_https(tls_hub, trusting_chromium, test_ca):
    hub = tls_hub(
        {
            "WORKBENCH_IP": "0.0.0.0",
            "WORKBENCH_SSL_CERT": str(test_ca["cert"]),
            "WORKBENCH_SSL_KEY": str(test_ca["key"]),
            "WORKBENCH_SIMULATED_GPUS": "2",
            **FIRST_ADMIN,
        },
        ca_pem=test_ca["ca_pem"],
    )
    assert f"at https://{TEST_NAME}:{hub.port}/" in hub.log()
    assert "HTTPS: certificate for workbench.test, 127.0.0.1, valid until" in hub.log()

    # Plain HTTP to the HTTPS port gets no page and no cookie.
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{hub.port}/hub/login", timeout=10)
    # The certificate is verified against the test CA, not ignored.
    r = requests.get(f"{hub.url}/hub/login", timeout=10, verify=str(test_ca["ca_pem"]))
    assert r.status_code == 200
    assert r.headers["Strict-Transport-Security"] == HSTS
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(
            f"{hub.url}/hub/login",
            timeout=10,
            verify=True if not os.environ.get("REQUESTS_CA_BUNDLE") else "/etc/ssl/certs/ca-certificates.crt",
        )

    browser = trusting_chromium(test_ca["ca_pem"], {TEST_NAME: "127.0.0.1"})
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(60_000)
    url = f"https://{TEST_NAME}:{hub.port}"
    first = page.goto(f"{url}/hub/login")
    assert first.headers["strict-transport-security"] == HSTS
    log_in(page, url, "admin")  # the account WORKBENCH_ADMIN_PASSWORD made at start
    page.wait_for_url("**/hub/spawn**")
    page.click("form#spawn_form [type=submit]")
    wait_for_lab(page, f"https://{TEST_NAME}:{hub.port}", "admin", log=hub.log)
    page.wait_for_selector(".jp-Launcher, .jp-DirListing-item", timeout=60_000)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "https-operator-cert-lab.png"))

    cookies = {c["name"]: c for c in context.cookies()}
    for name in ("jupyterhub-session-id", "jupyterhub-hub-login", "jupyterhub-user-admin"):
        assert cookies[name]["secure"], cookies.get(name)
        assert cookies[name]["httpOnly"], cookies.get(name)
    # The browser remembers HSTS for the host: a plain http:// link is upgraded before it leaves the browser.
    page.goto(f"http://{TEST_NAME}:{hub.port}/hub/home")
    assert page.url.startswith(f"https://{TEST_NAME}:{hub.port}/hub/home"), page.url
    context.close()
