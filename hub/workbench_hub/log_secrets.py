"""Secrets in request URLs hidden in every log line the hub's process writes, not only in its access log.

JupyterHub accepts an API token in the query string (``?token=...``) and
scrubs it from its own access log (``jupyterhub.log.log_request``). Tornado's
other lines about a request are not scrubbed: its warning for an HTTP error
(``403 GET /hub/api/users?token=...: Missing or invalid credentials``, which is
what a script with a wrong or revoked token produces) and its traceback for an
uncaught exception (which also prints the request object, URL included).
Operators paste those lines into issues and chat, so a token that was right
once, or is right on another hub, would travel with them.

``HideURLSecrets`` is a logging filter: on each record it formats the message
and replaces the value of every query parameter whose name contains one of
JupyterHub's own secret words (``token``, ``auth``, ``key``, ``code``,
``state``, ``_xsrf``: ``jupyterhub.log.SCRUB_PARAM_KEYS``) by ``[secret]``,
keeping the parameter's name, as the access log does. The hub config installs
it (:func:`install`) on tornado's and JupyterHub's loggers; the workbench
service has its own request log (``service/access_log.py``) for its process.
"""

from __future__ import annotations

import logging
import re

from jupyterhub.log import SCRUB_PARAM_KEYS

SECRET = "[secret]"
# A query parameter (after ? or &) whose name holds a secret word, and its value up to the next separator.
_PARAMETER = re.compile(
    r"(?P<name>[?&][^=&\s#?]*(?:" + "|".join(map(re.escape, SCRUB_PARAM_KEYS)) + r")[^=&\s#?]*=)"
    r"(?P<value>[^&\s#'\"<>),]*)"
)
# Where the hub's process writes about requests: tornado's access, warning and error logs, and JupyterHub's own.
LOGGERS = ("tornado.access", "tornado.general", "tornado.application", "JupyterHub")


def hide_url_secrets(text: str) -> str:
    """``text`` with the values of secret-looking query parameters replaced by ``[secret]``."""
    return _PARAMETER.sub(lambda match: match["name"] + SECRET, text)


class HideURLSecrets(logging.Filter):
    """Rewrites a record whose formatted message names a secret query parameter; other records pass untouched."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a malformed record: leave it to the handler's own error report
            return True
        hidden = hide_url_secrets(message)
        if hidden != message:
            record.msg, record.args = hidden, None
        return True


def install(names: tuple[str, ...] = LOGGERS) -> None:
    """Add the filter to each named logger once (a filter on a logger sees the records logged to that logger)."""
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, HideURLSecrets) for f in logger.filters):
            logger.addFilter(HideURLSecrets())
