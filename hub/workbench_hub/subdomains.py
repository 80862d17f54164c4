"""User content on its own origin: ``WORKBENCH_SUBDOMAIN_HOST``, JupyterHub's ``subdomain_host``.

Without it every user server lives under the hub's origin (``/user/bob/``), so
a page a student serves (an HTML file opened through ``/files/``, a web app
behind jupyter-server-proxy) runs with the hub's origin when an admin or an
instructor opens it: it can read the hub's pages as them, take the ``_xsrf``
token from one and call the hub's REST API (make a token, start servers,
change roles). JupyterHub's security guide names per-user subdomains as the
only way to keep users' content apart from the hub and from each other.

With ``WORKBENCH_SUBDOMAIN_HOST=https://hub.example.edu`` (or
``http://localhost:8000`` to try it on one machine, where browsers resolve
``*.localhost`` to loopback) :func:`update_subdomains` sets:

* ``subdomain_host`` (JupyterHub adds ``--host-routing`` to the proxy it
  starts; the z2jh chart's proxy pod needs it in
  ``proxy.chp.extraCommandLineFlags``, which the chart glue checks), so bob's
  server is at ``https://bob.hub.example.edu/user/bob/`` and the proxy routes by
  host name: the hub answers on every name, a user's server only on its own;
* ``subdomain_hook`` (:func:`user_subdomain`): users get JupyterHub's IDNA
  names, services stay on the hub's own host. The workbench service is ours,
  shows no user-authored HTML (every name it prints is escaped) and is linked
  as ``/services/workbench/`` from the hub's pages, the CLI and Prometheus;
  JupyterHub's own default would move it to ``workbench--service.<host>``;
* ``Proxy.extra_routes`` (:func:`service_aliases`): the services also on the
  names this machine's own clients use for the proxy (``127.0.0.1`` and
  ``localhost`` for the ``workbench`` CLI and scripts, ``hub`` for Prometheus
  in docker compose and the chart's hub Service), since host routing sends a
  request for ``127.0.0.1:8000/services/workbench/`` to the hub otherwise;
* ``Authenticator.post_auth_hook`` (:func:`refuse_login_off_hub_host`): the
  hub answers on every name, so its login form also shows at
  ``bob.hub.example.edu/hub/login``; an admin lured there would get the hub's
  login cookie on bob's origin, where bob's page could use it. A login there
  is refused with a sentence naming the hub's own address.

Checked at start (``GPU Workbench: ...`` and exit 2): the value is an origin
(``http(s)://host[:port]``, no path, query or user), its host is a name (a
subdomain of an IP address does not exist), its scheme is the one browsers
use for the hub (``https`` once the hub serves HTTPS or sits behind a TLS
proxy, ``http`` on loopback without TLS), its host is ``WORKBENCH_DOMAIN`` when
that is set, and the certificate in ``WORKBENCH_SSL_CERT`` names both the host
and ``*.<host>``. Off by default: README, "User content on its own origin",
says why.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from urllib.parse import urlsplit

from traitlets.config import Config

from . import tls
from .env_values import ConfigError, Env, opt_in, text
from .transport import Transport

VARIABLE = "WORKBENCH_SUBDOMAIN_HOST"
# The names this machine's own clients reach the proxy by: the CLI and scripts on the host (loopback), Prometheus
# in docker compose and the z2jh chart's hub Service (``hub``). IPv6 loopback is left out: the proxy takes the
# host name up to the first ':'.
INTERNAL_NAMES = ("127.0.0.1", "localhost", "hub")
_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
EXAMPLE = "e.g. https://hub.example.edu, or http://localhost:8000 to try it on this machine"


def subdomain_origin(value: str, public_scheme: str | None = None, domain: str = "") -> str:
    """``value`` as the origin JupyterHub's ``subdomain_host`` takes (``scheme://host[:port]``, lower case).

    ``public_scheme`` is how browsers reach the hub (None: not known here, not
    checked); ``domain`` is ``WORKBENCH_DOMAIN`` (the hub's public host name),
    which the value must name when set. Raises :class:`ConfigError` with one
    sentence."""
    shown = value[:100]
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError:
        raise ConfigError(
            f"{VARIABLE}={shown!r} is not a URL (a port is a number up to 65535): write the hub's origin, {EXAMPLE}"
        ) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{VARIABLE}={shown!r} is not an http:// or https:// URL: write the hub's origin, {EXAMPLE}")
    host = parts.hostname.lower().rstrip(".")
    origin = f"{parts.scheme}://{host}" + (f":{port}" if port else "")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ConfigError(
            f"{VARIABLE}={shown!r} has a path, a query or a fragment: write the origin alone ({origin}); "
            "users' servers keep their /user/NAME/ paths below it"
        )
    if parts.username is not None or parts.password is not None:
        raise ConfigError(f"{VARIABLE} must not carry a user or password: write {origin}")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        raise ConfigError(
            f"{VARIABLE}={shown!r} names an IP address, which has no subdomains for users' servers (NAME.{host}): "
            f"write a host name with a wildcard DNS record, or http://localhost{f':{port}' if port else ''} "
            "to try it on this machine"
        )
    if not all(_LABEL.match(label) for label in host.split(".")):
        raise ConfigError(f"{VARIABLE}={shown!r}: {host!r} is not a DNS host name ({EXAMPLE})")
    if public_scheme and parts.scheme != public_scheme:
        how = (
            "the hub serves HTTPS (WORKBENCH_SSL_CERT) or sits behind a TLS proxy (WORKBENCH_DOMAIN, "
            "WORKBENCH_ALLOW_HTTP)"
            if public_scheme == "https"
            else "the hub serves plain HTTP (no WORKBENCH_SSL_CERT, WORKBENCH_DOMAIN or WORKBENCH_ALLOW_HTTP)"
        )
        raise ConfigError(
            f"{VARIABLE}={shown!r} says {parts.scheme}:// but {how}, so browsers would reach users' servers on the "
            f"wrong scheme: write {public_scheme}://{origin.partition('://')[2]}"
        )
    if domain and host != domain.lower():
        raise ConfigError(
            f"{VARIABLE}={shown!r} names {host}, but WORKBENCH_DOMAIN is {domain}: the hub and its users' "
            f"subdomains share one name; write https://{domain}"
        )
    return origin


def public_scheme(env: Env) -> str:
    """How browsers reach the hub, from the same variables ``transport.update_tls`` reads."""
    behind_tls = bool(text(env, "WORKBENCH_SSL_CERT") or text(env, "WORKBENCH_DOMAIN"))
    return "https" if behind_tls or opt_in(env, "WORKBENCH_ALLOW_HTTP") else "http"


def user_subdomain(name: str, domain: str, kind: str) -> str:
    """``subdomain_hook``: a user's server at JupyterHub's IDNA name below the hub's host, a service on the hub's host.

    A user name that is not a DNS label (``a@b``, too long) gets JupyterHub's
    escaped or hashed label, unique per name. So does one with capitals, which
    JupyterHub's hook keeps as they are: host names are compared without case,
    so ``Bob`` and ``bob`` (names an authenticator that keeps case may give)
    would otherwise share one origin."""
    from jupyterhub.utils import subdomain_hook_idna

    if kind == "service":
        return domain
    if name != name.lower():
        return f"{_hashed_label(name)}.{domain}"
    return subdomain_hook_idna(name, domain, kind)


def _hashed_label(name: str) -> str:
    """JupyterHub's label for a name it cannot use as it is: ``u-<up to 8 safe characters>--<7 hex of sha256>``."""
    stub = "".join(ch for ch in name.lower() if ch in "abcdefghijklmnopqrstuvwxyz0123456789")[:8] or "x"
    return f"u-{stub}--{hashlib.sha256(name.encode('utf8')).hexdigest()[:7]}"


def service_aliases(c: Config, hub_host: str) -> dict[str, str]:
    """Routes for the services with a URL on the names of :data:`INTERNAL_NAMES` (not the hub's own host,
    which JupyterHub routes itself)."""
    services = c.JupyterHub.services if "services" in c.JupyterHub else []
    routes = {}
    for service in services:
        if service.get("url"):
            for name in INTERNAL_NAMES:
                if name != hub_host:
                    routes[f"{name}/services/{service['name']}/"] = service["url"]
    return routes


def refuse_login_off_hub_host(authenticator, handler, auth_model):
    """``post_auth_hook``: no login on a user's (or any other) subdomain of the hub's host.

    The login cookie would belong to that origin, where its user's own pages
    run. The hub's own host, and names outside its domain (``127.0.0.1`` through
    ``ssh -L``), are left as they are. The refusal is a 403 page of its own with
    the sentence and a link to the hub's login (``web.Finish``): an ``HTTPError``
    raised on NativeAuthenticator's login handler reaches the browser with an
    empty body (JupyterHub's error page is rendered with the synchronous
    template environment, the handler's templates come from the asynchronous one)."""
    from tornado import web
    from tornado.escape import xhtml_escape

    subdomain_host = handler.settings.get("subdomain_host") or ""
    hub_host = (urlsplit(subdomain_host).hostname or "").lower()
    asked = (handler.request.host or "").lower()
    asked_host = urlsplit(f"//{asked}").hostname or ""
    if not (hub_host and asked_host.endswith("." + hub_host)):
        return auth_model
    login = subdomain_host + handler.settings.get("login_url", "/hub/login")
    sentence = f"Cannot log in at {asked}: that address serves a user's own pages. Log in at {login}"
    handler.log.warning("%s (%s)", sentence, auth_model.get("name"))
    handler.set_status(403)
    handler.set_header("Content-Type", "text/html; charset=utf-8")
    raise web.Finish(
        '<!doctype html>\n<html><head><meta charset="utf-8"><title>Cannot log in here</title></head><body>'
        f'<p>{xhtml_escape(sentence)}</p><p><a href="{xhtml_escape(login)}">{xhtml_escape(login)}</a></p>'
        "</body></html>\n"
    )


def update_subdomains(c: Config, env: Env, scheme: str | None = "") -> None:
    """``WORKBENCH_SUBDOMAIN_HOST``: users' servers on their own subdomains (the module's docstring says what it sets).

    Call after ``update_services`` (the services' URLs give their alias routes).
    ``scheme`` is how browsers reach the hub: empty (a host) reads it from the
    environment, None (the z2jh chart, whose proxy pod owns TLS) checks none.
    Unset, with no ``c.JupyterHub.subdomain_host`` (the chart's
    ``hub.config``), changes nothing."""
    configured = c.JupyterHub.subdomain_host if "subdomain_host" in c.JupyterHub else ""
    value = text(env, VARIABLE) or configured
    if not value:
        return
    domain = text(env, "WORKBENCH_DOMAIN")
    origin = subdomain_origin(value, public_scheme(env) if scheme == "" else scheme, domain)
    host = urlsplit(origin).hostname or ""
    cert = text(env, "WORKBENCH_SSL_CERT")
    if cert:
        require_wildcard(cert, text(env, "WORKBENCH_SSL_KEY"), host)
    c.JupyterHub.subdomain_host = origin
    c.JupyterHub.subdomain_hook = user_subdomain
    routes = dict(c.Proxy.extra_routes) if "extra_routes" in c.Proxy else {}
    c.Proxy.extra_routes = {**routes, **service_aliases(c, host)}
    c.Authenticator.post_auth_hook = refuse_login_off_hub_host


def require_wildcard(cert: str, key: str, host: str) -> None:
    """The served certificate names the hub's host and ``*.<host>``, or users' servers would fail TLS."""
    try:
        info = tls.check_certificate(cert, key)
    except tls.TLSError as exc:
        raise ConfigError(str(exc)) from None
    if not tls.covers(info.names, host):
        lacks, refused = host, "the hub itself"
    elif not tls.covers(info.names, f"user.{host}"):
        lacks, refused = f"*.{host}", f"every user's server (NAME.{host})"
    else:
        return
    raise ConfigError(
        f"the certificate in WORKBENCH_SSL_CERT={cert} names {', '.join(info.names) or info.subject} but not "
        f"{lacks}, so browsers would refuse {refused}: serve one certificate for {host} and *.{host} "
        "(README: User content on its own origin)"
    )


def banner_lines(c: Config, transport: Transport | None) -> list[str]:
    """What the start-up banner says about users' origins: where they are when on; when off and other machines
    reach the hub (HTTPS, ours or in front), that a student's page shares the hub's origin."""
    subdomain_host = c.JupyterHub.subdomain_host if "subdomain_host" in c.JupyterHub else ""
    if subdomain_host:
        scheme, _, host = subdomain_host.partition("://")
        return [f"Users' servers: each on its own origin, {scheme}://NAME.{host}/user/NAME/"]
    if transport and transport.mode in ("https", "behind-proxy"):
        return [
            "Users' servers share the hub's origin: a page a student serves can act as whoever opens it;",
            "  WORKBENCH_SUBDOMAIN_HOST gives each its own (wildcard DNS and certificate; README: User content",
            "  on its own origin)",
        ]
    return []
