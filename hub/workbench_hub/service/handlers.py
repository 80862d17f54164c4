"""The workbench service's HTTP handlers: the base classes and the REST API under /services/workbench/.

Every handler identifies the caller through the hub (``HubOAuthenticated``:
an API token, or the browser's cookie with an ``X-XSRFToken`` header for
changes) and decides from the caller's scopes itself, per request
(``scopes.py``): ``custom:workbench:admin`` reads and changes everything,
``custom:workbench:read`` reads everything, ``custom:workbench:self`` (every
user's, through the hub's ``user`` role) a user's own quota and usage. The
pages are in ``page_handlers.py``, the caller's own GPUs in ``my_gpus.py``.
Every answer of the API is JSON, errors
included (``{"status": 4xx, "message": "..."}``, one sentence saying what to
do); each is described in ``api/openapi.json`` (``openapi.yaml``), and every
JSON request body is checked against its schema there before a handler reads
it (``APIHandler.valid_body``: a 400 naming the field and the rule). 503 means the service cannot
answer yet: the hub has not stored its GPU settings, or its API did not
answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any, NoReturn

from jinja2 import Environment, FileSystemLoader, select_autoescape
from jupyterhub.services.auth import HubOAuth, HubOAuthCallbackHandler, HubOAuthenticated
from tornado import web
from traitlets import default

from workbench_hub.service import scopes
from workbench_hub.service.access_log import ScrubbedRequestLog
from workbench_hub.service.fleet import Fleet, SettingsMissingError
from workbench_hub.service.hub_client import HubClient, HubUnavailableError
from workbench_hub.service.metrics import render_metrics
from workbench_hub.service.openapi import BodyError, validate_body, with_server
from workbench_hub.service.scopes import ADMIN_SCOPE
from workbench_hub.service.scopes import READ_SCOPE as READ_SCOPE  # read from here by the tests
from workbench_spawner.rules.quota import QuotaError, quota_from_body

log = logging.getLogger("workbench.service")

MAX_NAME = 255
# How long a request waits for the hub to publish its settings before a 503.
SETTINGS_WAIT_SECONDS = 2.0
UNAVAILABLE = (SettingsMissingError, HubUnavailableError)


def _json(data: Any) -> str:
    """JSON that is also safe if a browser ever sniffs it as HTML."""
    return json.dumps(data).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


_jinja = Environment(
    loader=FileSystemLoader(str(Path(__file__).parent / "templates")), autoescape=select_autoescape(["html"])
)


def unknown_user(name: str) -> str:
    return (
        f"no user named {json.dumps(name)} on this hub: they must sign up at /hub/signup and be "
        f"authorized at /hub/authorize, or be created on the hub's admin page"
    )


class WorkbenchOAuth(HubOAuth):
    """HubOAuth whose cookies (the login's token and the OAuth state) say ``SameSite=Lax`` explicitly: a page
    of another site may link to the service (a top-level GET, which reads and changes nothing), but its
    forms, frames and scripts' requests carry no login. ``JUPYTERHUB_COOKIE_OPTIONS`` may say otherwise."""

    @default("cookie_options")
    def _default_cookie_options(self):
        options = os.environ.get("JUPYTERHUB_COOKIE_OPTIONS")
        return {"samesite": "Lax", **(json.loads(options) if options else {})}


class WorkbenchHandler(HubOAuthenticated, ScrubbedRequestLog, web.RequestHandler):
    """Identifies the caller through the hub; every handler checks scopes itself.

    HubOAuthenticated comes first: ScrubbedRequestLog is a RequestHandler, and before it, RequestHandler's own
    get_login_url would come before HubAuthenticated's in the method order."""

    needs_settings = True
    hub_auth_class = WorkbenchOAuth

    @property
    def hub_scopes(self):
        # Any identified hub user or service gets past HubAuthenticated, so that a caller without the
        # scope an operation needs reads a sentence naming it (HubAuthenticated's own refusal is a bare 403);
        # each handler decides per request, with the scopes the caller's token holds (scopes.py).
        return None

    @property
    def fleet(self) -> Fleet:
        return self.settings["fleet"]

    @property
    def hub(self) -> HubClient:
        return self.settings["hub"]

    def get_current_user(self):
        try:
            return super().get_current_user()
        except web.HTTPError as exc:
            if exc.status_code >= 500:  # HubAuth could not reach or use the hub's API
                log.warning("Could not identify the caller: %s", exc.log_message)
                raise HubUnavailableError(
                    "the hub's API did not answer while checking the caller's token; try again in a moment"
                ) from None
            raise

    @property
    def caller(self) -> dict | None:
        return self.get_current_user()

    def scopes(self) -> set[str]:
        return scopes.scopes_of(self.caller)

    def is_admin(self) -> bool:
        return scopes.is_admin(self.caller)

    def can_read(self) -> bool:
        """Everyone's data: custom:workbench:read or :admin."""
        return scopes.reads_everyone(self.caller)

    def reads_own(self) -> bool:
        """A hub user's own data: custom:workbench:self for them, or a scope that reads everyone's."""
        return scopes.reads_own(self.caller)

    def caller_name(self) -> str:
        caller = self.caller or {}
        return f"{caller.get('kind', 'user')}:{caller.get('name', '?')}"

    async def wait_for_settings(self) -> None:
        """Give a hub that is starting a moment to publish its settings; then SettingsMissingError (503)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTINGS_WAIT_SECONDS
        while True:
            try:
                await asyncio.to_thread(lambda: self.fleet.settings)
                return
            except SettingsMissingError:
                if loop.time() >= deadline:
                    raise
                await asyncio.sleep(0.25)

    def log_exception(self, typ, value, tb):
        if isinstance(value, UNAVAILABLE):
            log.warning("%s %s: 503: %s", self.request.method, self.request.path, value)
            return
        super().log_exception(typ, value, tb)

    @staticmethod
    def error_status(status_code: int, exc) -> int:
        return 503 if isinstance(exc, UNAVAILABLE) else status_code


class APIHandler(WorkbenchHandler):
    def set_default_headers(self):
        # The security headers (nosniff, CSP, ...) are added to every answer by headers.SecurityHeaders.
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.set_header("Cache-Control", "no-store")

    # XSRF: token requests need none; a cookie request that changes something
    # must carry X-XSRFToken, checked by HubOAuth while it identifies the
    # caller (HubAuthenticated.check_xsrf_cookie). A failed check means: no caller.

    def get_login_url(self):
        raise web.HTTPError(403)

    def fail(self, status: int, message: str) -> NoReturn:
        raise web.HTTPError(status, "%s", message)

    def write_error(self, status_code: int, **kwargs):
        message = None
        exc = kwargs.get("exc_info", (None, None, None))[1]
        status_code = self.error_status(status_code, exc)
        if isinstance(exc, UNAVAILABLE):
            message = str(exc)
        elif isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        if message is None:
            message = {
                400: "bad request",
                401: "authentication required",
                403: "forbidden",
                404: "not found",
                405: "method not allowed; see api/openapi.json",
            }.get(status_code, "the workbench service failed to answer; the service log says why")
        self.set_status(status_code)
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(_json({"status": status_code, "message": message}))

    def require_caller(self) -> dict:
        if not self.caller:
            self.fail(
                403,
                "authentication required: send a hub API token (Authorization: token ...) "
                "or log in through the hub (cookie requests need an X-XSRFToken header)",
            )
        return self.caller

    async def require_read(self) -> None:
        self.require_caller()
        if not self.can_read():
            self.fail(403, scopes.everyone_refusal())
        await self.wait_for_settings()

    def require_own(self, what: str) -> dict:
        """The caller, a hub user who may read ``what`` (their own data: "your own GPU usage"); else a 403
        naming the scope it lacks."""
        caller = self.require_caller()
        if not self.reads_own():
            self.fail(403, scopes.own_data_refusal(caller, what))
        return caller

    async def require_admin(self, what: str = "change quotas") -> None:
        self.require_caller()
        if not self.is_admin():
            self.fail(403, f"only hub admins may {what} (scope {ADMIN_SCOPE})")
        await self.wait_for_settings()

    def json_body(self) -> Any:
        try:
            return json.loads(self.request.body or b"")
        except (ValueError, UnicodeDecodeError) as exc:
            self.fail(400, f'the body is not valid JSON ({str(exc)[:80]}); send e.g. {{"max_gpus": 1}}')

    def valid_body(self, schema: str, what: str) -> Any:
        """The JSON body, checked against ``components/schemas/<schema>`` of the service's document;
        else 400 with ``what`` and a sentence naming the field and the rule ("invalid quota: ...")."""
        body = self.json_body()
        try:
            validate_body(self.settings["openapi"], schema, body)
        except BodyError as exc:
            self.fail(400, f"{what}: {exc}")
        return body

    def send(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(_json(data))


def _check_name(kind: str, name: str) -> str:
    if not name or len(name) > MAX_NAME:
        raise web.HTTPError(404, "%s", f"no {kind} with a name of that length")
    return name


class GPUsHandler(APIHandler):
    async def get(self):
        await self.require_read()
        fleet = self.fleet
        gpus, waiting = await asyncio.to_thread(lambda: (fleet.gpus(), fleet.layout_waiting()))
        inventory = fleet.inventory
        self.send(
            {
                "node": fleet.node,
                "source": inventory.source,
                "simulated": fleet.simulated,
                "message": inventory.message,
                "gpus": gpus,
                # GPUs whose new MIG layout waits for the servers on devices it removes (each row says so too).
                "layout_waiting": waiting,
            }
        )


def groups_from_login() -> str:
    """Where the hub's groups come from when the login manages them ("" when admins manage them by hand);
    the hub passes it (``WORKBENCH_GROUPS_FROM``, ``login_settings.groups_source``)."""
    return os.environ.get("WORKBENCH_GROUPS_FROM", "")


class AllocationsHandler(APIHandler):
    async def get(self):
        await self.require_read()
        self.send({"node": self.fleet.node, "allocations": await asyncio.to_thread(self.fleet.allocations)})


class QuotaListHandler(APIHandler):
    async def get(self):
        await self.require_read()
        stored = await asyncio.to_thread(self.fleet.book.all)
        settings = self.fleet.settings
        answer = {
            "default": settings.default_quota.to_json(),
            "models": settings.models(),
            "node": settings.node,
            "users": [q.to_json() for q in stored if q.kind == "user"],
            "groups": [q.to_json() for q in stored if q.kind == "group"],
        }
        if self.is_admin():  # which database the hub and this service share (no password)
            answer["database"] = settings.to_json()["db_url"]
        self.send(answer)


class QuotaHandler(APIHandler):
    kind = "user"

    async def _target(self, name: str) -> dict:
        _check_name(self.kind, name)
        model = await (self.hub.user(name) if self.kind == "user" else self.hub.group(name))
        if model is None and self.kind == "group" and groups_from_login():
            # The directory's groups reach the hub at their members' first logins: a course's quota may be set
            # before term starts (the answer says no member has logged in yet).
            return {"name": name, "users": [], "not_on_hub_yet": True}
        if model is None:
            self.fail(
                404, unknown_user(name) if self.kind == "user" else f"no group named {json.dumps(name)} on this hub"
            )
        return model

    async def _view(self, name: str, model: dict) -> dict:
        stored = await asyncio.to_thread(self.fleet.book.get, self.kind, name)
        result: dict[str, Any] = {"kind": self.kind, "name": name, "quota": stored.to_json() if stored else None}
        if self.kind == "user":
            result["effective"] = (
                await asyncio.to_thread(self.fleet.book.effective, name, model.get("groups") or [], self.fleet.default)
            ).to_json()
        else:
            result["users"] = model.get("users") or []
            if model.get("not_on_hub_yet"):
                result["note"] = (
                    f"No member of {name} has logged in yet: groups come from {groups_from_login()} at each login, "
                    "and this quota applies to its members from their first login on"
                )
        return result

    async def get(self, name: str):
        caller = self.require_caller()
        if self.kind == "user" and not self.can_read() and name == caller.get("name"):
            self.require_own("reading your own GPU quota")  # custom:workbench:self is enough for oneself
            await self.wait_for_settings()
        else:
            await self.require_read()
        model = await self._target(name)
        self.send(await self._view(name, model))

    async def put(self, name: str):
        await self.require_admin()
        body = self.valid_body("QuotaBody", "invalid quota")
        try:
            quota = quota_from_body(body, self.fleet.models())
        except QuotaError as exc:
            self.fail(400, f"invalid quota: {exc}")
        model = await self._target(name)
        await asyncio.to_thread(self.fleet.book.set, self.kind, name, quota, self.caller_name())
        log.info("%s set the quota of %s %s to %s", self.caller_name(), self.kind, name, quota.to_json())
        self.send(await self._view(name, model))

    async def delete(self, name: str):
        await self.require_admin()
        await self._target(name)
        await asyncio.to_thread(self.fleet.book.delete, self.kind, name)
        log.info("%s deleted the quota of %s %s", self.caller_name(), self.kind, name)
        self.set_status(204)
        self.finish()


class GroupQuotaHandler(QuotaHandler):
    kind = "group"


class MetricsHandler(APIHandler):
    def set_default_headers(self):
        self.set_header("Cache-Control", "no-store")

    async def get(self):
        await self.require_read()
        try:
            users = await self.hub.users()
        except HubUnavailableError as exc:
            # Fleet series matter more than quota series: scrape what we can.
            log.warning("metrics without per-user quotas: %s", exc)
            users = None
        text = await asyncio.to_thread(render_metrics, self.fleet, users)
        self.set_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.finish(text)


class OpenAPIHandler(APIHandler):
    def get(self):
        self.send(with_server(self.settings["openapi"], self.settings["prefix"]))


class NotFoundHandler(APIHandler):
    def prepare(self):
        self.fail(404, "no such endpoint; see api/openapi.json")


class OAuthCallbackHandler(ScrubbedRequestLog, HubOAuthCallbackHandler):
    """The end of the hub's OAuth login; its log lines hide the one-time ``code`` and the ``state``."""

    hub_auth_class = WorkbenchOAuth
