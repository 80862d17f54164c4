"""The first admin of a hub that other machines reach: an account made at start, not the first sign-up.

NativeAuthenticator authorizes a sign-up at once when its name is one of the
admins (``WORKBENCH_ADMIN_USERS``, ``admin`` by default). On a workstation
(``make run`` on 127.0.0.1) the person at the keyboard signs up first; on an
address other machines reach, whoever signs up first as ``admin`` owns the
hub. So, with NativeAuthenticator, a hub that others reach does not start
while an admin in ``WORKBENCH_ADMIN_USERS`` has no account, unless
``WORKBENCH_ADMIN_PASSWORD`` is set: then each admin without an account gets
one at start, authorized, with that password. An admin who has an account
keeps it and its password (a later change of the variable changes no
account; passwords change at ``/hub/change-password``), so a running hub
whose admins signed up long ago starts as before.

Others reach the hub (:func:`reached_from`, on the final config) when the
address browsers come to is not loopback: ``WORKBENCH_PUBLISH_IP`` (docker
compose), else where the proxy listens (``WORKBENCH_IP``, ``bind_url``); a
TLS proxy in front (``WORKBENCH_ALLOW_HTTP=1``); or a public URL on another
host (``WORKBENCH_DOMAIN``). The z2jh chart's hub is always reached through
the chart's proxy. The authenticator makes the decision when the hub starts
(``WorkbenchAuthenticator.check_allow_config``), where it can see the
accounts and the password rules in force; a password that fails those rules
(at least 8 characters, not a common one, unless the local config says
otherwise) stops the hub with a sentence, as does the refusal.

The password is read once from the environment by the configurer and kept
in the authenticator's config (``WorkbenchAuthenticator.admin_password``);
it is never logged, never put on a command line, and JupyterHub passes it to
no process it starts (the proxy's allow-list, the services' ``env_keep``).

Other authenticators (PAM: the host's own accounts; LDAP or OAuth from the
local config file) are left alone: their accounts, admins included, exist
outside the hub before anyone logs in.
"""

from __future__ import annotations

from urllib.parse import urlparse

import bcrypt
from nativeauthenticator.orm import UserInfo
from traitlets.config import Config

from . import accounts, tls
from .env_values import Env, opt_in, text

# Where the z2jh chart's hub is reached from: the chart's proxy, in front of every browser.
CHART_PROXY = "the z2jh chart's proxy-public Service"


class FirstAdminError(ValueError):
    """The hub cannot start this way; the message is one sentence for the operator."""


def _listen_host(final: Config) -> str:
    hub = final.JupyterHub
    if "ip" in hub:  # the deprecated trait wins over bind_url in JupyterHub
        return hub.ip
    return urlparse(hub.bind_url if "bind_url" in hub else "http://:8000").hostname or ""


def reached_from(final: Config, env: Env) -> str:
    """Where other machines reach the hub, in words for the refusal; "" when only this machine does."""
    published = text(env, "WORKBENCH_PUBLISH_IP")
    host = published or _listen_host(final)
    if not tls.is_loopback(host):
        return f"WORKBENCH_PUBLISH_IP={published}" if published else f"the proxy's address {host or '(every address)'}"
    if opt_in(env, "WORKBENCH_ALLOW_HTTP"):
        return "a TLS proxy in front (WORKBENCH_ALLOW_HTTP=1)"
    public_url = str(final.JupyterHub.public_url) if "public_url" in final.JupyterHub else ""
    if public_url and not tls.is_loopback(urlparse(public_url).hostname):
        return f"the public URL {public_url}"
    return ""


def guard_first_admin(c: Config, final: Config, env: Env) -> str:
    """With NativeAuthenticator, tell it where others reach the hub (it then needs the admins' accounts).

    Run on the final config (``hub/jupyterhub_config.py``, after the transport
    check); returns where others reach the hub, "" when they do not or when
    another authenticator is in use.
    """
    if accounts.authenticator_kind(final) != "native":
        return ""
    where = reached_from(final, env)
    if where:
        c.WorkbenchAuthenticator.reached_from = where
    return where


def _names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def refusal(missing: list[str], where: str, minimum_length: int) -> str:
    """Why the hub does not start: an admin without an account on a hub others reach."""
    accounts_word = "account" if len(missing) == 1 else "accounts"
    return (
        f"this hub is reached from other machines ({where}) and the admin {accounts_word} "
        f"{_names(missing)} {'does' if len(missing) == 1 else 'do'} not exist yet, so whoever signed up first "
        f"under {'that name' if len(missing) == 1 else 'those names'} would own the hub: set "
        f"WORKBENCH_ADMIN_PASSWORD (at least {minimum_length} characters, not a common password) and each "
        "admin without an account gets one with it at start (README: The first admin)"
    )


def weak_password(minimum_length: int) -> str:
    return (
        f"WORKBENCH_ADMIN_PASSWORD does not pass the hub's password rules: it needs at least {minimum_length} "
        "characters and must not be one of the common passwords NativeAuthenticator refuses"
    )


def set_up_admins(authenticator) -> list[str]:
    """At the hub's start: an account for each admin without one, or :class:`FirstAdminError`.

    ``authenticator`` is the running ``WorkbenchAuthenticator`` (its database,
    its rules, ``admin_password`` and ``reached_from``). Returns the names
    whose accounts were made.
    """
    db = authenticator.db
    password: str = authenticator.admin_password
    names = sorted({authenticator.normalize_username(name) for name in authenticator.admin_users})
    missing = [name for name in names if UserInfo.find(db, name) is None]
    minimum = authenticator.minimum_password_length
    if password and not authenticator.is_password_strong(password):
        raise FirstAdminError(weak_password(minimum))
    if not password:
        if missing and authenticator.reached_from:
            raise FirstAdminError(refusal(missing, authenticator.reached_from, max(minimum, 8)))
        return []
    for name in missing:
        if not authenticator.validate_username(name):
            raise FirstAdminError(
                f"WORKBENCH_ADMIN_USERS names {name!r}, which cannot be an account name here "
                "(no spaces, commas or slashes)"
            )
        try:
            hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt())  # NativeAuthenticator's hash and cost
        except ValueError:  # bcrypt takes at most 72 bytes
            raise FirstAdminError(
                "WORKBENCH_ADMIN_PASSWORD is longer than bcrypt's 72 bytes: pick a shorter one"
            ) from None
        db.add(UserInfo(username=name, password=hashed, is_authorized=True))
    db.commit()
    for name in missing:
        authenticator.log.info("Admin account %s made at start, with the password WORKBENCH_ADMIN_PASSWORD gives", name)
    return missing
