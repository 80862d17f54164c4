"""The hub's ``_xsrf`` cookie is ``Secure`` exactly when its session cookies are, and every cookie of
the hub says ``SameSite=Lax``.

JupyterHub 6.1 decides ``Secure`` for its session cookies on each request
(``BaseHandler._set_cookie``): always when ``public_url`` is ``https://``,
else when the request came over HTTPS as tornado sees it
(``request.protocol``, taken from ``X-Forwarded-Proto``, which the hub
trusts). Its ``_xsrf`` cookie takes the static tornado setting
``xsrf_cookie_kwargs`` instead (``jupyterhub/_xsrf_utils.py``), a copy of
``cookie_options`` with no ``secure``, so over HTTPS it goes out without
``Secure``: a browser then also sends it on plain ``http://`` to the same
host, and an attacker on the network can plant an ``_xsrf`` of their own
(a ``Secure`` cookie cannot be overwritten from plain HTTP).

A static ``secure=True`` is right only where the session cookies are always
``Secure`` (the proxy serves the certificate; or a public ``https://`` URL,
``WORKBENCH_DOMAIN``). Behind a TLS proxy without a public URL
(``WORKBENCH_ALLOW_HTTP=1``) the session cookies follow each request's
``X-Forwarded-Proto``; a ``Secure`` ``_xsrf`` on a request that came in plain
HTTP is dropped by the browser and every form post then fails with an XSRF
error. So there ``secure`` is :data:`WHEN_HTTPS`, a value that is true
while the hub answers a request that came over HTTPS: tornado evaluates
``if secure:`` when the cookie is set, and :class:`NoteRequestScheme`, a
tornado output transform (the one per-request hook tornado's settings
offer: the application makes one for every request, right before it starts
the handler's task), records the request's scheme in a context variable
that the handler's task inherits. The same rule as the session cookies',
so plain HTTP on loopback, too, gets ``Secure`` only where they do.

:func:`secure_xsrf_cookie` runs on the final config (after the local config
file: a certificate, ``public_url`` or ``cookie_options`` set there counts)
and merges into ``tornado_settings`` (HSTS headers stay). What JupyterHub
would have put there is kept: ``cookie_options`` when no
``xsrf_cookie_kwargs`` were given (JupyterHub sets ``path`` itself); an
operator's own ``secure`` in ``xsrf_cookie_kwargs`` wins.

``SameSite=Lax`` goes on the session cookies (``cookie_options``, which
JupyterHub's ``_set_cookie`` applies to ``jupyterhub-session-id`` and
``jupyterhub-hub-login``) and on ``_xsrf``; JupyterHub sets no ``SameSite``.
Browsers then send them on top-level navigations (a link from the course
page to the hub still finds the student logged in) but not on a form another
site submits, a frame or a ``fetch``. Chromium treats a cookie without
``SameSite`` as ``Lax`` too, but for its first two minutes also sends it
on another site's top-level POST ("Lax+POST"); an explicit ``Lax`` has no
such window, and Firefox and Safari do not default to ``Lax`` at all.
``Strict`` would log the student out of every link that comes from
elsewhere (an e-mail, the LMS): each would land on the login page. An
operator's own ``samesite`` in ``cookie_options`` or
``xsrf_cookie_kwargs`` wins. (The user servers' cookies get the same in
``images/singleuser/jupyter_server_config.py``.)
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any
from urllib.parse import urlparse

from tornado.httputil import HTTPServerRequest
from tornado.web import GZipContentEncoding, OutputTransform
from traitlets.config import Config

# Every cookie the hub sets, unless the operator's settings say otherwise.
SAME_SITE = "Lax"

_request_is_https: ContextVar[bool] = ContextVar("workbench_request_is_https", default=False)


class NoteRequestScheme(OutputTransform):
    """Records whether the request being answered came over HTTPS, for :data:`WHEN_HTTPS`.

    Tornado makes one per request in ``_HandlerDelegate.execute``, in the
    connection's task, just before it starts the handler's task, which
    copies the context then; the next request on the connection sets it again.
    """

    def __init__(self, request: HTTPServerRequest) -> None:
        super().__init__(request)
        _request_is_https.set(request.protocol == "https")


class SecureWhenHTTPS:
    """True while the hub answers a request that came over HTTPS (see :class:`NoteRequestScheme`)."""

    def __bool__(self) -> bool:
        return _request_is_https.get()

    def __repr__(self) -> str:  # JupyterHub logs the cookie's settings
        return "<secure when the request is HTTPS>"

    def __deepcopy__(self, memo: dict) -> SecureWhenHTTPS:  # traitlets deep-copies config values
        return self

    def __copy__(self) -> SecureWhenHTTPS:
        return self


WHEN_HTTPS = SecureWhenHTTPS()


def _https_public_url(final: Config) -> bool:
    hub = final.JupyterHub
    return urlparse(hub.public_url if "public_url" in hub else "").scheme == "https"


def secure_xsrf_cookie(c: Config, final: Config) -> None:
    """Give ``_xsrf`` the session cookies' ``Secure`` rule, and all of them ``SameSite=Lax``, in
    ``c.JupyterHub.tornado_settings``.

    ``final`` is the final config (environment, local file, command line);
    ``c`` is the config file's, where the result goes.
    """
    hub = final.JupyterHub
    settings: dict[str, Any] = dict(hub.tornado_settings) if "tornado_settings" in hub else {}
    always = bool(hub.ssl_cert if "ssl_cert" in hub else "") or _https_public_url(final)
    secure = True if always else WHEN_HTTPS
    cookie_options = dict(settings.get("cookie_options") or {})
    # JupyterHub: "user xsrf_cookie_kwargs works as override", else cookie_options are copied.
    xsrf = dict(settings.get("xsrf_cookie_kwargs") or cookie_options)
    xsrf.setdefault("secure", secure)
    for options in (cookie_options, xsrf):
        options.setdefault("samesite", SAME_SITE)
    settings["cookie_options"] = cookie_options
    settings["xsrf_cookie_kwargs"] = xsrf
    if xsrf["secure"] is WHEN_HTTPS:
        transforms = settings.get("transforms")
        if transforms is None:  # what tornado's Application would make of these settings
            transforms = [GZipContentEncoding] if settings.get("compress_response") or settings.get("gzip") else []
        if NoteRequestScheme not in transforms:
            settings["transforms"] = [*transforms, NoteRequestScheme]
    c.JupyterHub.tornado_settings = settings
