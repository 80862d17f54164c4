"""The workbench service's calls to user servers: their GPU monitor's readings and notices.

Every backend lets the hub reach a user server: the proxy routes
``{proxy}{server url}`` to it wherever it runs (a local process, a container,
a Slurm node). So the service goes through the proxy too, with its own API
token; the role ``workbench-service`` holds ``access:servers`` for exactly
this (``hub/workbench_hub/configurer.py``). Three calls:

* ``GET {server}api/gpu/metrics``: the readings of the GPUs the server sees,
  for nodes whose GPUs the hub cannot see itself;
* ``PUT {server}api/gpu/notices``: the notices the user's JupyterLab shows;
* ``GET {server}api/gpu/saves?notice_id=ID``: how the save round before a
  stop went (``stopping.py``).

A proxy on HTTPS at a loopback address is reached without checking its
certificate (it names the public host, not 127.0.0.1); the traffic never
leaves this machine. Anything else is checked as usual.

With users on their own subdomains (``WORKBENCH_SUBDOMAIN_HOST``) the hub
gives a server's URL as ``https://bob.hub.example.edu/user/bob/`` and the proxy
routes by host name: the call still goes to the proxy's address, with that
host in its ``Host`` header (``workbench_hub/subdomains.py``).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote, urlparse, urlsplit

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


class ServerUnreachableError(Exception):
    """The user server (or the proxy in front of it) did not answer, or refused (``code``: the HTTP status,
    None when nothing answered)."""

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code


class UserServers:
    def __init__(self, proxy_url: str, token: str, timeout: float = 10.0):
        self.proxy_url = proxy_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        parsed = urlparse(self.proxy_url)
        self._check_cert = not (parsed.scheme == "https" and (parsed.hostname or "") in LOOPBACK)

    def url(self, server_path: str, api: str) -> str:
        path = urlsplit(server_path).path.strip("/")
        return self.proxy_url + "/" + (path + "/" if path else "") + api.lstrip("/")

    async def call(self, method: str, server_path: str, api: str, body: Any = None) -> Any:
        request = HTTPRequest(
            self.url(server_path, api),
            method=method,
            headers={
                "Authorization": f"token {self.token}",
                "Content-Type": "application/json",
                # a full URL (users on subdomains): the proxy routes by this host
                **({"Host": host} if (host := urlsplit(server_path).netloc) else {}),
            },
            body=None if body is None else json.dumps(body),
            request_timeout=self.timeout,
            follow_redirects=False,
            validate_cert=self._check_cert,
        )
        try:
            response = await AsyncHTTPClient().fetch(request)
        except HTTPClientError as exc:
            raise ServerUnreachableError(f"{method} {api.split('?')[0]} answered {exc.code}", exc.code) from None
        except OSError as exc:
            raise ServerUnreachableError(f"{method} {api.split('?')[0]}: {exc}") from None
        try:
            return json.loads(response.body) if response.body else {}
        except ValueError:
            raise ServerUnreachableError(f"{method} {api} answered with no JSON") from None

    async def metrics(self, server_path: str) -> dict:
        data = await self.call("GET", server_path, "api/gpu/metrics")
        if not isinstance(data, dict):
            raise ServerUnreachableError("api/gpu/metrics answered with no JSON object")
        return data

    async def put_notices(self, server_path: str, notices: list[dict], sharing: list[dict] | None = None) -> None:
        """Replace the server's notices and its time-sliced GPUs (``notice_delivery``)."""
        await self.call("PUT", server_path, "api/gpu/notices", {"notices": notices, "sharing": sharing or []})

    async def saves(self, server_path: str, notice_id: int | str) -> dict:
        """How the save round for a stopping notice went: ``{"active_clients", "reported", "saved", "failed",
        "names", "done"}`` (the GPU monitor's ``api/gpu/saves``)."""
        data = await self.call("GET", server_path, f"api/gpu/saves?notice_id={quote(str(notice_id), safe='')}")
        if not isinstance(data, dict):
            raise ServerUnreachableError("api/gpu/saves answered with no JSON object")
        return data
