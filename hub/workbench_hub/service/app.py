"""Handlers and the tornado application of the workbench service (see the package docstring)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import socket
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

from jinja2 import Environment, FileSystemLoader, select_autoescape
from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.ioloop import IOLoop, PeriodicCallback

from workbench_gpu_monitor.devices import DeviceInventory, discover_devices
from workbench_spawner.quota import (
    WEEK,
    Quota,
    QuotaBook,
    QuotaError,
    gpu_hours_by_user,
    parse_quota,
)
from workbench_spawner.store import AllocationStore, utcnow

from .metrics import render_metrics
from .openapi import openapi_document

log = logging.getLogger("workbench.service")

ADMIN_SCOPE = "custom:workbench:admin"
READ_SCOPE = "custom:workbench:read"
MAX_BODY = 64 * 1024
MAX_NAME = 255
def _json(data: Any) -> str:
    """JSON that is also safe if a browser ever sniffs it as HTML."""
    return json.dumps(data).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


_jinja = Environment(loader=FileSystemLoader(str(Path(__file__).parent / "templates")),
                     autoescape=select_autoescape(["html"]))


class Fleet:
    """What the service knows: the inventory, the store, the quota book and live readings."""

    def __init__(self, inventory: DeviceInventory, store: AllocationStore, default: Quota, slots: int = 1,
                 hub_api_url: str = "", hub_token: str = ""):
        self.inventory = inventory
        self.store = store
        self.book = QuotaBook(store)
        self.default = default
        self.slots = max(1, slots)
        self.hub_api_url = hub_api_url.rstrip("/")
        self.hub_token = hub_token
        self.hostname = socket.gethostname()
        self._source = None
        self._reading: dict | None = None
        self._reading_at = 0.0

    @property
    def simulated(self) -> bool:
        return self.inventory.source == "simulated"

    def models(self) -> list[str]:
        return sorted({d.model for d in self.inventory.devices if d.model})

    def readings(self) -> dict[str, dict]:
        """Live readings by GPU UUID from the gpu-monitor sampler's source (cached 1 s)."""
        if time.monotonic() - self._reading_at < 1.0 and self._reading is not None:
            return self._reading
        result: dict[str, dict] = {}
        try:
            if self._source is None:
                from workbench_gpu_monitor.sampler import SimulatedSource, make_source, select_devices

                # An empty environment selects the whole fleet (no WORKBENCH_GPUS).
                if self.simulated:
                    self._source = SimulatedSource(select_devices(self.inventory, {}))
                elif self.inventory.devices:
                    self._source = make_source({})
                else:
                    return {}
            snapshot = self._source.read()
            for gpu in snapshot.get("gpus", []):
                result[gpu["uuid"]] = {**gpu, "source": snapshot.get("source")}
        except Exception as exc:  # never let a monitoring hiccup break the page
            log.warning("Could not read live GPU numbers: %s", exc)
        self._reading, self._reading_at = result, time.monotonic()
        return result

    # -- the hub's REST API ------------------------------------------------------

    async def hub(self, method: str, path: str, body: Any = None) -> Any:
        request = HTTPRequest(
            self.hub_api_url + path,
            method=method,
            headers={"Authorization": f"token {self.hub_token}", "Content-Type": "application/json"},
            body=None if body is None else json.dumps(body),
            allow_nonstandard_methods=True,
            request_timeout=30,
        )
        try:
            response = await AsyncHTTPClient().fetch(request)
        except HTTPClientError as exc:
            if exc.code == 404:
                return None
            raise
        return json.loads(response.body) if response.body else {}

    async def users(self) -> list[dict]:
        users: list[dict] = []
        offset = 0
        while True:
            page = await self.hub("GET", f"/users?offset={offset}&limit=200")
            if not page:
                break
            users.extend(page)
            if len(page) < 200:
                break
            offset += 200
        return users

    async def groups(self) -> list[dict]:
        return await self.hub("GET", "/groups?limit=200") or []

    async def user(self, name: str) -> dict | None:
        return await self.hub("GET", f"/users/{quote(name, safe='')}")

    async def group(self, name: str) -> dict | None:
        return await self.hub("GET", f"/groups/{quote(name, safe='')}")

    # -- views ---------------------------------------------------------------------

    def gpus(self) -> list[dict]:
        holders: dict[str, list[dict]] = {}
        for lease in self.store.leases():
            for uuid in lease.gpu_uuids:
                holders.setdefault(uuid, []).append(
                    {"user": lease.user, "server": lease.server, "since": lease.since.isoformat()}
                )
        readings = self.readings()
        result = []
        for device in self.inventory.devices:
            reading = readings.get(device.uuid, {})
            held = holders.get(device.uuid, [])
            result.append(
                {
                    "index": device.index,
                    "uuid": device.uuid,
                    "name": device.name,
                    "model": device.model,
                    "memory_total_bytes": device.memory_total_bytes,
                    "simulated": self.simulated,
                    "holders": held,
                    "free_slots": max(0, self.slots - len(held)),
                    "utilization_percent": reading.get("utilization_percent"),
                    "memory_used_bytes": reading.get("memory_used_bytes"),
                    "temperature_c": reading.get("temperature_c"),
                    "power_w": reading.get("power_w"),
                    "reading_source": reading.get("source"),
                }
            )
        return result

    def allocations(self) -> list[dict]:
        return [
            {"user": lease.user, "server": lease.server, "gpu_uuids": list(lease.gpu_uuids),
             "since": lease.since.isoformat(), "ref": lease.ref}
            for lease in self.store.leases()
        ]

    def user_summary(self, name: str, groups: list[str], hours: dict[str, float], held: dict[str, int]) -> dict:
        effective = self.book.effective(name, groups, self.default)
        return {
            "name": name,
            "groups": groups,
            "quota": effective.to_json(),
            "held_gpus": held.get(name, 0),
            "gpu_hours_week": round(hours.get(name, 0.0), 4),
        }

    def held_by_user(self) -> dict[str, int]:
        held: dict[str, int] = {}
        for lease in self.store.leases():
            held[lease.user] = held.get(lease.user, 0) + len(lease.gpu_uuids)
        return held

    # -- session limits --------------------------------------------------------------

    async def stop_overlong_servers(self) -> list[tuple[str, str]]:
        """Stop servers running longer than the session length recorded at their start."""
        limits = await asyncio.to_thread(self.book.session_limits)
        if not limits:
            return []
        stopped = []
        now = utcnow()
        for user in await self.users():
            for server_name, server in (user.get("servers") or {}).items():
                hours = limits.get((user["name"], server_name))
                started = server.get("started")
                # A server still starting is left alone: its start is not its session.
                if hours is None or not started or server.get("pending") or not server.get("ready"):
                    continue
                began = datetime.fromisoformat(started.replace("Z", "+00:00"))
                if now - began <= timedelta(hours=hours):
                    continue
                path = f"/users/{quote(user['name'], safe='')}/" + (
                    f"servers/{quote(server_name, safe='')}" if server_name else "server"
                )
                log.info("Stopping %s/%s: it ran longer than its %g-hour session limit",
                         user["name"], server_name or "default", hours)
                try:
                    await self.hub("DELETE", path)
                    stopped.append((user["name"], server_name))
                except Exception as exc:
                    log.warning("Could not stop %s/%s: %s", user["name"], server_name, exc)
        return stopped


# -- handlers ------------------------------------------------------------------------


class WorkbenchHandler(HubOAuthenticated, web.RequestHandler):
    """Identifies the caller through the hub; every handler checks scopes itself."""

    @property
    def hub_scopes(self):
        # Any identified hub user or service gets past HubAuthenticated;
        # the handlers below decide with the custom scopes.
        return None

    @property
    def fleet(self) -> Fleet:
        return self.settings["fleet"]

    @property
    def caller(self) -> dict | None:
        return self.get_current_user()

    def scopes(self) -> set[str]:
        return set((self.caller or {}).get("scopes") or [])

    def is_admin(self) -> bool:
        return ADMIN_SCOPE in self.scopes()

    def can_read(self) -> bool:
        return bool({ADMIN_SCOPE, READ_SCOPE} & self.scopes())

    def caller_name(self) -> str:
        caller = self.caller or {}
        return f"{caller.get('kind', 'user')}:{caller.get('name', '?')}"


class APIHandler(WorkbenchHandler):
    def set_default_headers(self):
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Content-Type-Options", "nosniff")

    # XSRF: token requests need none; a cookie request that changes something
    # must carry X-XSRFToken, checked by HubOAuth while it identifies the
    # caller (HubAuthenticated.check_xsrf_cookie). A failed check means: no caller.

    def get_login_url(self):
        raise web.HTTPError(403)

    def fail(self, status: int, message: str):
        raise web.HTTPError(status, "%s", message)

    def write_error(self, status_code: int, **kwargs):
        message = None
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        if message is None:
            message = {401: "authentication required", 403: "forbidden", 404: "not found",
                       405: "method not allowed"}.get(status_code, self._reason)
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(_json({"status": status_code, "message": message}))

    def require_caller(self) -> dict:
        if not self.caller:
            self.fail(403, "authentication required: send a hub API token (Authorization: token ...) "
                           "or log in through the hub (cookie requests need an X-XSRFToken header)")
        return self.caller

    def require_read(self) -> None:
        self.require_caller()
        if not self.can_read():
            self.fail(403, f"this needs the {READ_SCOPE} or {ADMIN_SCOPE} scope; ask a hub admin")

    def require_admin(self) -> None:
        self.require_caller()
        if not self.is_admin():
            self.fail(403, f"only hub admins may change quotas (scope {ADMIN_SCOPE})")

    def json_body(self) -> Any:
        try:
            return json.loads(self.request.body or b"")
        except (ValueError, UnicodeDecodeError) as exc:
            self.fail(400, f"the body is not valid JSON ({str(exc)[:80]}); send e.g. {{\"max_gpus\": 1}}")

    def send(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(_json(data))


def _check_name(kind: str, name: str) -> str:
    if not name or len(name) > MAX_NAME:
        raise web.HTTPError(404, "%s", f"no {kind} with a name of that length")
    return name


class GPUsHandler(APIHandler):
    async def get(self):
        self.require_read()
        gpus = await asyncio.to_thread(self.fleet.gpus)
        self.send({"source": self.fleet.inventory.source, "simulated": self.fleet.simulated,
                   "message": self.fleet.inventory.message, "gpus": gpus})


class AllocationsHandler(APIHandler):
    async def get(self):
        self.require_read()
        self.send({"allocations": await asyncio.to_thread(self.fleet.allocations)})


class QuotaListHandler(APIHandler):
    async def get(self):
        self.require_read()
        stored = await asyncio.to_thread(self.fleet.book.all)
        self.send({
            "default": self.fleet.default.to_json(),
            "users": [q.to_json() for q in stored if q.kind == "user"],
            "groups": [q.to_json() for q in stored if q.kind == "group"],
        })


class QuotaHandler(APIHandler):
    kind = "user"

    async def _target(self, name: str) -> dict:
        _check_name(self.kind, name)
        model = await (self.fleet.user(name) if self.kind == "user" else self.fleet.group(name))
        if model is None:
            self.fail(404, f"no {self.kind} named {json.dumps(name)} on this hub")
        return model

    async def _view(self, name: str, model: dict) -> dict:
        stored = await asyncio.to_thread(self.fleet.book.get, self.kind, name)
        result: dict[str, Any] = {"kind": self.kind, "name": name,
                                  "quota": stored.to_json() if stored else None}
        if self.kind == "user":
            result["effective"] = (
                await asyncio.to_thread(self.fleet.book.effective, name, model.get("groups") or [],
                                        self.fleet.default)
            ).to_json()
        else:
            result["users"] = model.get("users") or []
        return result

    async def get(self, name: str):
        self.require_read()
        model = await self._target(name)
        self.send(await self._view(name, model))

    async def put(self, name: str):
        self.require_admin()
        body = self.json_body()
        try:
            quota = parse_quota(body, self.fleet.models())
        except QuotaError as exc:
            self.fail(400, f"invalid quota: {exc}")
        model = await self._target(name)
        await asyncio.to_thread(self.fleet.book.set, self.kind, name, quota, self.caller_name())
        log.info("%s set the quota of %s %s to %s", self.caller_name(), self.kind, name, quota.to_json())
        self.send(await self._view(name, model))

    async def delete(self, name: str):
        self.require_admin()
        await self._target(name)
        await asyncio.to_thread(self.fleet.book.delete, self.kind, name)
        log.info("%s deleted the quota of %s %s", self.caller_name(), self.kind, name)
        self.set_status(204)
        self.finish()


class GroupQuotaHandler(QuotaHandler):
    kind = "group"


class UsageHandler(APIHandler):
    async def get(self):
        caller = self.require_caller()
        wanted = self.get_argument("user", None)
        if not self.can_read():
            if caller.get("kind") != "user":
                self.fail(403, f"this needs the {READ_SCOPE} scope")
            if wanted is not None and wanted != caller["name"]:
                self.fail(403, "you may read only your own usage")
            wanted = caller["name"]
        now = utcnow()
        hours = await asyncio.to_thread(gpu_hours_by_user, self.fleet.store, now)
        held = await asyncio.to_thread(self.fleet.held_by_user)
        if wanted is not None:
            _check_name("user", wanted)
            model = await self.fleet.user(wanted)
            if model is None:
                self.fail(404, f"no user named {json.dumps(wanted)} on this hub")
            models = [model]
        else:
            models = await self.fleet.users()
        users = []
        for model in models:
            summary = await asyncio.to_thread(self.fleet.user_summary, model["name"], model.get("groups") or [],
                                              hours, held)
            users.append(summary)
        self.send({"window_start": (now - WEEK).isoformat(), "window_end": now.isoformat(), "users": users})


class MetricsHandler(APIHandler):
    def set_default_headers(self):
        self.set_header("Cache-Control", "no-store")

    async def get(self):
        self.require_read()
        text = await asyncio.to_thread(render_metrics, self.fleet)
        self.set_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.finish(text)


class OpenAPIHandler(APIHandler):
    def get(self):
        self.send(openapi_document(self.settings["prefix"]))


class NotFoundHandler(APIHandler):
    def prepare(self):
        self.fail(404, "no such endpoint; see api/openapi.json")


class PageHandler(WorkbenchHandler):
    @web.authenticated
    async def get(self):
        if not self.can_read():
            self.set_status(403)
            self.finish(_jinja.get_template("forbidden.html").render(
                name=(self.caller or {}).get("name", ""), scope=ADMIN_SCOPE, hub_prefix=self.settings["hub_prefix"]))
            return
        fleet = self.fleet
        users = await fleet.users()
        groups = await fleet.groups()
        now = utcnow()
        hours = await asyncio.to_thread(gpu_hours_by_user, fleet.store, now)
        held = await asyncio.to_thread(fleet.held_by_user)
        summaries = [fleet.user_summary(u["name"], u.get("groups") or [], hours, held) for u in users]
        stored_groups = {q.name: q for q in fleet.book.all("group")}
        group_rows = [
            {"name": g["name"], "users": g.get("users") or [],
             "quota": stored_groups[g["name"]].quota.to_json() if g["name"] in stored_groups else None}
            for g in groups
        ]
        self.set_header("Cache-Control", "no-store")
        self.finish(_jinja.get_template("admin.html").render(
            prefix=self.settings["prefix"],
            hub_prefix=self.settings["hub_prefix"],
            static=self.settings["hub_prefix"] + "static/",
            caller=self.caller,
            admin=self.is_admin(),
            inventory=fleet.inventory,
            simulated=fleet.simulated,
            gpus=fleet.gpus(),
            users=summaries,
            groups=group_rows,
            default=fleet.default.to_json(),
            models=fleet.models(),
            xsrf=self.xsrf_token.decode() if isinstance(self.xsrf_token, bytes) else self.xsrf_token,
            now=now,
        ))


def make_app(fleet: Fleet, prefix: str = "/services/workbench/", hub_prefix: str = "/hub/") -> web.Application:
    prefix = "/" + prefix.strip("/") + "/"
    name = r"([^/]+)"
    routes = [
        (prefix, PageHandler),
        (prefix + "oauth_callback", HubOAuthCallbackHandler),
        (prefix + "api/gpus", GPUsHandler),
        (prefix + "api/allocations", AllocationsHandler),
        (prefix + "api/quotas", QuotaListHandler),
        (prefix + "api/quotas/users/" + name, QuotaHandler),
        (prefix + "api/quotas/groups/" + name, GroupQuotaHandler),
        (prefix + "api/usage", UsageHandler),
        (prefix + "api/openapi.json", OpenAPIHandler),
        (prefix + "metrics", MetricsHandler),
        (prefix + "api/.*", NotFoundHandler),
    ]
    return web.Application(
        routes,
        fleet=fleet,
        prefix=prefix,
        hub_prefix=hub_prefix,
        cookie_secret=os.urandom(32),
        xsrf_cookies=False,
    )


ROUTES_FOR_OPENAPI = [
    ("get", "/"),
    ("get", "/api/gpus"),
    ("get", "/api/allocations"),
    ("get", "/api/quotas"),
    ("get", "/api/quotas/users/{name}"),
    ("put", "/api/quotas/users/{name}"),
    ("delete", "/api/quotas/users/{name}"),
    ("get", "/api/quotas/groups/{name}"),
    ("put", "/api/quotas/groups/{name}"),
    ("delete", "/api/quotas/groups/{name}"),
    ("get", "/api/usage"),
    ("get", "/api/openapi.json"),
    ("get", "/metrics"),
]


def default_db_url() -> str:
    if os.environ.get("WORKBENCH_DB_URL"):
        return os.environ["WORKBENCH_DB_URL"]
    data_dir = os.environ.get("WORKBENCH_DATA_DIR") or os.path.join(os.getcwd(), "data")
    os.makedirs(data_dir, exist_ok=True)
    return "sqlite:///" + os.path.join(os.path.abspath(data_dir), "workbench.sqlite")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m workbench_hub.service", description=__doc__)
    service_url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101"))
    parser.add_argument("--ip", default=service_url.hostname or "127.0.0.1")
    parser.add_argument("--port", type=int, default=service_url.port or 10101)
    parser.add_argument("--db-url", default=default_db_url())
    parser.add_argument("--default-max-gpus", type=int, default=int(os.environ.get("WORKBENCH_DEFAULT_MAX_GPUS", "1")))
    parser.add_argument("--servers-per-gpu", type=int, default=int(os.environ.get("WORKBENCH_SERVERS_PER_GPU", "1")))
    parser.add_argument("--session-check-seconds", type=float,
                        default=float(os.environ.get("WORKBENCH_SESSION_CHECK_SECONDS", "60")),
                        help="how often to stop servers that outlived their session limit (0: never)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(levelname)1.1s %(asctime)s workbench-service] %(message)s")

    inventory = discover_devices(os.environ.get("WORKBENCH_SIMULATED_GPUS", ""))
    store = AllocationStore(args.db_url)
    api_url = os.environ.get("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api")
    fleet = Fleet(inventory, store, Quota(max_gpus=args.default_max_gpus), args.servers_per_gpu,
                  api_url, os.environ.get("JUPYTERHUB_API_TOKEN", ""))
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/workbench/")
    hub_prefix = os.environ.get("JUPYTERHUB_BASE_URL", "/").rstrip("/") + "/hub/"
    app = make_app(fleet, prefix, hub_prefix)
    app.listen(args.port, args.ip, max_body_size=MAX_BODY, xheaders=True)
    log.info("Workbench service at http://%s:%s%s (%s GPUs, %s)", args.ip, args.port, prefix,
             len(inventory.devices), inventory.source)
    if args.session_check_seconds > 0:
        async def check():
            try:
                await fleet.stop_overlong_servers()
            except Exception as exc:
                log.warning("Session limit check failed: %s", exc)

        PeriodicCallback(check, args.session_check_seconds * 1000).start()
    IOLoop.current().start()
