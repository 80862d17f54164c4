"""The start-report handler every engine backend serves on the hub's API, built from the engine's reader.

A server's start-up posts what it sees (its node, its GPUs) with the server's
own API token. Only the starting spawner that token belongs to takes it
(``start_report.token_spawner``, ``require_starting``), and only the fields
the engine's reader accepts, each checked for shape; whether they are *true*
is checked by the placement against the engine's record before any lease.
The route is added through ``engine_extension.add_hub_route``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from jupyterhub.apihandlers import APIHandler
from tornado import web

from workbench_spawner.start_report import require_starting, token_spawner


class ReportRefusedError(ValueError):
    """A start report that is not accepted; str(err) is the sentence the server's start-up prints."""


def start_report_handler(
    accept: Callable[[Any], tuple[dict[str, Any], list[str]]], name: str, requires: str = ""
) -> type[APIHandler]:
    """A handler that sets on the starting spawner what ``accept(body)`` returns (attributes, and the field
    names the answer lists), or answers 400 with ``ReportRefusedError``'s sentence. ``requires``: an attribute
    the spawner must have (a server of another backend takes no such report)."""

    class StartReport(APIHandler):
        @web.authenticated
        def post(self) -> None:
            spawner = token_spawner(self)
            if requires and not hasattr(spawner, requires):
                raise web.HTTPError(400, "This server's backend takes no start report.")
            try:
                attributes, fields = accept(self.get_json_body())
            except ReportRefusedError as exc:
                raise web.HTTPError(400, f"Start report refused: {exc}.") from None
            require_starting(spawner)
            for key, value in attributes.items():
                setattr(spawner, key, value)
            self.set_status(201)
            self.finish(json.dumps({"message": "start report taken", "fields": fields}))

    StartReport.__name__ = StartReport.__qualname__ = name
    StartReport.__doc__ = f"The start report of {name.removesuffix('Handler')}: ``{accept.__qualname__}``."
    return StartReport
