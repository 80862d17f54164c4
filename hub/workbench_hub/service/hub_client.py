"""The workbench service's calls to the hub's REST API: users, groups, stopping a server.

The service learns who exists (and in which groups) from the hub, with the
token JupyterHub gives a managed service (``JUPYTERHUB_API_TOKEN``; role
``workbench-service`` in ``hub/jupyterhub_config.py``: list and read users
and groups, read and delete servers). A name the hub does not know is
``None``; a hub that does not answer, or refuses, is ``HubUnavailableError``,
which the handlers turn into a 503 with a sentence.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

PAGE = 200


class HubUnavailableError(Exception):
    """The hub's API did not answer, or refused the service's token."""


def _segment(name: str) -> str:
    """One path segment, whatever the name: '.' and '..' escaped too, so no path is ever walked."""
    return quote(name, safe="").replace(".", "%2E")


class HubClient:
    def __init__(self, api_url: str, token: str):
        self.api_url = api_url.rstrip("/")
        self.token = token

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        request = HTTPRequest(
            self.api_url + path,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
            body=None if body is None else json.dumps(body),
            allow_nonstandard_methods=True,
            request_timeout=30,
        )
        try:
            response = await AsyncHTTPClient().fetch(request)
        except HTTPClientError as exc:
            if exc.code == 404:
                return None
            raise HubUnavailableError(f"the hub's API answered {method} {path.split('?')[0]} with {exc.code}") from None
        except OSError as exc:
            raise HubUnavailableError(f"the hub's API at {self.api_url} did not answer ({exc})") from None
        try:
            return json.loads(response.body) if response.body else {}
        except ValueError:
            raise HubUnavailableError(f"the hub's API answered {method} {path.split('?')[0]} with no JSON") from None

    async def _all(self, collection: str) -> list[dict]:
        """Every item of a paged hub collection (``users``, ``groups``)."""
        items: list[dict] = []
        offset = 0
        while True:
            page = await self.call("GET", f"/{collection}?offset={offset}&limit={PAGE}")
            if not page:
                break
            items.extend(page)
            if len(page) < PAGE:
                break
            offset += PAGE
        return items

    async def users(self) -> list[dict]:
        return await self._all("users")

    async def groups(self) -> list[dict]:
        return await self._all("groups")

    async def _named(self, kind: str, name: str) -> dict | None:
        model = await self.call("GET", f"/{kind}/{_segment(name)}")
        # Only the model of exactly this name counts (never whatever an odd path resolved to).
        if not isinstance(model, dict) or model.get("name") != name:
            return None
        return model

    async def user(self, name: str) -> dict | None:
        return await self._named("users", name)

    async def group(self, name: str) -> dict | None:
        return await self._named("groups", name)

    async def stop_server(self, user: str, server: str) -> None:
        path = f"/users/{_segment(user)}/" + (f"servers/{_segment(server)}" if server else "server")
        await self.call("DELETE", path)
