"""The ``~/.ssh/config`` entry that reaches this server from a laptop.

The client side is ``workbench-ssh-proxy`` (``proxy.py``, one file the SSH page
serves, saved as ``~/.ssh/workbench-ssh-proxy.py``; it needs Python and
``pip install websocket-client``). It speaks the websocket and hands ssh the raw
bytes, reading the hub token from a file or an environment variable, never
from its command line: a ProxyCommand's arguments are in every local account's
process list (``ps``), which is why the entry no longer uses websocat (it takes
the ``Authorization`` header only as an argument).

``HostKeyAlias`` keeps one known_hosts entry per server (every user's server
sits behind the same hub host name; a named server's alias ends in
``+<server>``), and ``ServerAliveInterval`` keeps an idle session moving
bytes, which is what marks the server active for the idle culler.
"""

from __future__ import annotations

import re
import shlex
from urllib.parse import urlsplit

TOKEN_FILE = "~/.ssh/workbench-token"
TOKEN_ENV = "WORKBENCH_HUB_TOKEN"
PROXY_SCRIPT = "~/.ssh/workbench-ssh-proxy.py"
#: the one library the proxy needs on the laptop (PyPI name); jupyter_server depends on it too
CLIENT_LIBRARY = "websocket-client"


class PublicURLError(ValueError):
    """``WORKBENCH_PUBLIC_URL`` cannot be the hub's public address; the message says why."""


def host_alias(hub_host: str, user: str, server_name: str = "") -> str:
    """``workbench-<hub>-<user>`` for the default server, ``workbench-<hub>-<user>+<server>`` for a named one.

    Each part keeps letters, digits, ``.``, ``_`` and ``-`` (anything else becomes ``-``), so ``+`` only ever
    joins a user to a server: alice's server ``big`` never shares its alias (and its known_hosts entry, the
    ``HostKeyAlias``) with a user named ``alice-big``."""
    host = re.sub(r"[^A-Za-z0-9.-]", "-", hub_host.split(":")[0]) or "hub"
    name = _alias_part(user) + (f"+{_alias_part(server_name)}" if server_name else "")
    return f"workbench-{host}-{name}"


def _alias_part(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "-", text)


def _slashed(path: str) -> str:
    return "/" + path.strip("/") + "/" if path.strip("/") else "/"


def public_origin(public_url: str, hub_base_url: str = "/") -> str:
    """``scheme://host[:port]`` of the hub's public address.

    ``public_url`` is the hub's address as users type it (``WORKBENCH_PUBLIC_URL``, or the
    request's own scheme and host): an origin, or an origin plus the hub's base URL
    (``https://example.org/jhub/`` for a hub at ``/jhub/``). Server paths such as
    ``/jhub/user/alice/`` already carry the base URL, so it is taken off here rather than
    added twice; any other path would address something the hub does not serve."""
    try:
        parts = urlsplit(public_url.strip())
    except ValueError as e:
        raise PublicURLError(f"WORKBENCH_PUBLIC_URL {public_url!r} is not a URL: {e}") from None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise PublicURLError(
            f"WORKBENCH_PUBLIC_URL {public_url!r} must be http(s)://host[:port][/base-url/], "
            "e.g. https://hub.example.org"
        )
    if parts.query or parts.fragment:
        raise PublicURLError(f"WORKBENCH_PUBLIC_URL {public_url!r} must not have a query or fragment")
    path, base = _slashed(parts.path), _slashed(hub_base_url)
    if path not in ("/", base):
        raise PublicURLError(
            f"WORKBENCH_PUBLIC_URL {public_url!r} has the path {path}, but the hub's base URL is {base}: "
            f"give the hub's address, e.g. {parts.scheme}://{parts.netloc}{base}"
        )
    return f"{parts.scheme}://{parts.netloc}"


def websocket_url(public_url: str, base_url: str, hub_base_url: str = "/") -> str:
    """``wss://hub/user/NAME/sshd/`` for ``https://hub`` (``ws://`` for plain http).

    ``base_url`` is the server's own (``/user/NAME/``, below the hub's base URL)."""
    scheme, rest = public_origin(public_url, hub_base_url).split("://", 1)
    ws = "wss" if scheme == "https" else "ws"
    return f"{ws}://{rest}{_slashed(base_url)}sshd/"


def proxy_command(url: str, token_source: str = "file") -> str:
    """The ProxyCommand: our proxy, where the token comes from, the websocket URL.

    Percent signs are doubled: ssh expands ``%h``-style tokens in ProxyCommand, and a server
    URL of an escaped user name (``/user/a%40b/``) has them."""
    if token_source == "file":
        source = f"--token-file {TOKEN_FILE}"
    elif token_source == "env":
        source = f"--token-env {TOKEN_ENV}"
    else:
        raise ValueError(f"token_source is 'file' or 'env', not {token_source!r}")
    # the ~ paths stay unquoted so the shell ssh runs the command with expands them
    command = f"python3 {PROXY_SCRIPT} {source} {shlex.quote(url)}"
    return command.replace("%", "%%")


def ssh_config(alias: str, login_user: str, url: str, token_source: str = "file") -> str:
    return "\n".join(
        [
            f"Host {alias}",
            f"    User {login_user}",
            f"    HostKeyAlias {alias}",
            f"    ProxyCommand {proxy_command(url, token_source)}",
            "    ServerAliveInterval 30",
            "    IdentitiesOnly yes",
            "    IdentityFile ~/.ssh/id_ed25519",
            "",
        ]
    )
