"""The laptop's ProxyCommand (``workbench_ssh/proxy.py``) against a real websocket server.

A tornado websocket server stands in for the hub's proxy (TLS with a CA of the
test's own, a token check, redirects, a stopped server). The proxy runs as ssh
runs it: a separate process, bytes on stdin and stdout. The tests through the
real hub are in test_ssh_docker.py, test_ssh_refusals.py and test_ssh_local.py.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tornado import httpserver, netutil, web, websocket
from tornado.ioloop import IOLoop

from tests.https.certs import CA
from workbench_ssh import proxy

pytestmark = pytest.mark.ssh

PROXY = Path(proxy.__file__)
TOKEN = "s3cret-token-4242"


@dataclass
class Seen:
    headers: list[dict[str, str]] = field(default_factory=list)


class EchoSSHD(websocket.WebSocketHandler):
    """Checks the token like jupyter-server-proxy (403 before the upgrade), then echoes bytes."""

    def initialize(self, seen: Seen):
        self.seen = seen

    def prepare(self):
        self.seen.headers.append(dict(self.request.headers))
        if self.request.headers.get("Authorization") != f"token {TOKEN}":
            raise web.HTTPError(403)

    def on_message(self, message):
        self.write_message(message, binary=True)


class Redirect(web.RequestHandler):
    def initialize(self, to: str):
        self.to = to

    def get(self):
        self.redirect(self.to.replace("PORT", str(self.request.host.rsplit(":", 1)[1])))


class Stopped(web.RequestHandler):
    def get(self):
        self.set_status(424)  # what JupyterHub answers for a server that is not running
        self.finish("not running")


@dataclass
class Hub:
    url: str  # ws://127.0.0.1:PORT or wss://127.0.0.1:PORT
    seen: Seen
    cafile: Path | None = None


def serve(ssl_ctx: ssl.SSLContext | None) -> tuple[Hub, callable]:
    seen = Seen()
    started = threading.Event()
    state: dict = {}

    def run():
        asyncio.set_event_loop(asyncio.new_event_loop())
        app = web.Application(
            [
                (r"/user/alice/sshd/", EchoSSHD, {"seen": seen}),
                (r"/user/alice/moved/", Redirect, {"to": "/user/alice/sshd/"}),
                (r"/user/alice/away/", Redirect, {"to": "http://localhost:PORT/user/alice/sshd/"}),
                (r"/user/stopped/sshd/", Stopped),
            ]
        )
        sockets = netutil.bind_sockets(0, "127.0.0.1")
        server = httpserver.HTTPServer(app, ssl_options=ssl_ctx)
        server.add_sockets(sockets)
        state.update(port=sockets[0].getsockname()[1], loop=IOLoop.current())
        started.set()
        IOLoop.current().start()

    threading.Thread(target=run, daemon=True).start()
    assert started.wait(10)
    scheme = "wss" if ssl_ctx else "ws"
    return Hub(f"{scheme}://127.0.0.1:{state['port']}", seen), lambda: state["loop"].add_callback(state["loop"].stop)


@pytest.fixture(scope="module")
def plain_hub():
    hub, stop = serve(None)
    yield hub
    stop()


@pytest.fixture(scope="module")
def tls_hub(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tls")
    ca = CA.make()
    cert, key = ca.write(tmp, "hub", "127.0.0.1")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    hub, stop = serve(ctx)
    hub.cafile = ca.write_ca(tmp / "ca.pem")
    yield hub
    stop()


def run_proxy(*args: str, env: dict[str, str] | None = None, data: bytes = b"", timeout: float = 30):
    environ = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/"), **(env or {})}
    return subprocess.run(
        [sys.executable, str(PROXY), *args], input=data, capture_output=True, env=environ, timeout=timeout
    )


def test_bytes_go_both_ways_unchanged_and_the_token_only_in_a_header(plain_hub):
    data = os.urandom(3 * proxy.CHUNK + 12345)  # several messages, binary
    r = run_proxy(f"{plain_hub.url}/user/alice/sshd/", env={"WORKBENCH_HUB_TOKEN": TOKEN}, data=data)
    assert r.returncode == 0, r.stderr
    assert r.stdout == data
    headers = plain_hub.seen.headers[-1]
    assert headers["Authorization"] == f"token {TOKEN}"
    assert "Origin" not in headers


def test_the_token_is_not_on_the_command_line(plain_hub, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    running = subprocess.Popen(
        [sys.executable, str(PROXY), "--token-file", str(token_file), f"{plain_hub.url}/user/alice/sshd/"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        running.stdin.write(b"ping")
        running.stdin.flush()
        assert running.stdout.read(4) == b"ping"  # connected, so the token was read and sent
        cmdline = Path(f"/proc/{running.pid}/cmdline").read_bytes()
        assert TOKEN.encode() not in cmdline
        assert str(token_file).encode() in cmdline
    finally:
        running.stdin.close()
        assert running.wait(30) == 0


def test_tls_is_verified_and_a_private_ca_can_be_given(tls_hub):
    url = f"{tls_hub.url}/user/alice/sshd/"
    r = run_proxy(url, env={"WORKBENCH_HUB_TOKEN": TOKEN}, data=b"x")
    assert r.returncode == 1, r.stderr
    assert b"CERTIFICATE_VERIFY_FAILED" in r.stderr, r.stderr
    r = run_proxy("--cacert", str(tls_hub.cafile), url, env={"WORKBENCH_HUB_TOKEN": TOKEN}, data=b"over tls")
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"over tls", r.stderr


@pytest.mark.parametrize(
    ("path", "token", "says"),
    [
        ("/user/alice/sshd/", "someone-elses", "(HTTP 403 Forbidden)"),
        ("/user/stopped/sshd/", TOKEN, "your server is not running (HTTP 424)"),
        ("/user/nobody/sshd/", TOKEN, "(HTTP 404 Not Found)"),
        ("/user/alice/away/", TOKEN, "not sending your token to another address"),
    ],
)
def test_a_refused_connection_says_why(plain_hub, path, token, says):
    before = len(plain_hub.seen.headers)
    r = run_proxy(f"{plain_hub.url}{path}", env={"WORKBENCH_HUB_TOKEN": token}, data=b"x")
    assert r.returncode == 1
    assert r.stdout == b""
    assert r.stderr.decode().startswith("workbench-ssh-proxy: cannot connect to ")
    assert says in r.stderr.decode()
    if path.endswith("/away/"):
        assert len(plain_hub.seen.headers) == before  # the token never went to the other host


def test_a_redirect_within_the_hub_is_followed(plain_hub):
    r = run_proxy(f"{plain_hub.url}/user/alice/moved/", env={"WORKBENCH_HUB_TOKEN": TOKEN}, data=b"moved")
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"moved", r.stderr


@pytest.mark.parametrize(
    ("args", "env", "file_text", "mode", "says"),
    [
        ([], {}, None, None, "no hub token in the environment variable WORKBENCH_HUB_TOKEN"),
        (
            ["--token-env", "MY_TOKEN"],
            {"WORKBENCH_HUB_TOKEN": TOKEN},
            None,
            None,
            "no hub token in the environment variable MY_TOKEN",
        ),
        ([], {"WORKBENCH_HUB_TOKEN": "two words"}, None, None, "must hold just the token"),
        (["--token-file", "FILE"], {}, TOKEN, 0o644, "may be read by other accounts (mode 0644): run chmod 600"),
        (["--token-file", "FILE"], {}, "\n", 0o600, "no hub token in the token file"),
        (["--token-file", "FILE"], {}, None, None, "cannot read the token file"),
    ],
)
def test_a_missing_or_exposed_token_is_refused_before_connecting(plain_hub, tmp_path, args, env, file_text, mode, says):
    token_file = tmp_path / "token"
    if file_text is not None:
        token_file.write_text(file_text)
        token_file.chmod(mode)
    before = len(plain_hub.seen.headers)
    r = run_proxy(*[str(token_file) if a == "FILE" else a for a in args], f"{plain_hub.url}/user/alice/sshd/", env=env)
    assert r.returncode == 1, r.stderr
    assert says in r.stderr.decode(), r.stderr
    assert len(plain_hub.seen.headers) == before


@pytest.mark.parametrize(
    ("url", "says"),
    [
        (
            "ws://hub.example.org/user/alice/sshd/",
            "refusing to send your hub token unencrypted (ws://) to hub.example.org",
        ),
        ("https://hub.example.org/user/alice/sshd/", "is not a websocket URL"),
        ("wss://hub.example.org:notaport/", "is not a usable URL"),
    ],
)
def test_a_url_the_token_must_not_go_to_is_refused(url, says):
    r = run_proxy(url, env={"WORKBENCH_HUB_TOKEN": TOKEN})
    assert r.returncode == 1, r.stderr
    assert says in r.stderr.decode(), r.stderr


def test_the_token_cannot_be_given_as_an_argument():
    r = run_proxy("--token", TOKEN, "ws://127.0.0.1:1/")
    assert r.returncode == 2
    assert b"the token is never taken as an argument" in r.stderr


def test_an_idle_connection_has_no_read_timeout(plain_hub, monkeypatch):
    """The connect timeout ends with the handshake: a silent SSH session is not cut."""
    import websocket as ws_client

    monkeypatch.setattr(proxy, "CONNECT_TIMEOUT", 0.5)
    ws = proxy.connect(f"{plain_hub.url}/user/alice/sshd/", TOKEN)
    received: list = []

    def wait_for_data():
        try:
            received.append(ws.recv_data())
        except (ws_client.WebSocketException, OSError) as e:  # a read timeout would land here
            received.append(e)

    reader = threading.Thread(target=wait_for_data)
    reader.start()
    time.sleep(1.5)  # three connect timeouts of silence
    ws.send(b"late", opcode=ws_client.ABNF.OPCODE_BINARY)
    reader.join(10)
    ws.close()
    assert received == [(ws_client.ABNF.OPCODE_BINARY, b"late")]
