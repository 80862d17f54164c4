"""A server's start report on the hub's API: the handler every engine backend serves, and the rules it shares.

Where an engine places (Slurm, Kubernetes), the server's own start-up tells
the hub what the engine gave it (its port, node, GPUs) before the lease is
written. The request carries the server's API token, which the hub gave that
one spawner: ``token_spawner`` finds it and ``require_starting`` takes a
report only while it is starting, so a report can neither speak for another
server nor change a running one. It comes from a process the user controls,
so only the fields the engine's reader accepts are kept, each checked for
shape (``report_fields``, ``is_text``, the limits below); whether they are
*true* is checked by the placement against the engine's record before any
lease. The route is added through ``engine_extension.add_hub_route``.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jupyterhub.apihandlers import APIHandler
from tornado import web

if TYPE_CHECKING:
    from jupyterhub.spawner import Spawner

MAX_GPUS = 64  # GPUs one report may list
MAX_TEXT = 256  # characters in any one text of a report


class ReportRefusedError(ValueError):
    """A start report that is not accepted; str(err) is the sentence the server's start-up prints."""


def report_fields(body: Any, fields: tuple[str, ...], carry: str = "may carry only") -> dict[str, Any]:
    """``body`` when it is a JSON object of no field but ``fields``, else ReportRefusedError with the reason.

    ``carry`` is the engine's verb in the refusal of an unknown field ("a start report <carry> port and ...")."""
    if not isinstance(body, dict):
        raise ReportRefusedError(f"the start report must be a JSON object with {' and '.join(fields)}")
    unknown = sorted(str(k)[:40] for k in body if k not in fields)
    if unknown:
        raise ReportRefusedError(f"a start report {carry} {' and '.join(fields)}; refused: {', '.join(unknown)}")
    return body


def is_text(value: Any) -> bool:
    """A non-empty text of at most MAX_TEXT characters (a node's name, a GPU's UUID)."""
    return isinstance(value, str) and 0 < len(value) <= MAX_TEXT


def token_spawner(handler: APIHandler) -> Spawner:
    """The spawner whose API token ``handler``'s request (a JupyterHub API handler's) presents; else an
    HTTPError 403."""
    token = handler.get_auth_token() or ""
    spawners = getattr(handler.current_user, "spawners", None) or {}  # a service's token has none
    spawner = next(
        (s for s in spawners.values() if token and s.api_token and hmac.compare_digest(s.api_token, token)), None
    )
    if spawner is None:
        raise web.HTTPError(
            403,
            "This token belongs to no server of this user that is starting; only a "
            "server's own start-up may report its port.",
        )
    return spawner


def require_starting(spawner: Spawner) -> None:
    """HTTPError 409 unless ``spawner`` is starting: a report never changes a running server.

    Checked after the report's own shape, so a malformed report is a 400 whatever the server's state."""
    if spawner.pending != "spawn":
        raise web.HTTPError(
            409,
            f"{spawner.server_label} is not starting, so there is nothing to report; "
            "a start report is taken only while the server starts.",
        )


def start_report_handler(name: str, read: Callable[[Any], dict[str, Any]], keep_in: str = "") -> type[APIHandler]:
    """The handler named ``name`` that takes a start report for the starting spawner whose token it presents.

    ``read(body)``: the accepted fields, or ReportRefusedError (a 400 with its sentence). ``keep_in``: the
    spawner attribute that keeps the fields whole (a spawner without it is of another backend, which takes no
    such report); without it each field is set as the spawner attribute of its name. The answer (201) lists
    the fields taken."""

    class StartReport(APIHandler):
        @web.authenticated
        def post(self) -> None:
            spawner = token_spawner(self)
            if keep_in and not hasattr(spawner, keep_in):
                raise web.HTTPError(400, "This server's backend takes no start report.")
            try:
                fields = read(self.get_json_body())
            except ReportRefusedError as exc:
                raise web.HTTPError(400, f"Start report refused: {exc}.") from None
            require_starting(spawner)
            for key, value in ({keep_in: fields} if keep_in else fields).items():
                setattr(spawner, key, value)
            self.set_status(201)
            self.finish(json.dumps({"message": "start report taken", "fields": sorted(fields)}))

    StartReport.__name__ = StartReport.__qualname__ = name
    StartReport.__doc__ = f"The start report of {name.removesuffix('Handler')}: ``{read.__module__}.{read.__name__}``."
    return StartReport
