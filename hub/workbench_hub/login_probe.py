"""Does the university's login work with these settings? Asked at start and by ``workbench check-login``.

A wrong directory or provider setting used to show only when the first
student tried to log in (a 500, or "Invalid username or password" for
everyone). The hub now asks at start and stops with one ``GPU Workbench:``
sentence (``finish.py``), and ``workbench check-login`` asks the same
questions, plus one user's groups, before an operator switches:

* **LDAP**: the server answers at its address; TLS (LDAPS, or StartTLS on
  ``ldap://``) works with a certificate the hub trusts; the service account,
  where one is set, binds; the user and group search bases exist.
* **OpenID Connect**: the issuer's discovery document answers; the provider
  calls itself exactly that issuer (a copied URL with a missing path or an
  extra slash is the usual mistake); it accepts the client's id and secret
  (a token request with a code that cannot be valid answers
  ``invalid_grant`` to a known client and ``invalid_client`` to a wrong
  secret, RFC 6749 section 5.2). The endpoints it names become the
  authenticator's (``oidc_login.py``), with the logout.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import ldap3
import requests
from ldap3.core.exceptions import LDAPBindError, LDAPException, LDAPSocketOpenError, LDAPStartTLSError
from traitlets.config import Config

from .login_settings import LDAP_CLASS, OIDC_CLASS

# How long one question may take: a hub must not hang at start on a directory that does not answer.
TIMEOUT_SECONDS = 10


class LoginProbeError(Exception):
    """A setting of the university's login that does not work: the sentence says which and why."""


@dataclass
class Probe:
    """What a probe found out: one line per check that passed, the provider's endpoints (OIDC)."""

    checked: list[str] = field(default_factory=list)
    endpoints: dict[str, str] = field(default_factory=dict)


# -- LDAP ----------------------------------------------------------------------------------------------


def tls_strategy(auth: Any) -> str:
    """ldapauthenticator's ``tls_strategy`` by name (an enum): on_connect, before_bind or insecure."""
    return str(getattr(auth.tls_strategy, "name", auth.tls_strategy))


def ldap_address(auth: Any) -> str:
    scheme = "ldaps" if tls_strategy(auth) == "on_connect" else "ldap"
    return f"{scheme}://{auth.server_address}:{auth.server_port}"


def _ldap_failure(auth: Any, exc: LDAPException) -> LoginProbeError:
    address = ldap_address(auth)
    text = str(exc)
    if "certificate" in text.lower() or "CERTIFICATE_VERIFY_FAILED" in text:
        return LoginProbeError(
            f"the directory at {address} has a certificate this hub does not trust ({text[:160]}); set "
            "WORKBENCH_LDAP_CA_FILE to the CA that signed it"
        )
    if isinstance(exc, LDAPStartTLSError):
        return LoginProbeError(f"the directory at {address} refused StartTLS ({text[:160]}); use ldaps:// instead")
    if isinstance(exc, LDAPSocketOpenError):
        reason = "connection refused" if "refused" in text.lower() else text[:160]
        return LoginProbeError(
            f"cannot reach the directory at {address} ({reason}); check WORKBENCH_LDAP_URL and that this "
            "machine may connect to it"
        )
    return LoginProbeError(f"the directory at {address} failed: {text[:200]}")


def _connection(auth: Any, user: str | None = None, password: str | None = None) -> ldap3.Connection:
    """A connection to the directory with the authenticator's TLS rules, bound as ``user`` (or not at all)."""
    on_connect = tls_strategy(auth) == "on_connect"
    server = ldap3.Server(
        auth.server_address,
        port=auth.server_port,
        use_ssl=on_connect,
        tls=ldap3.Tls(**auth.tls_kwargs),
        connect_timeout=TIMEOUT_SECONDS,
    )
    conn = ldap3.Connection(server, user=user, password=password, receive_timeout=TIMEOUT_SECONDS)
    conn.open()
    if tls_strategy(auth) == "before_bind":
        conn.start_tls()
    if user is not None and not conn.bind():
        raise LDAPBindError(conn.result.get("description", "bind refused"))
    return conn


def _base_exists(conn: ldap3.Connection, base: str) -> bool:
    return bool(conn.search(base, "(objectClass=*)", search_scope=ldap3.BASE, attributes=[]))


def probe_ldap(auth: Any, user: str = "", password: str = "") -> Probe:
    """Ask the directory what the hub will ask it; with ``user``, also that user's DN and groups (found by
    the service account, or by binding as the user with ``password``)."""
    probe = Probe()
    address = ldap_address(auth)
    try:
        _connection(auth).unbind()
    except LDAPException as exc:
        raise _ldap_failure(auth, exc) from None
    tls = {"on_connect": "LDAPS", "before_bind": "StartTLS", "insecure": "no TLS (this machine only)"}
    probe.checked.append(f"the directory answers at {address} ({tls[tls_strategy(auth)]})")
    conn = None
    if auth.lookup_dn:
        try:
            conn = _connection(auth, auth.lookup_dn_search_user, auth.lookup_dn_search_password)
        except LDAPBindError:
            raise LoginProbeError(
                f"the directory at {address} refused the service account {auth.lookup_dn_search_user} "
                "(invalid credentials); check WORKBENCH_LDAP_BIND_DN and WORKBENCH_LDAP_BIND_PASSWORD"
            ) from None
        except LDAPException as exc:
            raise _ldap_failure(auth, exc) from None
        probe.checked.append(f"the service account {auth.lookup_dn_search_user} binds")
        if not _base_exists(conn, auth.user_search_base):
            raise LoginProbeError(
                f"WORKBENCH_LDAP_USER_BASE={auth.user_search_base} does not exist in the directory at {address}"
            )
        probe.checked.append(f"the user base {auth.user_search_base} exists")
        if auth.group_search_base and not _base_exists(conn, auth.group_search_base):
            raise LoginProbeError(
                f"WORKBENCH_LDAP_GROUP_BASE={auth.group_search_base} does not exist in the directory at {address}"
            )
    if user:
        probe.checked += _user_lines(auth, conn, user, password)
    return probe


def _user_lines(auth: Any, service: ldap3.Connection | None, user: str, password: str) -> list[str]:
    """One user's DN and groups, as a login would find them."""
    name = auth.normalize_username(user)
    if password:
        conn = None
        for template in auth.bind_dn_template or []:
            dn = template.format(username=ldap3.utils.dn.escape_rdn(name))
            try:
                conn = _connection(auth, dn, password)
                break
            except LDAPBindError:
                continue
        if conn is None and service is not None:
            dn = _find_dn(auth, service, name)
            try:
                conn = _connection(auth, dn, password)
            except LDAPBindError:
                conn = None
        if conn is None:
            raise LoginProbeError(f"the directory refused {name} with that password")
    elif service is not None:
        conn, dn = service, _find_dn(auth, service, name)
    else:
        raise LoginProbeError(
            f"to list {name}'s groups without a service account, give their password (--password-stdin)"
        )
    groups = auth.directory_groups(conn, dn) if auth.group_search_base else None
    lines = [f"{name} is {dn}"]
    if groups is None:
        lines.append("no WORKBENCH_LDAP_GROUP_BASE: the directory gives no groups")
    else:
        lines.append(f"{name}'s groups (they become the hub groups at each login): {', '.join(groups) or 'none'}")
        if auth.refuses(name, groups):
            raise LoginProbeError(
                f"{name} is in none of WORKBENCH_LOGIN_GROUPS ({', '.join(sorted(auth.login_groups))}) and not an "
                f"admin: the hub would refuse {name}'s login (groups found: {', '.join(groups) or 'none'})"
            )
    return lines


def _find_dn(auth: Any, conn: ldap3.Connection, name: str) -> str:
    found = conn.search(
        auth.user_search_base,
        f"({auth.user_attribute}={ldap3.utils.conv.escape_filter_chars(name)})",
        search_scope=ldap3.SUBTREE,
        attributes=[],
    )
    if not found or len(conn.entries) != 1:
        raise LoginProbeError(
            f"no user {name} under {auth.user_search_base} ({auth.user_attribute}={name} found "
            f"{len(conn.entries)} entries)"
        )
    return str(conn.entries[0].entry_dn)


# -- OpenID Connect --------------------------------------------------------------------------------------


def _verify(auth: Any) -> str | bool:
    return auth.http_request_kwargs.get("ca_certs") or True


def probe_oidc(auth: Any, hub_login_url: str) -> Probe:
    """Read the provider's discovery document, check its issuer and the client's secret; the endpoints the
    hub needs (the logout sends the browser back to ``hub_login_url``)."""
    probe = Probe()
    issuer = auth.issuer
    url = issuer.rstrip("/") + "/.well-known/openid-configuration"
    try:
        answer = requests.get(url, timeout=TIMEOUT_SECONDS, verify=_verify(auth))
    except requests.exceptions.SSLError as exc:
        raise LoginProbeError(
            f"the login provider at {issuer} has a certificate this hub does not trust ({str(exc)[:160]}); set "
            "WORKBENCH_OIDC_CA_FILE to the CA that signed it"
        ) from None
    except requests.RequestException as exc:
        raise LoginProbeError(
            f"cannot reach the login provider at {url} ({type(exc).__name__}); check WORKBENCH_OIDC_ISSUER and "
            "that this machine may connect to it"
        ) from None
    try:
        document = answer.json() if answer.status_code == 200 else None
    except ValueError:
        document = None
    if not isinstance(document, dict):
        raise LoginProbeError(
            f"{url} is not an OpenID Connect discovery document (HTTP {answer.status_code}); check "
            "WORKBENCH_OIDC_ISSUER"
        )
    if document.get("issuer") != issuer:
        raise LoginProbeError(
            f"WORKBENCH_OIDC_ISSUER is {issuer} but the provider calls itself {document.get('issuer')}: set it "
            "to exactly that (the tokens it issues name that issuer)"
        )
    probe.checked.append(f"the provider's discovery document answers at {url}, issuer {issuer}")
    missing = [key for key in ("authorization_endpoint", "token_endpoint", "userinfo_endpoint") if key not in document]
    if missing:
        raise LoginProbeError(f"the provider's discovery document lacks {', '.join(missing)}")
    probe.endpoints = {
        "authorize_url": document["authorization_endpoint"],
        "token_url": document["token_endpoint"],
        "userdata_url": document["userinfo_endpoint"],
    }
    end_session = document.get("end_session_endpoint")
    if end_session:
        # RP-initiated logout: the provider ends its session too, then sends the browser to the hub's login.
        query = urlencode({"client_id": auth.client_id, "post_logout_redirect_uri": hub_login_url})
        probe.endpoints["logout_redirect_url"] = f"{end_session}{'&' if '?' in end_session else '?'}{query}"
    _check_client(auth, document, probe)
    return probe


def _check_client(auth: Any, document: dict, probe: Probe) -> None:
    """A token request with a code that cannot be valid: a known client hears ``invalid_grant``. A provider
    that takes the secret only one way (``token_endpoint_auth_methods_supported``) refuses the other here."""
    body = {
        "grant_type": "authorization_code",
        "code": secrets.token_urlsafe(24),
        "redirect_uri": auth.oauth_callback_url,
    }
    # The secret travels as the logins will send it (GenericOAuthenticator's basic_auth: Basic, else the body).
    auth_kwargs: dict[str, Any] = {}
    if auth.basic_auth:
        auth_kwargs["auth"] = (auth.client_id, auth.client_secret)
    else:
        body.update(client_id=auth.client_id, client_secret=auth.client_secret)
    try:
        answer = requests.post(
            document["token_endpoint"], data=body, timeout=TIMEOUT_SECONDS, verify=_verify(auth), **auth_kwargs
        )
    except requests.RequestException as exc:
        raise LoginProbeError(f"the provider's token endpoint did not answer ({type(exc).__name__})") from None
    try:
        error = answer.json().get("error", "")
    except (ValueError, AttributeError):
        error = ""
    if answer.status_code == 401 or error in ("invalid_client", "unauthorized_client"):
        raise LoginProbeError(
            f"the login provider refused the client {auth.client_id} ({error or f'HTTP {answer.status_code}'}): "
            "check WORKBENCH_OIDC_CLIENT_ID and WORKBENCH_OIDC_CLIENT_SECRET"
        )
    probe.checked.append(f"the provider knows the client {auth.client_id} and its secret")


# -- at start ----------------------------------------------------------------------------------------------


def authenticator_for(final: Config) -> Any | None:
    """The university-login authenticator the final config makes (its traits as the hub will have them),
    or None for another authenticator."""
    chosen = final.JupyterHub.get("authenticator_class") if "JupyterHub" in final else None
    if chosen == LDAP_CLASS:
        from .ldap_login import WorkbenchLDAPAuthenticator

        return WorkbenchLDAPAuthenticator(config=final)
    if chosen == OIDC_CLASS:
        from .oidc_login import WorkbenchOIDCAuthenticator

        return WorkbenchOIDCAuthenticator(config=final)
    return None


def hub_login_url(auth: Any) -> str:
    """The hub's login page, where the provider's logout sends the browser: beside the OAuth callback."""
    return auth.oauth_callback_url.rsplit("/oauth_callback", 1)[0] + "/login"


def check_login_at_start(c: Config, final: Config) -> Probe | None:
    """Probe the directory or the provider the hub will use; OIDC's endpoints go into ``c`` (unless the
    local config set them). Raises :class:`LoginProbeError`; None for other authenticators."""
    auth = authenticator_for(final)
    if auth is None:
        return None
    if auth.__class__.__name__ == "WorkbenchLDAPAuthenticator":
        return probe_ldap(auth)
    probe = probe_oidc(auth, hub_login_url(auth))
    section = final.get("WorkbenchOIDCAuthenticator", {})
    for trait, value in probe.endpoints.items():
        if trait not in section:
            c.WorkbenchOIDCAuthenticator[trait] = value
    return probe
