"""Who asked the hub to stop a server: the user, an admin, the idle culler or another service.

The usage ledger says why each lease ended, and "stopped" alone does not
tell an admin whether a student pressed Stop, a colleague stopped the server
from the admin page, or the culler found it idle. JupyterHub gives a spawner
no way to learn who asked for its ``stop()`` (it is called with no request
and no requester; no upstream hook or event carries it: the hub's
``server-action`` event names only the user and server). What the hub does
have is the request handler that started the stop: ``stop_single_user``'s
inner ``stop()`` closes over it, and that coroutine is on the stack while
``Spawner.stop`` begins. This module is the one place that reads it, so if
JupyterHub ever passes the requester, only ``requested_by`` changes. When
nothing is found (the hub's own shutdown, a poll that found the server dead,
a test calling ``stop()`` directly), the answer is None and the caller keeps
its plain reason. The answer is an ``Ending`` (``ledger.endings``): the
ledger's reason and the sentence the student reads ("An admin (prof)
stopped this server.").

A hub shutdown through the API (``POST /hub/api/shutdown`` with
``servers: true``) stops every server after its request: JupyterHub's
``ShutdownAPIHandler`` answers 202, then ``JupyterHub.stop()`` schedules the
app's clean-up, which stops the servers with no handler on the stack.
JupyterHub has no hook for a shutdown request (its events name server
actions only). What runs in the handler's task, after it accepted the
shutdown and before it calls ``stop()``, is the request's log line: tornado's
``log_function`` setting, which ``note_shutdown_requests`` wraps (JupyterHub's
own ``log_request`` still writes the line). There ``note_shutdown`` puts who
asked in a context variable; the clean-up runs in a copy of that task's
context (``IOLoop.add_callback``, like every asyncio callback, copies the
context it is scheduled from), so the stops it makes find it, and nothing
else does. Were the stops made some other way, they would find nothing and
say what they said before: "The hub stopped this server". A subclass of the
handler is not needed, nor could ``extra_handlers`` put one first: JupyterHub
routes its own handlers before them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextvars import ContextVar
from types import FrameType
from typing import TYPE_CHECKING

from workbench_spawner.ledger import endings
from workbench_spawner.ledger.endings import Ending

if TYPE_CHECKING:
    from tornado.web import RequestHandler
    from traitlets.config import Config

# The culler services the hub may run: ours (configurer.update_services) and the z2jh chart's.
CULLERS = frozenset({"idle-culler", "jupyterhub-idle-culler", "cull-idle"})
# How far up the stack to look: the handler sits a few frames above Spawner.stop.
_DEPTH = 40
# Who shut the hub down through its API, in the context of that request's task (and the clean-up it started).
_shutdown_by: ContextVar[Ending | None] = ContextVar("workbench_shutdown_by", default=None)


def _requester() -> object | None:
    """The ``current_user`` of the JupyterHub request handler on the stack, if any (a User or a Service)."""
    try:
        from tornado.web import RequestHandler
    except ImportError:  # pragma: no cover - tornado comes with JupyterHub
        return None
    frame: FrameType | None = sys._getframe(2)
    for _ in range(_DEPTH):
        if frame is None:
            return None
        handler = frame.f_locals.get("self")
        if isinstance(handler, RequestHandler):
            try:
                user: object | None = handler.current_user
                return user
            except Exception:  # noqa: BLE001 - JupyterHub's handler, read from a caller's frame: any failure is unknown
                return None
        frame = frame.f_back
    return None


def stop_reason_for(owner: str, requester: object | None, culler_seconds: float = 0) -> Ending | None:
    """Why ``owner``'s server stops, asked by ``requester`` (None: unknown). ``culler_seconds``: the idle
    culler's timeout, so its sentence says after how long."""
    if requester is None:
        return None
    kind = getattr(requester, "kind", None)
    name = str(getattr(requester, "name", None) or "")
    if kind == "service":
        return endings.stopped_by_culler(culler_seconds) if name in CULLERS else endings.stopped_by_service(name)
    if kind == "user":
        return endings.stopped_by_user() if name == owner else endings.stopped_by_admin(name)
    return None


def requested_by(owner: str, culler_seconds: float = 0) -> Ending | None:
    """Call at the very start of ``Spawner.stop``: who asked for it (or for the hub shutdown that stops the
    server), as an ``Ending``, or None."""
    return stop_reason_for(owner, _requester(), culler_seconds) or _shutdown_by.get()


def shutdown_reason(requester: object | None) -> Ending | None:
    """Why the servers stop when ``requester`` shut the hub down through its API (None: unknown). A user
    needs the ``shutdown`` scope, which only admins have unless a role grants it: said as an admin, as
    ``stop_reason_for`` says a user who stops another's server."""
    kind = getattr(requester, "kind", None)
    name = str(getattr(requester, "name", None) or "")
    if kind == "service":
        return endings.stopped_by_hub(service=name)
    if kind == "user":
        return endings.stopped_by_hub(admin=name)
    return None


def note_shutdown(handler: RequestHandler) -> None:
    """If ``handler`` accepted a hub shutdown (JupyterHub's ``ShutdownAPIHandler`` answered 202), keep who
    asked in the context of its task, for the stops of the clean-up it starts next."""
    from jupyterhub.apihandlers.hub import ShutdownAPIHandler

    if isinstance(handler, ShutdownAPIHandler) and handler.get_status() == 202:
        ending = shutdown_reason(handler.current_user)
        if ending is not None:
            _shutdown_by.set(ending)


def noting_shutdowns(log_function: Callable[[RequestHandler], None]) -> Callable[[RequestHandler], None]:
    """``log_function`` (tornado's per-request log call), with ``note_shutdown`` first."""

    def log_request(handler: RequestHandler) -> None:
        note_shutdown(handler)
        log_function(handler)

    return log_request


def note_shutdown_requests(c: Config) -> None:
    """Make the hub note who asks for its shutdown (the module's docstring says how): tornado's ``log_function``
    in ``c.JupyterHub.tornado_settings`` (JupyterHub's ``log_request``, or one a site set) wrapped."""
    from jupyterhub.log import log_request

    hub = c.JupyterHub
    settings = dict(hub.tornado_settings) if "tornado_settings" in hub else {}
    settings["log_function"] = noting_shutdowns(settings.get("log_function") or log_request)
    c.JupyterHub.tornado_settings = settings
