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
"""

from __future__ import annotations

import sys
from types import FrameType

from workbench_spawner.ledger import endings
from workbench_spawner.ledger.endings import Ending

# The culler services the hub may run: ours (configurer.update_services) and the z2jh chart's.
CULLERS = frozenset({"idle-culler", "jupyterhub-idle-culler", "cull-idle"})
# How far up the stack to look: the handler sits a few frames above Spawner.stop.
_DEPTH = 40


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
    """Call at the very start of ``Spawner.stop``: who asked for it, as an ``Ending``, or None."""
    return stop_reason_for(owner, _requester(), culler_seconds)
