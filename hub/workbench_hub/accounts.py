"""Who can use this hub, as counted at start: the local backend's banner warns when that is more than one.

The local backend runs every user's server as the hub's own Unix account on
the hub's host and network: any user can reach the others' servers, files
and GPUs. That is right for one person's workstation and wrong as soon as a
second person can log in, so the banner says so (``banner.py``).

"Can use" is counted the way a careful operator would, from everything that
lets an account in without a further step by an admin:

* the admins named in the config (``WORKBENCH_ADMIN_USERS``): each may sign
  up and is authorized at once, even before they have;
* ``allowed_users`` from the config (the local config file);
* the users in JupyterHub's database: created through the REST API or the
  admin page, or by an authorized sign-up, they have servers and tokens
  whether or not they have logged in yet;
* NativeAuthenticator's authorized sign-ups (``users_info``); sign-ups that
  wait for authorization do not count, they cannot log in;
* and, as an open door rather than names: NativeAuthenticator's
  ``open_signup`` or ``allow_self_approval_for``; PAM without
  ``WORKBENCH_PAM_GROUPS`` (every account of the host; with groups, their
  members are counted); any other authenticator with ``allow_all`` or
  ``allowed_groups`` (who is in them cannot be read from here).

The count is of the hub's state when it starts: a second user authorized
later shows at the next start. A database that cannot be read counts as
empty (the hub itself reports why when it opens it).
"""

from __future__ import annotations

import grp
import pwd
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from traitlets.config import Config

# Where an authenticator's settings may be: the generic section and its classes' own.
SECTIONS = ("Authenticator", "LocalAuthenticator", "PAMAuthenticator", "NativeAuthenticator", "WorkbenchAuthenticator")


@dataclass(frozen=True)
class Reach:
    """The accounts that can use the hub, by name, and what lets unnamed ones in ("" if nothing)."""

    names: frozenset[str] = frozenset()
    open_to: str = ""

    @property
    def shared(self) -> bool:
        """More than one person can use the hub."""
        return bool(self.open_to) or len(self.names) > 1


def _setting(final: Config, name: str) -> list:
    """The values ``name`` has in every authenticator section that sets it."""
    return [final[section][name] for section in SECTIONS if section in final and name in final[section]]


def _names(final: Config, name: str) -> set[str]:
    return {str(item) for value in _setting(final, name) for item in (value or ())}


def authenticator_kind(final: Config) -> str:
    """``native``, ``pam`` or ``other``, from ``JupyterHub.authenticator_class`` (JupyterHub's default is PAM)."""
    value = final.JupyterHub.authenticator_class if "authenticator_class" in final.JupyterHub else "pam"
    if isinstance(value, type):
        value = f"{value.__module__}.{value.__qualname__}"
    lowered = str(value).lower()
    if "native" in lowered or lowered.endswith("workbenchauthenticator"):
        return "native"
    if lowered in ("pam", "default") or lowered.endswith("pamauthenticator"):
        return "pam"
    return "other"


def group_members(groups: set[str]) -> set[str]:
    """The accounts in these Unix groups, primary group included (as PAMAuthenticator checks them)."""
    members: set[str] = set()
    gids = set()
    for name in groups:
        try:
            entry = grp.getgrnam(name)
        except KeyError:
            continue
        members.update(entry.gr_mem)
        gids.add(entry.gr_gid)
    members.update(user.pw_name for user in pwd.getpwall() if user.pw_gid in gids)
    return members


def database_users(db_url: str) -> set[str]:
    """JupyterHub's users and NativeAuthenticator's authorized sign-ups, read from the hub's database."""
    try:
        url = make_url(db_url)
    except SQLAlchemyError:
        return set()
    if url.get_backend_name() == "sqlite" and not (url.database and Path(url.database).is_file()):
        return set()  # a first start: no database yet (and connecting would create the file)
    names: set[str] = set()
    engine = create_engine(url)
    try:
        with engine.connect() as db:
            for query in ("SELECT name FROM users", "SELECT username FROM users_info WHERE is_authorized"):
                try:
                    names.update(row[0] for row in db.execute(text(query)))
                except SQLAlchemyError:
                    db.rollback()  # no such table yet (users_info: NativeAuthenticator never ran)
    except SQLAlchemyError:
        return names
    finally:
        engine.dispose()
    return names


def who_can_use(final: Config) -> Reach:
    """Who can use the hub that ``final`` (the final config) describes; see the module's docstring."""
    names = _names(final, "admin_users") | _names(final, "allowed_users")
    db_url = final.JupyterHub.db_url if "db_url" in final.JupyterHub else "sqlite:///jupyterhub.sqlite"
    names |= database_users(db_url)
    kind = authenticator_kind(final)
    open_to = ""
    groups = _names(final, "allowed_groups")
    if kind == "native":
        if any(_setting(final, "open_signup")):
            open_to = "anyone who signs up (NativeAuthenticator.open_signup)"
        elif any(_setting(final, "allow_self_approval_for")):
            open_to = "anyone whose e-mail matches NativeAuthenticator.allow_self_approval_for"
    elif kind == "pam" and any(_setting(final, "allow_all")):
        open_to = "every account of this host (PAM)"
    elif kind == "pam" and groups:
        names |= group_members(groups)
    elif kind == "other" and (any(_setting(final, "allow_all")) or groups):
        open_to = "every account the authenticator accepts"
    return Reach(frozenset(names), open_to)
