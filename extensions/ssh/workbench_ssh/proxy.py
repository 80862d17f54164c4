#!/usr/bin/env python3
"""workbench-ssh-proxy: ssh's ProxyCommand for SSH into your GPU Workbench server through the hub.

    ProxyCommand python3 ~/.ssh/workbench-ssh-proxy.py --token-file ~/.ssh/workbench-token wss://hub.example.org/user/alice/sshd/

It opens the websocket at that URL with your hub token in the ``Authorization``
header and copies bytes both ways between it and ssh (its stdin and stdout).
One file: save it as ``~/.ssh/workbench-ssh-proxy.py`` on your laptop; it needs
Python 3.8 or newer and one library from PyPI: ``pip install websocket-client``.
The SSH page of your server (``/user/<you>/workbench/ssh``) serves this file
and shows the ``~/.ssh/config`` entry.

Why not websocat: it takes the header only on its command line, and a
ProxyCommand's command line is readable by every account on the laptop (``ps``,
``/proc/PID/cmdline``) for as long as the session lasts. This command reads the
token from a file (``--token-file``; it must not be readable by others, as ssh
demands of private keys) or from an environment variable (``--token-env``,
default ``WORKBENCH_HUB_TOKEN``; a process's environment is readable only by its
own account and root), and never takes it as an argument.

It sends the token only over TLS (``wss://``, certificates verified; ``--cacert``
for a hub with a private CA) or to a loopback address (``ws://127.0.0.1``, e.g.
through ``ssh -L``), and follows redirects only within the same scheme, host and
port, so the token never travels anywhere else.

Exit status: 0 when the connection ends, 1 when it cannot be opened (the reason
is on stderr, which ssh shows), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import ipaddress
import os
import stat
import sys
import threading
from urllib.parse import urljoin, urlsplit

PROG = "workbench-ssh-proxy"
TOKEN_ENV = "WORKBENCH_HUB_TOKEN"
#: bytes read from ssh per websocket message
CHUNK = 256 * 1024
CONNECT_TIMEOUT = 30.0
MAX_REDIRECTS = 3

#: what a refused handshake means, by HTTP status
REFUSALS = {
    401: "the hub did not accept the token (HTTP 401 Unauthorized): it may be mistyped, expired or revoked",
    403: (
        "the token may not open this server's SSH endpoint (HTTP 403 Forbidden): it is another user's, "
        "revoked, expired, or lacks access:servers on this server"
    ),
    404: (
        "there is no SSH endpoint at this URL (HTTP 404 Not Found): copy the URL from your server's SSH page, "
        "and check that the token may access this server"
    ),
    424: "your server is not running (HTTP 424): start it on the hub, then connect again",
    503: "your server is not running or not answering (HTTP 503): start it on the hub, then connect again",
}


class ProxyError(Exception):
    """The connection cannot be opened; the message is for the person running ssh."""


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_url(url: str) -> str:
    """``url`` if the token may be sent there: ``wss://`` anywhere, ``ws://`` only to loopback."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        _port = parts.port  # read to check it: raises ValueError for a bad port
    except ValueError as e:
        raise ProxyError(f"{url!r} is not a usable URL: {e}") from None
    if parts.scheme not in ("ws", "wss") or not host:
        raise ProxyError(f"{url!r} is not a websocket URL such as wss://hub.example.org/user/NAME/sshd/")
    if parts.scheme == "ws" and not is_loopback(host):
        raise ProxyError(f"refusing to send your hub token unencrypted (ws://) to {host}: use the wss:// address")
    return url


def read_token(token_file: str | None, token_env: str, environ: dict[str, str]) -> str:
    """The token from ``token_file`` (private to its owner) or else from ``environ[token_env]``."""
    if token_file is not None:
        path = os.path.expanduser(token_file)
        try:
            with open(path, encoding="utf-8") as f:
                mode = os.fstat(f.fileno()).st_mode
                text = f.read(4096)
        except OSError as e:
            raise ProxyError(f"cannot read the token file {token_file}: {e.strerror}") from None
        except UnicodeDecodeError:
            raise ProxyError(f"the token file {token_file} is not text: paste only the token into it") from None
        if os.name == "posix" and stat.S_IMODE(mode) & 0o077:
            raise ProxyError(
                f"the token file {token_file} may be read by other accounts "
                f"(mode {stat.S_IMODE(mode):04o}): run chmod 600 {token_file}"
            )
        token, where = text.strip(), f"the token file {token_file}"
    else:
        token, where = environ.get(token_env, "").strip(), f"the environment variable {token_env}"
    if not token:
        raise ProxyError(
            f"no hub token in {where}: create one on the hub's token page "
            f"(the SSH page links it){'' if token_file else ' or pass --token-file'}"
        )
    if len(token.split()) != 1 or any(ord(c) < 33 or ord(c) == 127 for c in token):
        raise ProxyError(f"{where} must hold just the token, one word with no spaces")
    return token


def same_origin(a: str, b: str) -> bool:
    pa, pb = urlsplit(a), urlsplit(b)
    return (pa.scheme, pa.hostname, pa.port) == (pb.scheme, pb.hostname, pb.port)


def refusal(status: int, url: str) -> str:
    reason = REFUSALS.get(status, f"the hub answered HTTP {status} instead of opening the websocket")
    return f"cannot connect to {url}: {reason}"


def _redirect(ws, url: str, why: str) -> str:
    """The same-origin target of a redirect answer, or ProxyError."""
    response = getattr(ws, "handshake_response", None)
    location = response.headers.get("location") if response is not None else None
    if not location:
        raise ProxyError(f"cannot connect to {url}: {why}")
    target = urljoin(url, location)
    target = target.replace("https://", "wss://", 1).replace("http://", "ws://", 1)
    if not same_origin(url, target):
        raise ProxyError(f"cannot connect to {url}: redirected to {target}; not sending your token to another address")
    return target


def connect(url: str, token: str, cafile: str | None = None):
    """An open websocket to ``url`` (redirects followed within the same origin), or :class:`ProxyError`."""
    import websocket  # websocket-client

    sslopt = {"ca_certs": cafile} if cafile else {}
    for _ in range(MAX_REDIRECTS + 1):
        ws = websocket.WebSocket(sslopt=sslopt)
        # Plain ws:// goes to loopback only (main() checks): never through an HTTP proxy from the environment.
        direct = {"http_no_proxy": [urlsplit(url).hostname]} if url.startswith("ws://") else {}
        try:
            # no Origin header (not a browser); redirects are followed below, where the target is checked
            ws.connect(
                url,
                header=[f"Authorization: token {token}"],
                suppress_origin=True,
                timeout=CONNECT_TIMEOUT,
                redirect_limit=0,
                **direct,
            )
        except websocket.WebSocketBadStatusException as e:
            raise ProxyError(refusal(e.status_code, url)) from None
        except websocket.WebSocketException as e:
            url = _redirect(ws, url, str(e))
            continue
        except OSError as e:  # refused, unreachable, name not found, TLS verification failed
            raise ProxyError(f"cannot connect to {url}: {e}") from None
        status = ws.getstatus()
        if status != 101:
            # Older websocket-client releases return from a 3xx instead of raising: never bridge that.
            ws.close()
            if 300 <= (status or 0) < 400:
                url = _redirect(ws, url, f"HTTP {status} without a Location")
                continue
            raise ProxyError(refusal(status or 0, url))
        ws.settimeout(None)  # an idle SSH session may be silent for long; ssh's keepalives handle it
        return ws
    raise ProxyError(f"cannot connect: more than {MAX_REDIRECTS} redirects, the last to {url}")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def bridge(ws, infd: int = 0, outfd: int = 1) -> None:
    """Copy ssh's bytes (``infd``) into binary messages and messages back into ``outfd``,
    until either side ends. websocket-client sends and receives from two threads safely
    (a lock each) and answers the server's pings itself."""
    import websocket

    def laptop_to_server() -> None:
        try:
            while True:
                data = os.read(infd, CHUNK)
                if not data:
                    break
                ws.send(data, opcode=websocket.ABNF.OPCODE_BINARY)
        except (OSError, websocket.WebSocketException):
            pass
        finally:
            with contextlib.suppress(OSError, websocket.WebSocketException):
                ws.send_close()

    threading.Thread(target=laptop_to_server, daemon=True).start()
    try:
        while True:
            opcode, data = ws.recv_data()
            if opcode == websocket.ABNF.OPCODE_CLOSE:
                break
            _write_all(outfd, data)
    except (OSError, websocket.WebSocketException):
        pass


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG,
        allow_abbrev=False,
        description="ssh's ProxyCommand for a GPU Workbench server: SSH over the hub's websocket. "
        "The token is read from a file or an environment variable, never from arguments.",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--token-file", metavar="PATH", help="file holding the hub token (mode 600), e.g. ~/.ssh/workbench-token"
    )
    source.add_argument(
        "--token-env",
        metavar="NAME",
        default=TOKEN_ENV,
        help=f"environment variable holding the hub token (default {TOKEN_ENV})",
    )
    parser.add_argument(
        "--cacert",
        metavar="PATH",
        help="CA certificate(s) to verify the hub with (PEM), for a hub whose certificate is not signed by a public CA",
    )
    parser.add_argument("url", help="the websocket URL from the SSH page, wss://HUB/user/NAME/sshd/")
    argv = sys.argv[1:] if argv is None else argv
    if any(a == "--token" or a.startswith("--token=") for a in argv):
        parser.error(
            "the token is never taken as an argument (every account could read it in the process list): "
            "use --token-file PATH or --token-env NAME"
        )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if importlib.util.find_spec("websocket") is None:
        print(f"{PROG}: needs the websocket-client library: python3 -m pip install websocket-client", file=sys.stderr)
        return 1
    if sys.platform == "win32":  # ssh's bytes must pass untranslated (a platform check type checkers read)
        import msvcrt

        msvcrt.setmode(0, os.O_BINARY)
        msvcrt.setmode(1, os.O_BINARY)
    try:
        url = check_url(args.url)
        token = read_token(args.token_file, args.token_env, dict(os.environ))
        if args.cacert and not os.path.isfile(os.path.expanduser(args.cacert)):
            raise ProxyError(f"--cacert {args.cacert}: no such file")
        ws = connect(url, token, os.path.expanduser(args.cacert) if args.cacert else None)
    except ProxyError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    bridge(ws)
    return 0


if __name__ == "__main__":
    sys.exit(main())
