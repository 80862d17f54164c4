"""``workbench check-login``: try the university's login settings before switching the hub to them.

    export WORKBENCH_AUTHENTICATOR=ldap WORKBENCH_LDAP_URL=ldaps://ldap.example.edu ...
    workbench check-login                    # the directory answers, TLS, the service account, the bases
    workbench check-login alice              # and alice's DN and groups (found by the service account)
    echo "$PW" | workbench check-login alice --password-stdin   # bind as alice (no service account)
    WORKBENCH_AUTHENTICATOR=oidc ... workbench check-login     # discovery, issuer, client secret

It reads the same ``WORKBENCH_*`` variables as the hub (``login_settings.py``)
and asks the same questions the hub asks at start (``login_probe.py``), so a
setting that passes here passes there. It needs no hub and no token. The
groups printed are those the hub gives the user at their next login.

Exit codes: 0 every check passed, 1 the directory or provider refused a
setting (the sentence says which), 2 the settings themselves are wrong.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from traitlets.config import Config

from . import configurer, login_probe
from .env_values import ConfigError


def add_check_login_parser(top: Any) -> None:
    """``workbench check-login [USER] [--password-stdin]`` on the CLI's subcommands."""
    p = top.add_parser(
        "check-login",
        help="check the LDAP or OpenID Connect settings in the environment, and list a user's groups",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("user", nargs="?", default="", help="also find this user and their groups (LDAP)")
    p.add_argument(
        "--password-stdin",
        action="store_true",
        help="read the user's password from standard input and bind as them (LDAP without a service account)",
    )


def run_check_login(args: argparse.Namespace, error: Callable[[str, int], Exception]) -> tuple[object, str]:
    """Run the probe ``args`` ask for; returns the checks that passed, in a JSON-able dict and in lines."""
    env = dict(os.environ)
    kind = (env.get("WORKBENCH_AUTHENTICATOR") or "native").strip().lower()
    if kind not in ("ldap", "oidc"):
        raise error(
            f"check-login: WORKBENCH_AUTHENTICATOR is {kind!r}; set it to 'ldap' or 'oidc' with their settings",
            2,
        )
    c = Config()
    c.JupyterHub.bind_url = f"http://{env.get('WORKBENCH_IP') or '127.0.0.1'}:{env.get('WORKBENCH_PORT') or '8000'}"
    try:
        configurer.update_auth(c, env)
    except ConfigError as exc:
        raise error(f"check-login: {exc}", 2) from None
    auth = login_probe.authenticator_for(c)
    assert auth is not None  # update_auth chose the ldap or oidc class above
    password = sys.stdin.readline().rstrip("\n") if args.password_stdin else ""
    try:
        if kind == "ldap":
            probe = login_probe.probe_ldap(auth, args.user, password)
        else:
            probe = login_probe.probe_oidc(auth, login_probe.hub_login_url(auth))
            if args.user:
                probe.checked.append(
                    f"the provider tells {args.user}'s groups only at their login (claim "
                    f"{auth.groups_claim!r}); log in as them to see them on the hub"
                )
    except login_probe.LoginProbeError as exc:
        raise error(f"check-login: {exc}", 1) from None
    lines = [f"ok: {line}" for line in probe.checked] + [f"{key}: {url}" for key, url in probe.endpoints.items()]
    return {"checked": probe.checked, "endpoints": probe.endpoints}, "\n".join(lines)
