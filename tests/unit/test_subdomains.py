"""WORKBENCH_SUBDOMAIN_HOST -> JupyterHub's subdomain_host and what goes with it (workbench_hub.subdomains).

Tables of good and bad values, the names users and services get, the proxy's alias routes, the login guard on
users' hosts, the certificate that must cover the users' names, the workbench service's calls through a
host-routing proxy, and the z2jh chart's proxy flag. The real hub and Chromium: tests/integration/test_subdomains_hub.py
and tests/browser/test_subdomains_browser.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from tornado import web
from traitlets.config import Config

from tests.https.certs import CA
from workbench_hub import configurer, subdomains, tls, transport
from workbench_hub.env_values import ConfigError
from workbench_hub.service.user_servers import UserServers

REPO = Path(__file__).resolve().parents[2]
SERVICE_URL = "http://127.0.0.1:10101"


def build(env: dict[str, str]) -> Config:
    """What jupyterhub_config.py builds from ``env`` up to the subdomains (no spawner: no backend is needed)."""
    c = Config()
    data = configurer.data_dir(env, REPO)
    configurer.update_hub(c, env, data, REPO)
    transport.update_tls(c, env)
    configurer.update_services(c, env)
    subdomains.update_subdomains(c, env)
    return c


def test_unset_changes_nothing():
    c = build({})
    assert "subdomain_host" not in c.JupyterHub
    assert "subdomain_hook" not in c.JupyterHub
    assert "extra_routes" not in c.Proxy
    assert "post_auth_hook" not in c.Authenticator


@pytest.mark.parametrize(
    ("env", "origin"),
    [
        ({"WORKBENCH_SUBDOMAIN_HOST": "http://localhost:8000"}, "http://localhost:8000"),
        ({"WORKBENCH_SUBDOMAIN_HOST": " http://LOCALHOST:8000/ "}, "http://localhost:8000"),
        (
            {"WORKBENCH_SUBDOMAIN_HOST": "HTTPS://Hub.Example.EDU/", "WORKBENCH_DOMAIN": "hub.example.edu"},
            "https://hub.example.edu",
        ),
        (
            {"WORKBENCH_SUBDOMAIN_HOST": "https://gpu.example.org:8443", "WORKBENCH_ALLOW_HTTP": "1"},
            "https://gpu.example.org:8443",
        ),
    ],
)
def test_a_good_value_becomes_the_origin_with_its_hook_guard_and_routes(env, origin):
    c = build(env)
    assert c.JupyterHub.subdomain_host == origin
    assert c.JupyterHub.subdomain_hook is subdomains.user_subdomain
    assert c.Authenticator.post_auth_hook is subdomains.refuse_login_off_hub_host
    hub_host = origin.split("://")[1].split(":")[0]
    expected = {
        f"{name}/services/workbench/": SERVICE_URL for name in ("127.0.0.1", "localhost", "hub") if name != hub_host
    }
    assert c.Proxy.extra_routes == expected


@pytest.mark.parametrize(
    ("env", "sentence"),
    [
        (
            {"WORKBENCH_SUBDOMAIN_HOST": "hub.example.edu"},
            "WORKBENCH_SUBDOMAIN_HOST='hub.example.edu' is not an http:// or https:// URL: write the hub's origin, "
            "e.g. https://hub.example.edu, or http://localhost:8000 to try it on this machine",
        ),
        (
            {"WORKBENCH_SUBDOMAIN_HOST": "ftp://hub.example.edu"},
            "WORKBENCH_SUBDOMAIN_HOST='ftp://hub.example.edu' is not an http:// or https:// URL",
        ),
        (
            {"WORKBENCH_SUBDOMAIN_HOST": "http://localhost:99999"},
            "WORKBENCH_SUBDOMAIN_HOST='http://localhost:99999' is not a URL (a port is a number up to 65535)",
        ),
        (
            {"WORKBENCH_SUBDOMAIN_HOST": "http://localhost:8000/jhub/"},
            "WORKBENCH_SUBDOMAIN_HOST='http://localhost:8000/jhub/' has a path, a query or a fragment: write the "
            "origin alone (http://localhost:8000); users' servers keep their /user/NAME/ paths below it",
        ),
        (
            {"WORKBENCH_SUBDOMAIN_HOST": "http://localhost:8000/?x=1"},
            "has a path, a query or a fragment",
        ),
        (
            {"WORKBENCH_SUBDOMAIN_HOST": "http://admin:secret@localhost:8000"},
            "WORKBENCH_SUBDOMAIN_HOST must not carry a user or password: write http://localhost:8000",
        ),
        (
            {"WORKBENCH_SUBDOMAIN_HOST": "http://127.0.0.1:8000"},
            "WORKBENCH_SUBDOMAIN_HOST='http://127.0.0.1:8000' names an IP address, which has no subdomains for "
            "users' servers (NAME.127.0.0.1): write a host name with a wildcard DNS record, or "
            "http://localhost:8000 to try it on this machine",
        ),
        (
            {"WORKBENCH_SUBDOMAIN_HOST": "http://hub_1.example.edu"},
            "'hub_1.example.edu' is not a DNS host name",
        ),
        (
            # plain HTTP on loopback: browsers reach the hub over http://
            {"WORKBENCH_SUBDOMAIN_HOST": "https://localhost:8000"},
            "WORKBENCH_SUBDOMAIN_HOST='https://localhost:8000' says https:// but the hub serves plain HTTP (no "
            "WORKBENCH_SSL_CERT, WORKBENCH_DOMAIN or WORKBENCH_ALLOW_HTTP), so browsers would reach users' "
            "servers on the wrong scheme: write http://localhost:8000",
        ),
        (
            # a TLS proxy in front: browsers use https://
            {"WORKBENCH_SUBDOMAIN_HOST": "http://hub.example.edu", "WORKBENCH_ALLOW_HTTP": "1"},
            "WORKBENCH_SUBDOMAIN_HOST='http://hub.example.edu' says http:// but the hub serves HTTPS "
            "(WORKBENCH_SSL_CERT) or sits behind a TLS proxy (WORKBENCH_DOMAIN, WORKBENCH_ALLOW_HTTP), so browsers "
            "would reach users' servers on the wrong scheme: write https://hub.example.edu",
        ),
        (
            {"WORKBENCH_SUBDOMAIN_HOST": "https://other.example.edu", "WORKBENCH_DOMAIN": "hub.example.edu"},
            "WORKBENCH_SUBDOMAIN_HOST='https://other.example.edu' names other.example.edu, but WORKBENCH_DOMAIN is "
            "hub.example.edu: the hub and its users' subdomains share one name; write https://hub.example.edu",
        ),
    ],
)
def test_a_bad_value_stops_the_hub_with_one_sentence(env, sentence):
    with pytest.raises(ConfigError, match=re.escape(sentence)):
        build(env)


def test_the_config_file_prints_the_sentence_and_exits_2(tmp_path):
    """The whole path: jupyterhub -f hub/jupyterhub_config.py with a path in the value stops before anything
    listens, with ``GPU Workbench: ...`` and status 2."""
    import os
    import subprocess
    import sys

    env = {
        **os.environ,
        "WORKBENCH_DATA_DIR": str(tmp_path),
        "WORKBENCH_SUBDOMAIN_HOST": "http://localhost:8000/hub/",
    }
    done = subprocess.run(
        [str(Path(sys.executable).parent / "jupyterhub"), "-f", str(REPO / "hub" / "jupyterhub_config.py")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert (
        "GPU Workbench: WORKBENCH_SUBDOMAIN_HOST='http://localhost:8000/hub/' has a path, a query or a fragment"
        in done.stderr
    )


@pytest.mark.parametrize(
    ("name", "kind", "domain"),
    [
        ("bob", "user", "bob.hub.example.edu"),
        ("Bob", "user", "u-bob--"),  # not a DNS label as it is: JupyterHub's hashed label, one per name
        ("a@b.edu", "user", "u-abedu--"),
        ("workbench", "service", "hub.example.edu"),
        ("idle-culler", "service", "hub.example.edu"),
    ],
)
def test_users_get_their_own_names_and_services_stay_on_the_hubs_host(name, kind, domain):
    got = subdomains.user_subdomain(name, "hub.example.edu", kind)
    assert got.startswith(domain)
    assert got.endswith(".hub.example.edu" if kind == "user" else "hub.example.edu")
    assert got.count(".") == (3 if kind == "user" else 2)


def test_two_users_whose_names_differ_only_in_case_get_two_hosts():
    assert subdomains.user_subdomain("Bob", "h.test", "user") != subdomains.user_subdomain("bob", "h.test", "user")


class _Handler:
    """What the hook uses of a JupyterHub login handler."""

    def __init__(self, host: str, subdomain_host: str = "http://localhost:8000"):
        self.settings = {"subdomain_host": subdomain_host, "login_url": "/hub/login"}
        self.request = SimpleNamespace(host=host)
        self.log = logging.getLogger("test")
        self.status = 200
        self.headers: dict[str, str] = {}

    def set_status(self, status: int) -> None:
        self.status = status

    def set_header(self, name: str, value: str) -> None:
        self.headers[name] = value


@pytest.mark.parametrize(
    "host", ["bob.localhost:8000", "BOB.LOCALHOST:8000", "a.b.localhost:8000", "workbench--service.localhost"]
)
def test_a_login_on_a_users_host_is_refused_with_the_hubs_address(host):
    model = {"name": "admin", "admin": True}
    handler = _Handler(host)
    with pytest.raises(web.Finish) as refused:
        subdomains.refuse_login_off_hub_host(None, handler, model)
    assert handler.status == 403
    assert handler.headers["Content-Type"] == "text/html; charset=utf-8"
    (page,) = refused.value.args
    assert (
        f"<p>Cannot log in at {host.lower()}: that address serves a user&#x27;s own pages. "
        "Log in at http://localhost:8000/hub/login</p>"
    ) in page
    assert '<a href="http://localhost:8000/hub/login">' in page


def test_the_refusal_escapes_what_the_browser_sent():
    with pytest.raises(web.Finish) as refused:
        subdomains.refuse_login_off_hub_host(None, _Handler("a<script>.localhost:8000"), {"name": "admin"})
    assert "<script>" not in refused.value.args[0]
    assert "a&lt;script&gt;.localhost:8000" in refused.value.args[0]


@pytest.mark.parametrize(
    ("host", "subdomain_host"),
    [
        ("localhost:8000", "http://localhost:8000"),  # the hub's own host
        ("127.0.0.1:8000", "http://localhost:8000"),  # ssh -L to loopback: no user content there
        ("evil-localhost:8000", "http://localhost:8000"),  # not below the hub's host
        ("bob.localhost:8000", ""),  # subdomains off
    ],
)
def test_a_login_elsewhere_goes_on(host, subdomain_host):
    model = {"name": "admin", "admin": True}
    assert subdomains.refuse_login_off_hub_host(None, _Handler(host, subdomain_host), model) is model


@pytest.mark.parametrize(
    ("names", "host", "covered"),
    [
        (("hub.example.edu", "*.hub.example.edu"), "hub.example.edu", True),
        (("hub.example.edu", "*.hub.example.edu"), "bob.hub.example.edu", True),
        (("hub.example.edu", "*.HUB.example.edu"), "Bob.Hub.Example.Edu", True),
        (("hub.example.edu",), "bob.hub.example.edu", False),
        (("*.hub.example.edu",), "hub.example.edu", False),  # a wildcard does not cover the name itself
        (("*.hub.example.edu",), "a.b.hub.example.edu", False),  # nor two labels
        (("*.example.edu",), "bob.hub.example.edu", False),
        ((), "hub.example.edu", False),
    ],
)
def test_which_names_a_certificate_covers(names, host, covered):
    assert tls.covers(names, host) is covered


@pytest.fixture(scope="module")
def ca():
    return CA.make()


def test_the_served_certificate_must_name_the_users_hosts(ca, tmp_path):
    cert, key = ca.write(tmp_path, "single", "hub.example.edu")
    env = {
        "WORKBENCH_SUBDOMAIN_HOST": "https://hub.example.edu",
        "WORKBENCH_SSL_CERT": str(cert),
        "WORKBENCH_SSL_KEY": str(key),
    }
    with pytest.raises(ConfigError) as refused:
        build(env)
    assert str(refused.value) == (
        f"the certificate in WORKBENCH_SSL_CERT={cert} names hub.example.edu but not *.hub.example.edu, so "
        "browsers would refuse every user's server (NAME.hub.example.edu): serve one certificate for "
        "hub.example.edu and *.hub.example.edu (README: User content on its own origin)"
    )
    cert, key = ca.write(tmp_path, "wild-only", "*.hub.example.edu")
    with pytest.raises(
        ConfigError,
        match=re.escape("names *.hub.example.edu but not hub.example.edu, so browsers would refuse the hub itself"),
    ):
        build({**env, "WORKBENCH_SSL_CERT": str(cert), "WORKBENCH_SSL_KEY": str(key)})
    cert, key = ca.write(tmp_path, "wildcard", "hub.example.edu", "*.hub.example.edu")
    c = build({**env, "WORKBENCH_SSL_CERT": str(cert), "WORKBENCH_SSL_KEY": str(key)})
    assert c.JupyterHub.subdomain_host == "https://hub.example.edu"
    assert c.JupyterHub.bind_url.startswith("https://")


class _Fetched:
    def __init__(self):
        self.requests = []

    async def fetch(self, request):
        self.requests.append(request)
        return SimpleNamespace(body=json.dumps({"gpus": []}).encode())


@pytest.mark.parametrize(
    ("server_url", "url", "host"),
    [
        # subdomains: the hub gives a full URL; the call goes to the proxy's address with that Host
        ("http://bob.localhost:8000/user/bob/", "http://127.0.0.1:8000/user/bob/api/gpu/metrics", "bob.localhost:8000"),
        (
            "https://bob.hub.example.edu/user/bob/big/",
            "http://127.0.0.1:8000/user/bob/big/api/gpu/metrics",
            "bob.hub.example.edu",
        ),
        # no subdomains: a path, and the proxy's own host
        ("/user/bob/", "http://127.0.0.1:8000/user/bob/api/gpu/metrics", None),
    ],
)
def test_the_service_reaches_a_users_monitor_through_the_proxy_by_its_host(monkeypatch, server_url, url, host):
    fetched = _Fetched()
    monkeypatch.setattr("workbench_hub.service.user_servers.AsyncHTTPClient", lambda: fetched)
    asyncio.run(UserServers("http://127.0.0.1:8000", "service-token").metrics(server_url))
    (request,) = fetched.requests
    assert request.url == url
    assert request.headers.get("Host") == host
    assert request.headers["Authorization"] == "token service-token"


def _chart(flags):
    values = {"proxy.chp.extraCommandLineFlags": flags}
    return lambda key, default=None: values.get(key, default)


def test_the_chart_needs_host_routing_on_its_proxy_pod():
    from workbench_spawner.backends.kubernetes import z2jh

    c = Config()
    configurer.update_services(c, {})
    env = {"WORKBENCH_SUBDOMAIN_HOST": "https://hub.example.edu"}
    with pytest.raises(ConfigError) as refused:
        z2jh.update_chart_subdomains(c, env, _chart([]))
    assert str(refused.value) == (
        "users' servers are on subdomains of https://hub.example.edu but the chart's proxy pod does not route by "
        "host: add --host-routing to proxy.chp.extraCommandLineFlags"
    )
    c = Config()
    configurer.update_services(c, {})
    z2jh.update_chart_subdomains(c, env, _chart(["--host-routing"]))
    assert c.JupyterHub.subdomain_host == "https://hub.example.edu"
    assert c.JupyterHub.subdomain_hook is subdomains.user_subdomain


def test_the_charts_own_subdomain_host_gets_the_same_hook_and_guard():
    """hub.config.JupyterHub.subdomain_host (the chart's own setting, applied before the workbench's entry)."""
    from workbench_spawner.backends.kubernetes import z2jh

    c = Config()
    configurer.update_services(c, {})
    c.JupyterHub.subdomain_host = "https://hub.example.edu"
    z2jh.update_chart_subdomains(c, {}, _chart(["--host-routing"]))
    assert c.Authenticator.post_auth_hook is subdomains.refuse_login_off_hub_host
    assert c.Proxy.extra_routes["hub/services/workbench/"] == SERVICE_URL
    c = Config()
    configurer.update_services(c, {})
    z2jh.update_chart_subdomains(c, {}, _chart([]))  # off: no flag needed
    assert "subdomain_host" not in c.JupyterHub


def test_the_https_profiles_caddy_refuses_subdomains_with_a_sentence():
    """The compose profile's Caddy gets one certificate per name by HTTP-01, which cannot be a wildcard; its entry
    script stops before Caddy starts (it ends in ``exec caddy``, which this machine need not have)."""
    import subprocess

    env = {
        "PATH": "/usr/bin:/bin",
        "WORKBENCH_DOMAIN": "gpu.example.org",
        "WORKBENCH_ACME_EMAIL": "gpu-admin@example.org",
        "WORKBENCH_SUBDOMAIN_HOST": "https://gpu.example.org",
    }
    done = subprocess.run(
        ["sh", str(REPO / "images" / "https" / "workbench-caddy")], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "GPU Workbench https: WORKBENCH_SUBDOMAIN_HOST puts every user's server on a name of its own "
        "(NAME.gpu.example.org), which needs a wildcard certificate, and this Caddy gets certificates by HTTP-01, "
        "which cannot issue one: leave the https profile off and serve a certificate for gpu.example.org and "
        "*.gpu.example.org with the hub's own proxy (WORKBENCH_SSL_CERT, WORKBENCH_SSL_KEY; README: User content "
        "on its own origin)"
    )


@pytest.mark.parametrize(
    ("env", "shown"),
    [
        (
            {"WORKBENCH_SUBDOMAIN_HOST": "https://hub.example.edu", "WORKBENCH_DOMAIN": "hub.example.edu"},
            ["Users' servers: each on its own origin, https://NAME.hub.example.edu/user/NAME/"],
        ),
        (
            {"WORKBENCH_DOMAIN": "hub.example.edu"},
            [
                "Users' servers share the hub's origin: a page a student serves can act as whoever opens it;",
                "  WORKBENCH_SUBDOMAIN_HOST gives each its own (wildcard DNS and certificate; README: User content",
                "  on its own origin)",
            ],
        ),
        ({}, []),  # plain HTTP on loopback: one workstation, nothing to say
    ],
)
def test_the_banner_says_where_users_servers_are(env, shown):
    from workbench_devices import DeviceInventory
    from workbench_hub import banner

    c = build(env)
    c.Authenticator.admin_users = {"admin"}
    text = banner.banner(
        c, "docker", Path("/srv/data"), DeviceInventory("none", [], "no driver"), transport.check_transport(c, env)
    )
    lines = text.splitlines()
    found = [
        line for line in lines if line.startswith(("Users' servers", "  WORKBENCH_SUBDOMAIN_HOST", "  on its own"))
    ]
    assert found == shown, text
    if env.get("WORKBENCH_SUBDOMAIN_HOST"):
        assert "GPU Workbench (docker backend) at https://hub.example.edu/" in lines
