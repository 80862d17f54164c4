"""The service's request log, with secrets in URLs hidden as ``[secret]`` the way the hub's log hides them.

A script may pass its token in the query (``api/usage?token=...``, as
JupyterHub allows), and the OAuth callback carries the one-time ``code`` and
the ``state`` in its query. Tornado's own access log, and its warnings for
errors, print the whole URL; the service runs under the hub, so that URL
would land in the hub's log, which operators copy into issues. So every line
that names a request goes through JupyterHub's own scrubbing
(``jupyterhub.log._scrub_uri``): any query parameter whose name contains
``token``, ``auth``, ``key``, ``code``, ``state`` or ``_xsrf`` keeps its name
and loses its value, as the hub and jupyter_server do.

* ``log_request`` is the application's ``log_function`` (the access log):
  ``200 GET /services/workbench/api/usage?token=[secret] (127.0.0.1) 3.12ms``;
* ``ScrubbedRequestLog`` is mixed into every handler class the service
  mounts (its own, the OAuth callback, static files, the 404 for unknown
  paths): tornado's warning for an HTTP error and its traceback for an
  uncaught exception name the request by the same scrubbed summary, and the
  traceback no longer prints the request object (whose repr holds the URL);
* ``HideOAuthState``, a filter on tornado's application log: JupyterHub's
  OAuth callback warns of a state that does not match with both values, the
  URL's and the one in the browser's state cookie (a login in progress); the
  line keeps its words, the values become ``[secret]``.

Headers never reach a log line: neither tornado nor the service logs them.
"""

from __future__ import annotations

import logging

from jupyterhub.log import _scrub_uri
from tornado import web
from tornado.log import access_log, app_log

SECRET = "[secret]"
# JupyterHub's HubOAuthCallbackHandler: app_log.warning("oauth state argument %r != cookie %s=%r", ...)
OAUTH_STATE_MISMATCH = "oauth state argument %r != cookie %s=%r"


def scrub_uri(uri: str) -> str:
    """``uri`` with the values of secret-looking query parameters replaced by ``[secret]`` (the hub's rule)."""
    return _scrub_uri(uri)


def request_summary(handler: web.RequestHandler) -> str:
    request = handler.request
    return f"{request.method} {scrub_uri(request.uri or '')} ({request.remote_ip})"


def log_request(handler: web.RequestHandler) -> None:
    """Tornado's access log line, with the URL scrubbed: INFO below 400, WARNING below 500, else ERROR."""
    status = handler.get_status()
    level = logging.INFO if status < 400 else logging.WARNING if status < 500 else logging.ERROR
    elapsed_ms = 1000.0 * handler.request.request_time()
    access_log.log(level, "%d %s %.2fms", status, request_summary(handler), elapsed_ms)


class ScrubbedRequestLog(web.RequestHandler):
    """Tornado's own log lines about a request (HTTP errors, uncaught exceptions) with the scrubbed URL."""

    def _request_summary(self) -> str:
        return request_summary(self)

    def log_exception(self, typ, value, tb) -> None:
        if isinstance(value, web.HTTPError):
            super().log_exception(typ, value, tb)  # one line through _request_summary above
            return
        app_log.error("Uncaught exception %s", self._request_summary(), exc_info=(typ, value, tb))


class HideOAuthState(logging.Filter):
    """Replaces the two OAuth state values of JupyterHub's state-mismatch warning by ``[secret]``."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == OAUTH_STATE_MISMATCH and isinstance(record.args, tuple) and len(record.args) == 3:
            record.msg = "oauth state argument %s != cookie %s=%s"
            record.args = (SECRET, record.args[1], SECRET)
        return True


def hide_oauth_state() -> None:
    """Install ``HideOAuthState`` on tornado's application log (once; the service calls it at start)."""
    if not any(isinstance(f, HideOAuthState) for f in app_log.filters):
        app_log.addFilter(HideOAuthState())
