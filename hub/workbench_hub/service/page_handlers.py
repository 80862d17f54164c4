"""The workbench service's HTML pages: the fleet page, My GPUs, the refusal and the 404.

* ``/services/workbench/`` shows the fleet (every GPU, user, group, stop, idle
  rule and reservation; admins change them there) to a caller who reads
  everyone's data (``custom:workbench:read`` or ``:admin``), and My GPUs to
  any other hub user with ``custom:workbench:self``: a student who follows
  the hub's Services menu lands on their own page, not on a refusal;
* ``/services/workbench/me`` is My GPUs for every user, readers included
  (``my_gpus.py`` gathers it; ``api/me`` is its JSON twin);
* a caller with neither gets a 403 page naming the scope it lacks;
* a path no route serves is an HTML 404 pointing to the two pages.

The pages log in through the hub (OAuth, ``web.authenticated``); names on
them are escaped by Jinja's autoescape and their scripts are files of
``static/``, so an injected script would not run (``headers.py``).
"""

from __future__ import annotations

import asyncio

from tornado import web
from tornado.escape import xhtml_escape

from workbench_hub.service import scopes
from workbench_hub.service.access_log import ScrubbedRequestLog
from workbench_hub.service.ends import ends_by_reason, recent_stops
from workbench_hub.service.handlers import UNAVAILABLE, WorkbenchHandler, _jinja, groups_from_login
from workbench_hub.service.my_gpus import my_gpus_of
from workbench_spawner.backend import node_drain_of
from workbench_spawner.ledger.gpu_hours import WEEK, gpu_hours_by_user
from workbench_spawner.ledger.store import utcnow


class PageHandler(WorkbenchHandler):
    """``/``: the fleet page for readers, My GPUs for other users, else the refusal page."""

    def write_error(self, status_code: int, **kwargs):
        exc = kwargs.get("exc_info", (None, None, None))[1]
        status_code = self.error_status(status_code, exc)
        self.set_status(status_code)
        text = str(exc) if isinstance(exc, UNAVAILABLE) else self._reason
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(f"<!doctype html><title>GPU Workbench</title><p>{xhtml_escape(text)}</p>")

    def page(self, template: str, status: int = 200, **values) -> None:
        """Render one of the service's pages with what every page shows (the links, the caller)."""
        self.set_status(status)
        self.set_header("Cache-Control", "no-store")
        self.finish(
            _jinja.get_template(template).render(
                prefix=self.settings["prefix"],
                hub_prefix=self.settings["hub_prefix"],
                caller=self.caller,
                reader=self.can_read(),
                admin=self.is_admin(),
                # Where the hub's groups come from when the login manages them (the hub's configurer).
                groups_from=groups_from_login(),
                **values,
            )
        )

    def refuse(self, sentence: str) -> None:
        self.page("forbidden.html", 403, name=(self.caller or {}).get("name", ""), sentence=sentence)

    @web.authenticated
    async def get(self):
        if self.can_read():
            await self.fleet_page()
        elif self.reads_own():
            await self.my_page()
        else:
            self.refuse(scopes.own_data_refusal(self.caller, "opening the GPU Workbench pages"))

    async def my_page(self) -> None:
        try:
            mine = await my_gpus_of(self, (self.caller or {})["name"])
        except LookupError as exc:
            raise web.HTTPError(404, "%s", str(exc)) from None
        self.page("my_gpus.html", me=mine)

    async def fleet_page(self) -> None:
        await self.wait_for_settings()
        fleet = self.fleet
        users = await self.hub.users()
        groups = await self.hub.groups()
        now = utcnow()

        def gather():
            stored_groups = {q.name: q for q in fleet.book.all("group")}
            hours = gpu_hours_by_user(fleet.store, now)
            return (
                fleet.user_summaries(users, hours, fleet.held_by_user()),
                stored_groups,
                fleet.gpus(),
                fleet.layout_waiting(),
                recent_stops(fleet.store),
                ends_by_reason(fleet.store, now - WEEK),
            )

        summaries, stored_groups, gpus, layout_waiting, stops, ends_week = await asyncio.to_thread(gather)
        # Where an engine places servers a workbench drain stops nothing: no Drain button, a line saying where.
        settings = fleet.settings
        drain_elsewhere = node_drain_of(settings.backend).line() if settings.placement == "engine" else ""
        group_rows = [
            {
                "name": g["name"],
                "users": g.get("users") or [],
                "quota": stored_groups[g["name"]].quota.to_json() if g["name"] in stored_groups else None,
            }
            for g in groups
        ]
        self.page(
            "admin.html",
            static=self.settings["hub_prefix"] + "static/",
            inventory=fleet.inventory,
            node=fleet.node,
            simulated=fleet.simulated,
            gpus=gpus,
            layout_waiting=layout_waiting,
            users=summaries,
            groups=group_rows,
            default=fleet.default.to_json(),
            models=fleet.models(),
            drain_elsewhere=drain_elsewhere,
            stops=stops,
            ends_week=ends_week,
            xsrf=self.xsrf_token.decode() if isinstance(self.xsrf_token, bytes) else self.xsrf_token,
            now=now,
        )


class MyPageHandler(PageHandler):
    """``/me``: My GPUs for every hub user who may read their own data."""

    @web.authenticated
    async def get(self):
        if not self.reads_own():
            self.refuse(scopes.own_data_refusal(self.caller, "opening My GPUs"))
            return
        await self.my_page()


class NotFoundPageHandler(ScrubbedRequestLog, web.RequestHandler):
    """A path under the service's prefix that no route serves (the API's own 404 is JSON: NotFoundHandler)."""

    def prepare(self):
        raise web.HTTPError(404)

    def write_error(self, status_code: int, **kwargs):
        prefix = self.settings["prefix"]
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(
            "<!doctype html><title>GPU Workbench</title>"
            f'<p>No page here. The GPU Workbench pages are <a href="{xhtml_escape(prefix)}">the fleet</a> '
            f'and <a href="{xhtml_escape(prefix)}me">My GPUs</a>.</p>'
        )


class StaticHandler(ScrubbedRequestLog, web.StaticFileHandler):
    """The pages' scripts (``static/``), public like any page's code; its log lines scrubbed like the rest."""
