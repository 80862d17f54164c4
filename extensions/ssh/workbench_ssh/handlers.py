"""The SSH page and its small REST API, inside the user's own server.

``GET {base_url}workbench/ssh``          the page (HTML, renders ``api/workbench/ssh``)
``GET {base_url}workbench/ssh/workbench-ssh-proxy.py``  the laptop's ProxyCommand (``proxy.py``), to save
    as ``~/.ssh/workbench-ssh-proxy.py``
``GET {base_url}api/workbench/ssh``      the ``~/.ssh/config`` entry and the keys (JSON); a 500 with a
    sentence when ``WORKBENCH_PUBLIC_URL`` cannot be the hub's address
``POST {base_url}api/workbench/ssh/keys``  ``{"key": "ssh-ed25519 AAAA... me@laptop"}``:
    201 added, 200 already there, 400 with a sentence (the file is untouched).

Authentication is the single-user server's own (only the owner's hub login or
a token with ``access:servers`` on this server gets in).
"""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import pwd
import subprocess
from importlib.resources import files
from urllib.parse import urlsplit

from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.utils import url_path_join
from tornado import web

from . import client_config, keys

#: where the page serves the laptop's ProxyCommand, below the server's base URL
PROXY_SCRIPT_ROUTE = "workbench/ssh/workbench-ssh-proxy.py"


def ssh_info(public_url: str, base_url: str, environ: dict[str, str], home: str) -> dict:
    """What the page shows: the config entry for both token sources, the client, and the listed keys.

    Raises :class:`client_config.PublicURLError` when ``public_url`` cannot be the hub's address."""
    hub_user = environ.get("JUPYTERHUB_USER", getpass.getuser())
    server_name = environ.get("JUPYTERHUB_SERVER_NAME", "")
    hub_base = environ.get("JUPYTERHUB_BASE_URL", "/")
    origin = client_config.public_origin(public_url, hub_base)
    server_origin = _own_origin(environ)
    if server_origin:
        # Users on their own subdomains (WORKBENCH_SUBDOMAIN_HOST): the proxy routes this server's websocket on
        # its own host only, while the alias and the token page name the hub, where the login is.
        url = client_config.websocket_url(server_origin, base_url, hub_base)
        origin = urlsplit(environ["JUPYTERHUB_PUBLIC_HUB_URL"])._replace(path="", query="", fragment="").geturl()
    else:
        url = client_config.websocket_url(public_url, base_url, hub_base)
    host = origin.split("://", 1)[1]
    alias = client_config.host_alias(host, hub_user, server_name)
    login = pwd.getpwuid(os.getuid()).pw_name  # the account, not $USER
    return {
        "alias": alias,
        "login_user": login,
        "hub_user": hub_user,
        "websocket_url": url,
        "token_file": client_config.TOKEN_FILE,
        "token_env": client_config.TOKEN_ENV,
        "token_scope": f"access:servers!server={hub_user}/{server_name}",
        "token_page": origin + url_path_join(hub_base, "hub/token"),
        "proxy_script": client_config.PROXY_SCRIPT,
        "proxy_script_url": url_path_join(base_url, PROXY_SCRIPT_ROUTE),
        "client_library": client_config.CLIENT_LIBRARY,
        "ssh_config": client_config.ssh_config(alias, login, url, "file"),
        "ssh_config_env": client_config.ssh_config(alias, login, url, "env"),
        "keys": keys.listed_keys(home),
    }


def _own_origin(environ: dict[str, str]) -> str:
    """This server's own origin when it is not the hub's (JupyterHub's public URLs of the two differ in host:
    users' servers on subdomains), else empty."""
    server = urlsplit(environ.get("JUPYTERHUB_PUBLIC_URL", ""))
    hub = urlsplit(environ.get("JUPYTERHUB_PUBLIC_HUB_URL", ""))
    if server.scheme in ("http", "https") and server.netloc and hub.netloc and server.netloc != hub.netloc:
        return f"{server.scheme}://{server.netloc}"
    return ""


class _SSHMixin(JupyterHandler):
    """What the SSH handlers share; a JupyterHandler, so its request and base_url are known."""

    def public_url(self) -> str:
        configured = os.environ.get("WORKBENCH_PUBLIC_URL")
        return configured.rstrip("/") if configured else f"{self.request.protocol}://{self.request.host}"

    def info(self) -> dict:
        try:
            return ssh_info(self.public_url(), self.base_url, dict(os.environ), os.path.expanduser("~"))
        except client_config.PublicURLError as e:
            # the admin's setting, not the user's request: say what to fix
            raise web.HTTPError(500, str(e)) from None


class SSHInfoHandler(_SSHMixin, APIHandler):
    @web.authenticated
    def get(self):
        self.finish(json.dumps(self.info()))


def _keys_unavailable(e: Exception) -> web.HTTPError:
    return web.HTTPError(
        503,
        f"Cannot read or check your SSH keys right now ({e.__class__.__name__}: {e}); "
        "try again in a moment, or ask a hub admin.",
    )


class SSHKeysHandler(_SSHMixin, APIHandler):
    """Keys are checked with ``ssh-keygen`` and written under a lock, in a worker thread: this
    server's event loop also carries every open SSH session (jupyter-server-proxy's socket)."""

    @web.authenticated
    async def get(self):
        try:
            listed = await asyncio.to_thread(keys.listed_keys, os.path.expanduser("~"))
        except (subprocess.SubprocessError, OSError) as e:
            raise _keys_unavailable(e) from None
        self.finish(json.dumps({"keys": listed}))

    @web.authenticated
    async def post(self):
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("key"), str):
            raise web.HTTPError(400, 'Send JSON such as {"key": "ssh-ed25519 AAAA... me@laptop"}.')
        try:
            key, added = await asyncio.to_thread(keys.add_key, os.path.expanduser("~"), body["key"])
        except keys.InvalidKeyError as e:
            raise web.HTTPError(400, str(e)) from None
        except (subprocess.SubprocessError, OSError) as e:
            raise _keys_unavailable(e) from None
        self.set_status(201 if added else 200)
        message = "Key added" if added else "This key was already in authorized_keys"
        self.finish(
            json.dumps(
                {
                    "added": added,
                    "fingerprint": key.fingerprint,
                    "type": key.key_type,
                    "comment": key.comment,
                    "message": f"{message}: {key.fingerprint}.",
                }
            )
        )


class SSHPageHandler(_SSHMixin, JupyterHandler):
    @web.authenticated
    def get(self):
        page = files("workbench_ssh").joinpath("page.html").read_text()
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(
            page.replace("{{API}}", url_path_join(self.base_url, "api/workbench/ssh")).replace(
                "{{XSRF}}", self.xsrf_token.decode()
            )
        )


class ProxyScriptHandler(JupyterHandler):
    """The laptop's ProxyCommand, as a file to save (the same file as ``workbench_ssh/proxy.py``)."""

    @web.authenticated
    def get(self):
        self.set_header("Content-Type", "text/x-python; charset=utf-8")
        self.set_header("Content-Disposition", 'attachment; filename="workbench-ssh-proxy.py"')
        self.finish(files("workbench_ssh").joinpath("proxy.py").read_text())


def setup_handlers(web_app) -> None:
    base = web_app.settings["base_url"]
    web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, "workbench/ssh"), SSHPageHandler),
            (url_path_join(base, PROXY_SCRIPT_ROUTE), ProxyScriptHandler),
            (url_path_join(base, "api/workbench/ssh"), SSHInfoHandler),
            (url_path_join(base, "api/workbench/ssh/keys"), SSHKeysHandler),
        ],
    )
