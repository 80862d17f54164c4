"""HTTPS for a hub that serves other machines: the certificate or the proxy in front.

Part of the configuration (see ``configurer.py``): :func:`update_tls` turns
WORKBENCH_SSL_CERT/KEY, WORKBENCH_ALLOW_HTTP, WORKBENCH_DOMAIN and
WORKBENCH_HSTS_SECONDS into config; :func:`check_transport`, run on the final
config after the local file, refuses plain HTTP off loopback and checks the
certificate with :mod:`workbench_hub.tls`. README: "Serving other machines".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlparse

from traitlets.config import Config

from workbench_hub import tls
from workbench_hub.env_values import ConfigError, Env, number, opt_in, text

HSTS_DEFAULT = "31536000"  # one year, this host only
# a DNS name (labels of letters, digits, hyphens), no scheme, port or path
_DOMAIN = re.compile(r"^(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$")


def update_tls(c: Config, env: Env) -> None:
    """HTTPS: the operator's certificate served by the proxy, or a TLS-terminating proxy in front.

    Call after :func:`update_hub` (it changes the scheme of ``bind_url`` and
    the proxy's command). Three modes:

    * ``WORKBENCH_SSL_CERT`` and ``WORKBENCH_SSL_KEY``: configurable-http-proxy
      serves HTTPS with them (JupyterHub's ``ssl_cert``/``ssl_key``); it tells
      the hub ``X-Forwarded-Proto: https``, so the hub's cookies are
      ``Secure``. The files are checked by :func:`check_transport`.
    * ``WORKBENCH_ALLOW_HTTP=1`` or ``WORKBENCH_DOMAIN`` (and no certificate): a
      proxy in front terminates TLS and forwards ``X-Forwarded-Proto``. Our
      proxy then adds no X-Forwarded-* headers of its own
      (``--no-x-forward``): it would append ``,http`` and tornado, which reads
      the last entry, would take the connection for plain HTTP and leave the
      hub's cookies without ``Secure``. ``WORKBENCH_DOMAIN`` also sets
      ``public_url`` to ``https://<domain>/`` (absolute URLs and ``Secure``
      cookies even when a proxy forgets the header).
    * neither: plain HTTP, which :func:`check_transport` allows on loopback only.

    HSTS (``WORKBENCH_HSTS_SECONDS``, default one year, 0 = off) goes on every
    hub page in the first two modes; browsers apply it to the whole host
    (user servers included) and ignore it on plain HTTP.
    """
    cert = text(env, "WORKBENCH_SSL_CERT")
    key = text(env, "WORKBENCH_SSL_KEY")
    allow_http = opt_in(env, "WORKBENCH_ALLOW_HTTP")
    domain = text(env, "WORKBENCH_DOMAIN").lower()
    hsts_seconds = number(env, "WORKBENCH_HSTS_SECONDS", HSTS_DEFAULT, int)
    if bool(cert) != bool(key):
        missing = "WORKBENCH_SSL_KEY" if cert else "WORKBENCH_SSL_CERT"
        raise ConfigError(f"{missing} is not set: set both WORKBENCH_SSL_CERT and WORKBENCH_SSL_KEY, or neither")
    if domain and not _DOMAIN.match(domain):
        raise ConfigError(f"WORKBENCH_DOMAIN must be a host name such as gpu.example.org, not {domain!r}")

    behind_proxy = not cert and (allow_http or bool(domain))
    if cert:
        c.JupyterHub.ssl_cert = cert
        c.JupyterHub.ssl_key = key
        c.JupyterHub.bind_url = "https://" + c.JupyterHub.bind_url.partition("://")[2]
    elif behind_proxy:
        command = (
            c.ConfigurableHTTPProxy.command if "command" in c.ConfigurableHTTPProxy else ["configurable-http-proxy"]
        )
        c.ConfigurableHTTPProxy.command = [*command, "--no-x-forward"]
        if domain:
            c.JupyterHub.public_url = f"https://{domain}/"
    if (cert or behind_proxy) and hsts_seconds:
        c.JupyterHub.tornado_settings = {"headers": {"Strict-Transport-Security": tls.hsts(int(hsts_seconds))}}


@dataclass(frozen=True)
class Transport:
    """How the hub reaches browsers, as decided at start (for the banner)."""

    mode: str  # "https" (our proxy serves TLS), "behind-proxy" (TLS in front) or "http" (loopback only)
    certificate: tls.CertificateInfo | None = None


def _listen_host(c: Config) -> str:
    if "ip" in c.JupyterHub:  # the deprecated trait wins over bind_url in JupyterHub
        return c.JupyterHub.ip
    bind_url = c.JupyterHub.bind_url if "bind_url" in c.JupyterHub else "http://:8000"
    return urlparse(bind_url).hostname or ""


def check_transport(c: Config, env: Env) -> Transport:
    """Refuse plain HTTP on an address other machines reach; check the certificate that will be served.

    ``c`` is the final config (environment, local file, command line), so a
    ``bind_url`` or ``ssl_cert`` set in ``jupyterhub_config.local.py`` is
    checked too. The address checked is ``WORKBENCH_PUBLISH_IP`` when set
    (docker compose: the host address the container's port is published on;
    inside the container the hub listens on 0.0.0.0), else where the proxy
    listens.
    """
    published = text(env, "WORKBENCH_PUBLISH_IP")
    allow_http = opt_in(env, "WORKBENCH_ALLOW_HTTP")
    domain = text(env, "WORKBENCH_DOMAIN")
    env_cert, env_key = text(env, "WORKBENCH_SSL_CERT"), text(env, "WORKBENCH_SSL_KEY")
    hub = c.JupyterHub
    cert = hub.ssl_cert if "ssl_cert" in hub else ""
    key = hub.ssl_key if "ssl_key" in hub else ""
    if cert or key:
        if not (cert and key):
            raise ConfigError("c.JupyterHub.ssl_cert and c.JupyterHub.ssl_key must be set together")
        try:
            info = tls.check_certificate(
                cert,
                key,
                cert_variable="WORKBENCH_SSL_CERT" if cert == env_cert else "c.JupyterHub.ssl_cert",
                key_variable="WORKBENCH_SSL_KEY" if key == env_key else "c.JupyterHub.ssl_key",
            )
        except tls.TLSError as exc:
            raise ConfigError(str(exc)) from None
        return Transport("https", info)
    host = published or _listen_host(c)
    if not tls.is_loopback(host) and not allow_http:
        where = f"WORKBENCH_PUBLISH_IP={published}" if published else f"the proxy's address {host or '(every address)'}"
        raise ConfigError(
            f"{where} serves other machines over plain HTTP, so passwords and tokens would cross the network "
            "in clear: set WORKBENCH_SSL_CERT and WORKBENCH_SSL_KEY (PEM files) to serve HTTPS, or set "
            "WORKBENCH_ALLOW_HTTP=1 if a TLS-terminating proxy in front forwards X-Forwarded-Proto "
            "(README: Serving other machines)"
        )
    return Transport("behind-proxy" if (allow_http or domain) else "http")
