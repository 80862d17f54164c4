"""The test directory's names: its base DNs, and its accounts with their passwords.

The passwords are written down once, in ``directory/passwords``: ``slapd.sh`` hashes them into the directory,
the fixtures read them here, and the LemonLDAP configuration takes the service account's from here too. This
module uses nothing but the standard library, so ``lemonldap.sh`` can run the configuration generator with any
Python 3.
"""

from __future__ import annotations

import functools
from pathlib import Path

BASE_DN = "dc=workbench,dc=test"
PEOPLE_DN = f"ou=people,{BASE_DN}"
GROUPS_DN = f"ou=groups,{BASE_DN}"
SERVICES_DN = f"ou=services,{BASE_DN}"
ADMIN_DN = f"cn=admin,{BASE_DN}"  # the rootdn
READER_DN = f"cn=hub-reader,{SERVICES_DN}"  # the service account that searches people and groups
DATA = Path(__file__).resolve().parent / "directory"
PASSWORDS_FILE = DATA / "passwords"


@functools.cache
def _passwords() -> tuple[tuple[str, str], ...]:
    rows = []
    for line in PASSWORDS_FILE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, password = line.split()[:2]
            rows.append((name, password))
    return tuple(rows)


def passwords() -> dict[str, str]:
    """Each account's password as the directory starts with it (``admin`` is the rootdn, ``hub-reader`` the
    service account, the others people under ``PEOPLE_DN``)."""
    return dict(_passwords())


def password_of(name: str) -> str:
    """One account's first password; a KeyError names the file where it is missing."""
    try:
        return passwords()[name]
    except KeyError:
        raise KeyError(f"no account {name!r} in {PASSWORDS_FILE}") from None
