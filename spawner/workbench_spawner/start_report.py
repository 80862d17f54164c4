"""The hub's side of a server's start report: which starting spawner a request speaks for.

Where an engine places (Slurm, Kubernetes), the server's own start-up tells
the hub what the engine gave it (port, node, GPU UUIDs) before the lease is
written. The request carries the server's API token, which the hub gave that
one spawner; ``token_spawner`` finds it and ``require_starting`` takes a
report only while it is starting, so a report can neither speak for another
server nor change a running one.
Each backend's handler then takes exactly the fields it knows.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from tornado import web

if TYPE_CHECKING:
    from jupyterhub.apihandlers.base import APIHandler
    from jupyterhub.spawner import Spawner


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
