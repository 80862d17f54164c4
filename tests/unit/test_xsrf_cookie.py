"""The ``_xsrf`` cookie's ``Secure`` (workbench_hub.xsrf_cookie): the config table, then tornado for real.

The real hub over HTTPS is in tests/https/test_https_hub.py; here a tornado
server with the hub's settings sets the cookie through JupyterHub's own
``_set_xsrf_cookie``, with and without ``X-Forwarded-Proto: https``.
"""

from __future__ import annotations

import asyncio
import copy
import http.client
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from jupyterhub._xsrf_utils import _set_xsrf_cookie
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets
from traitlets.config import Config

from tests.unit.test_configurer import build
from workbench_hub.xsrf_cookie import WHEN_HTTPS, NoteRequestScheme, secure_xsrf_cookie

TLS = {"WORKBENCH_SSL_CERT": "/etc/workbench/hub.pem", "WORKBENCH_SSL_KEY": "/etc/workbench/hub.key"}
HSTS = {"Strict-Transport-Security": "max-age=31536000"}
GZIP = web.GZipContentEncoding


def final_settings(env: dict[str, str], local: dict | None = None) -> dict:
    """The tornado settings the hub gets: ``env`` as jupyterhub_config.py reads it, ``local`` as a local config file."""
    c = build(env)
    for trait, value in (local or {}).items():
        c.JupyterHub[trait] = value
    final = Config()
    final.merge(c)
    secure_xsrf_cookie(c, final)
    return c.JupyterHub.tornado_settings


@pytest.mark.parametrize(
    ("env", "local", "xsrf", "transforms", "headers"),
    [
        # the proxy serves the certificate: every request is HTTPS, so are the session cookies
        (TLS, {}, {"secure": True}, None, HSTS),
        # a public https:// URL (a TLS proxy in front, WORKBENCH_DOMAIN): the session cookies are always Secure
        ({"WORKBENCH_DOMAIN": "gpu.example.org"}, {}, {"secure": True}, None, HSTS),
        # a TLS proxy in front and no public URL: Secure follows each request's X-Forwarded-Proto
        ({"WORKBENCH_ALLOW_HTTP": "1"}, {}, {"secure": WHEN_HTTPS}, [NoteRequestScheme], HSTS),
        (
            {"WORKBENCH_ALLOW_HTTP": "1", "WORKBENCH_HSTS_SECONDS": "0"},
            {},
            {"secure": WHEN_HTTPS},
            [NoteRequestScheme],
            None,
        ),
        # plain HTTP on loopback: the same rule (a TLS proxy on this host could be in front)
        ({}, {}, {"secure": WHEN_HTTPS}, [NoteRequestScheme], None),
        # the local config file counts: a certificate or a public URL set only there
        ({}, {"ssl_cert": "/etc/hub.pem", "ssl_key": "/etc/hub.key"}, {"secure": True}, None, None),
        ({}, {"public_url": "https://gpu.example.org/"}, {"secure": True}, None, None),
        ({}, {"public_url": "http://gpu.example.org/"}, {"secure": WHEN_HTTPS}, [NoteRequestScheme], None),
        # JupyterHub's default is kept: cookie_options are the _xsrf cookie's too, unless it has its own
        (
            TLS,
            {"tornado_settings": {"cookie_options": {"samesite": "Strict"}}},
            {"samesite": "Strict", "secure": True},
            None,
            None,
        ),
        (
            TLS,
            {"tornado_settings": {"cookie_options": {"samesite": "Strict"}, "xsrf_cookie_kwargs": {"domain": "a.b"}}},
            {"domain": "a.b", "secure": True},
            None,
            None,
        ),
        # the operator's own secure wins (and needs no per-request scheme)
        ({}, {"tornado_settings": {"xsrf_cookie_kwargs": {"secure": False}}}, {"secure": False}, None, None),
        # tornado's gzip transform, which a transforms list would otherwise replace, stays
        (
            {},
            {"tornado_settings": {"compress_response": True}},
            {"secure": WHEN_HTTPS},
            [GZIP, NoteRequestScheme],
            None,
        ),
    ],
)
def test_xsrf_cookie_settings(env, local, xsrf, transforms, headers):
    settings = final_settings(env, local)
    # SameSite=Lax unless the operator's settings say otherwise (the Strict rows)
    assert settings["xsrf_cookie_kwargs"] == {"samesite": "Lax", **xsrf}
    assert settings.get("transforms") == transforms
    assert settings.get("headers") == headers


@pytest.mark.parametrize(
    ("local", "session", "xsrf"),
    [
        # JupyterHub sets no SameSite; the hub says Lax on its session cookies and _xsrf
        ({}, {"samesite": "Lax"}, "Lax"),
        # an operator's own choice wins, on both (JupyterHub copies cookie_options to _xsrf)
        ({"tornado_settings": {"cookie_options": {"samesite": "Strict"}}}, {"samesite": "Strict"}, "Strict"),
        # their own _xsrf settings still get Lax, and the session cookies keep their other options
        (
            {"tornado_settings": {"cookie_options": {"expires_days": 1}, "xsrf_cookie_kwargs": {"domain": "a.b"}}},
            {"expires_days": 1, "samesite": "Lax"},
            "Lax",
        ),
    ],
)
def test_every_hub_cookie_says_samesite(local, session, xsrf):
    settings = final_settings({}, local)
    assert settings["cookie_options"] == session
    assert settings["xsrf_cookie_kwargs"]["samesite"] == xsrf


def test_running_twice_adds_the_transform_once():
    c = build({})
    secure_xsrf_cookie(c, c)
    secure_xsrf_cookie(c, c)
    assert c.JupyterHub.tornado_settings["transforms"] == [NoteRequestScheme]


def test_outside_a_request_the_value_is_false_and_copies_are_itself():
    assert not WHEN_HTTPS
    assert copy.deepcopy({"secure": WHEN_HTTPS})["secure"] is WHEN_HTTPS
    assert copy.copy(WHEN_HTTPS) is WHEN_HTTPS
    assert repr(WHEN_HTTPS) == "<secure when the request is HTTPS>"


# -- tornado, with JupyterHub's own _set_xsrf_cookie ----------------------------------------------


class XsrfHandler(web.RequestHandler):
    """Sets the _xsrf cookie as the hub does on its pages. /slow and /pair interleave: /slow is
    received first, /pair sets its cookie while /slow waits, then /slow sets its own."""

    async def get(self, which: str) -> None:
        slow_in, pair_done = self.settings["slow_in"], self.settings["pair_done"]
        if which == "slow":
            slow_in.set()
            await asyncio.wait_for(pair_done.wait(), 10)
        elif which == "pair":
            await asyncio.wait_for(slow_in.wait(), 10)
        _set_xsrf_cookie(self, b"anonymous", cookie_path="/hub/", authenticated=False)
        if which == "pair":
            pair_done.set()
        self.write("ok")


@pytest.fixture
def hub_like_server():
    """A tornado server on loopback with the settings secure_xsrf_cookie gives a hub behind a TLS proxy."""
    c = build({"WORKBENCH_ALLOW_HTTP": "1"})
    secure_xsrf_cookie(c, c)
    settings = dict(c.JupyterHub.tornado_settings)
    started = threading.Event()
    state = {}

    def serve() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)

        async def main() -> None:
            app = web.Application(
                [(r"/hub/(\w+)", XsrfHandler)],
                cookie_secret="x" * 32,
                slow_in=asyncio.Event(),
                pair_done=asyncio.Event(),
                **settings,
            )
            server = HTTPServer(app, xheaders=True)  # as JupyterHub starts it
            sockets = bind_sockets(0, "127.0.0.1")
            server.add_sockets(sockets)
            state.update(port=sockets[0].getsockname()[1], stop=asyncio.Event(), server=server)
            started.set()
            await state["stop"].wait()
            server.stop()

        state["loop"] = loop
        loop.run_until_complete(main())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(10)
    yield state["port"]
    state["loop"].call_soon_threadsafe(state["stop"].set)
    thread.join(10)


def xsrf_line(conn: http.client.HTTPConnection, path: str, https: bool) -> str:
    conn.request("GET", path, headers={"X-Forwarded-Proto": "https"} if https else {})
    r = conn.getresponse()
    r.read()
    (line,) = [v for k, v in r.getheaders() if k.lower() == "set-cookie" and v.startswith("_xsrf=")]
    return line.lower()


def test_secure_exactly_for_requests_that_came_over_https(hub_like_server):
    conn = http.client.HTTPConnection("127.0.0.1", hub_like_server, timeout=10)
    # one keep-alive connection: each request decides for itself, none inherits the one before
    assert "; secure" in xsrf_line(conn, "/hub/fast", https=True)
    assert "; secure" not in xsrf_line(conn, "/hub/fast", https=False)
    assert "; secure" in xsrf_line(conn, "/hub/fast", https=True)
    assert "; path=/hub/" in xsrf_line(conn, "/hub/fast", https=True)
    conn.close()


def test_concurrent_requests_do_not_see_each_others_scheme(hub_like_server):
    """An HTTPS request still waiting while a plain one is answered keeps Secure, and the other way round."""

    def one(path: str, https: bool) -> str:
        return xsrf_line(http.client.HTTPConnection("127.0.0.1", hub_like_server, timeout=10), path, https)

    with ThreadPoolExecutor(2) as pool:
        slow = pool.submit(one, "/hub/slow", True)
        pair = pool.submit(one, "/hub/pair", False)
        assert "; secure" not in pair.result(15)
        assert "; secure" in slow.result(15)
