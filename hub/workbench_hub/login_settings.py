"""The university's login from the environment: ``WORKBENCH_AUTHENTICATOR=ldap`` or ``oidc``.

Plain functions from the ``WORKBENCH_LDAP_*`` and ``WORKBENCH_OIDC_*``
variables to a traitlets ``Config`` (``configurer.update_auth`` calls them),
tested with tables. Nothing here talks to the network: whether the
directory or the provider answers, and with these settings, is
``login_probe.py``'s, at start and in ``workbench check-login``.

Groups: with ``WORKBENCH_LDAP_GROUP_BASE`` (LDAP) or always (OIDC, from the
``groups`` claim), ``Authenticator.manage_groups`` is on: the hub's groups of
a user are made the directory's at each of their logins. So GPU quotas per
group follow the directory; a change reaches a person at their next login
(a running server keeps what it was given), and hand edits of a member in
JupyterHub's admin panel last until that member's next login
(``docs/login.md``).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from traitlets.config import Config

from .env_values import ConfigError, Env, comma_list, flag, text

LDAP_CLASS = "workbench_hub.ldap_login.WorkbenchLDAPAuthenticator"
OIDC_CLASS = "workbench_hub.oidc_login.WorkbenchOIDCAuthenticator"
LOOPBACK = {"127.0.0.1", "::1", "localhost"}
DEFAULT_GROUP_FILTER = "(|(member={userdn})(uniqueMember={userdn})(memberUid={uid}))"
# Where the groups come from, in the words the admin pages use (JupyterHub's and the workbench's).
GROUPS_FROM = {
    LDAP_CLASS: "the university directory (LDAP)",
    OIDC_CLASS: "the university's single sign-on (OpenID Connect)",
}
TEMPLATES = Path(__file__).with_name("directory_templates")


def groups_source(c: Config) -> str:
    """Where the hub's groups come from when the login manages them ("" when admins manage them by hand)."""
    if not (c.Authenticator.get("manage_groups") if "Authenticator" in c else False):
        return ""
    return GROUPS_FROM.get(c.JupyterHub.get("authenticator_class", ""), "the login service")


def _tell_the_admin_page(c: Config) -> None:
    """JupyterHub's admin page says that groups come from the directory (after any template paths set so
    far, so a site's own admin.html still wins)."""
    paths = list(c.JupyterHub.template_paths) if "template_paths" in c.JupyterHub else []
    c.JupyterHub.template_paths = [*paths, str(TEMPLATES)]
    variables = dict(c.JupyterHub.template_vars) if "template_vars" in c.JupyterHub else {}
    c.JupyterHub.template_vars = {**variables, "workbench_groups_from": groups_source(c)}


def _groups(c: Config, env: Env, section: str, login_trait: str) -> None:
    """``WORKBENCH_LOGIN_GROUPS`` and ``WORKBENCH_ADMIN_GROUPS`` on the authenticator's section;
    ``login_trait`` is its trait for the first (oauthenticator's ``allowed_groups``; the LDAP class has
    ``login_groups``, as ldapauthenticator's ``allowed_groups`` are DNs)."""
    login_groups = set(comma_list(env, "WORKBENCH_LOGIN_GROUPS"))
    admin_groups = set(comma_list(env, "WORKBENCH_ADMIN_GROUPS"))
    if login_groups:
        c[section][login_trait] = login_groups
    if admin_groups:
        c[section].admin_groups = admin_groups
    # oauthenticator lets in allowed_groups' members and admins itself; the LDAP class refuses outsiders in its
    # authenticate (with a sentence), so JupyterHub's own allow check passes whoever it returns.
    c.Authenticator.allow_all = login_trait == "login_groups" or not login_groups


def update_ldap(c: Config, env: Env) -> None:
    """``WorkbenchLDAPAuthenticator`` from ``WORKBENCH_LDAP_*`` (the README's table and docs/login.md)."""
    url = text(env, "WORKBENCH_LDAP_URL")
    if not url:
        raise ConfigError(
            "WORKBENCH_AUTHENTICATOR=ldap needs WORKBENCH_LDAP_URL, the directory's address, e.g. "
            "ldaps://ldap.example.edu or ldap://ldap.example.edu (StartTLS)"
        )
    parsed = urlparse(url if "://" in url else f"ldap://{url}")
    try:
        port_number = parsed.port
    except ValueError:
        port_number = -1
    if parsed.scheme not in ("ldap", "ldaps") or not parsed.hostname or port_number == -1:
        raise ConfigError(
            f"WORKBENCH_LDAP_URL={url[:80]!r} is not a directory address; write ldaps://HOST[:PORT] (TLS) "
            "or ldap://HOST[:PORT] (StartTLS)"
        )
    a = c.WorkbenchLDAPAuthenticator
    a.server_address = parsed.hostname
    if port_number:
        a.server_port = port_number
    if parsed.scheme == "ldaps":
        a.tls_strategy = "on_connect"
    elif flag(env, "WORKBENCH_LDAP_STARTTLS", "1"):
        a.tls_strategy = "before_bind"
    elif parsed.hostname in LOOPBACK:
        a.tls_strategy = "insecure"
    else:
        raise ConfigError(
            "WORKBENCH_LDAP_STARTTLS=0 would send every password to the directory unencrypted; that is "
            f"allowed only for a directory on this machine, not {parsed.hostname}. Use ldaps:// or StartTLS"
        )
    ca_file = text(env, "WORKBENCH_LDAP_CA_FILE")
    if ca_file:
        a.ca_file = ca_file

    templates = [part.strip() for part in text(env, "WORKBENCH_LDAP_BIND_TEMPLATE").split(";") if part.strip()]
    bind_dn = text(env, "WORKBENCH_LDAP_BIND_DN")
    user_base = text(env, "WORKBENCH_LDAP_USER_BASE")
    for template in templates:
        if "{username}" not in template:
            raise ConfigError(
                f"WORKBENCH_LDAP_BIND_TEMPLATE {template[:80]!r} has no {{username}}; write the DN a user "
                "binds as, e.g. uid={username},ou=people,dc=example,dc=edu"
            )
    if templates and (bind_dn or user_base):
        raise ConfigError(
            "Set either WORKBENCH_LDAP_BIND_TEMPLATE (users bind by a DN made from their name) or "
            "WORKBENCH_LDAP_USER_BASE with WORKBENCH_LDAP_BIND_DN (a service account finds their DN), not both"
        )
    if templates:
        a.bind_dn_template = templates
    elif user_base and bind_dn:
        a.lookup_dn = True
        a.bind_dn_template = []
        a.user_search_base = user_base
        a.user_attribute = text(env, "WORKBENCH_LDAP_USER_ATTRIBUTE", "uid")
        a.lookup_dn_user_dn_attribute = a.user_attribute
        a.lookup_dn_search_user = bind_dn
        # Read raw: a password's spaces are its own.
        a.lookup_dn_search_password = env.get("WORKBENCH_LDAP_BIND_PASSWORD", "")
        if not a.lookup_dn_search_password:
            raise ConfigError("WORKBENCH_LDAP_BIND_DN is set but WORKBENCH_LDAP_BIND_PASSWORD is empty")
    else:
        raise ConfigError(
            "WORKBENCH_AUTHENTICATOR=ldap needs how to find a user's DN: WORKBENCH_LDAP_BIND_TEMPLATE "
            "(e.g. uid={username},ou=people,dc=example,dc=edu), or WORKBENCH_LDAP_USER_BASE with a service "
            "account in WORKBENCH_LDAP_BIND_DN and WORKBENCH_LDAP_BIND_PASSWORD"
        )

    group_base = text(env, "WORKBENCH_LDAP_GROUP_BASE")
    if group_base:
        a.group_search_base = group_base
        a.group_search_filter = text(env, "WORKBENCH_LDAP_GROUP_FILTER", DEFAULT_GROUP_FILTER)
        a.group_name_attribute = text(env, "WORKBENCH_LDAP_GROUP_ATTRIBUTE", "cn")
        c.Authenticator.manage_groups = True
    elif comma_list(env, "WORKBENCH_LOGIN_GROUPS") or comma_list(env, "WORKBENCH_ADMIN_GROUPS"):
        raise ConfigError(
            "WORKBENCH_LOGIN_GROUPS and WORKBENCH_ADMIN_GROUPS need the directory's groups: set "
            "WORKBENCH_LDAP_GROUP_BASE (e.g. ou=groups,dc=example,dc=edu)"
        )
    _groups(c, env, "WorkbenchLDAPAuthenticator", "login_groups")
    c.JupyterHub.authenticator_class = LDAP_CLASS
    if group_base:
        _tell_the_admin_page(c)


def update_oidc(c: Config, env: Env, public_url: str) -> None:
    """``WorkbenchOIDCAuthenticator`` from ``WORKBENCH_OIDC_*``; ``public_url`` is where browsers reach the
    hub (the callback's default). The endpoints come from the provider at start (``login_probe.py``)."""
    issuer = text(env, "WORKBENCH_OIDC_ISSUER")
    missing = [
        name
        for name in ("WORKBENCH_OIDC_ISSUER", "WORKBENCH_OIDC_CLIENT_ID", "WORKBENCH_OIDC_CLIENT_SECRET")
        if not text(env, name)
    ]
    if missing:
        raise ConfigError(
            f"WORKBENCH_AUTHENTICATOR=oidc needs {', '.join(missing)}: the provider's issuer URL and the "
            "client id and secret it gave this hub"
        )
    parsed = urlparse(issuer)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(f"WORKBENCH_OIDC_ISSUER={issuer[:80]!r} is not a URL; write e.g. https://login.example.edu")
    if parsed.scheme == "http" and parsed.hostname not in LOOPBACK:
        raise ConfigError(
            f"WORKBENCH_OIDC_ISSUER={issuer[:80]!r} is plain HTTP: tokens and codes would cross the network "
            "unencrypted; use the provider's https:// address"
        )
    g = c.WorkbenchOIDCAuthenticator
    g.issuer = issuer
    g.client_id = text(env, "WORKBENCH_OIDC_CLIENT_ID")
    g.client_secret = env.get("WORKBENCH_OIDC_CLIENT_SECRET", "").strip()
    g.oauth_callback_url = text(env, "WORKBENCH_OIDC_CALLBACK_URL") or public_url.rstrip("/") + "/hub/oauth_callback"
    g.scope = text(env, "WORKBENCH_OIDC_SCOPES", "openid profile email").split()
    g.username_claim = text(env, "WORKBENCH_OIDC_USERNAME_CLAIM", "preferred_username")
    g.groups_claim = text(env, "WORKBENCH_OIDC_GROUPS_CLAIM", "groups")
    g.login_service = text(env, "WORKBENCH_OIDC_LOGIN_SERVICE", "your university account")
    ca_file = text(env, "WORKBENCH_OIDC_CA_FILE")
    if ca_file:
        g.http_request_kwargs = {"ca_certs": ca_file}
    c.Authenticator.manage_groups = True
    _groups(c, env, "WorkbenchOIDCAuthenticator", "allowed_groups")
    c.JupyterHub.authenticator_class = OIDC_CLASS
    _tell_the_admin_page(c)
