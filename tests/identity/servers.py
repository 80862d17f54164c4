"""The test identity servers as Python objects: the directory (OpenLDAP slapd) and the single sign-on provider
(LemonLDAP::NG's OpenID Connect issuer), each started by its script in this folder.

``Directory`` changes the directory the way a university's admin would, through the running server (ldap-utils,
bound as the rootdn over its ldapi socket): group memberships, locks, passwords, new people. ``SSOProvider``
registers hubs with the provider and changes the client's secret by writing its configuration, and waits until the
running provider answers with it. The pytest fixtures are in ``fixtures.py``; the accounts and their passwords are
in ``directory/passwords``.
"""

from __future__ import annotations

import base64
import functools
import html
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from urllib.parse import quote, urljoin

import requests

from tests.identity import lemonldap_conf
from tests.identity.accounts import ADMIN_DN, BASE_DN, GROUPS_DN, PEOPLE_DN, READER_DN, SERVICES_DN, passwords

HERE = Path(__file__).resolve().parent
SLAPD_SH = HERE / "slapd.sh"
LEMONLDAP_SH = HERE / "lemonldap.sh"
_SBIN_PATH = f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"  # slapd, slapadd: not on an ordinary account's PATH
# What lemonldap.sh needs of Perl: the portal, its LDAP backend, the JWKS's big numbers, plackup's server.
_PERL_MODULES = ("Lemonldap::NG::Portal::Main", "Net::LDAP", "Crypt::OpenSSL::Bignum", "Plack::Runner")
_PORTAL_LANGUAGE = Path("/usr/share/lemonldap-ng/portal/htdocs/static/languages/en.json")
_APT = "apt-get install slapd ldap-utils liblemonldap-ng-portal-perl lemonldap-ng-fastcgi-server libnet-ldap-perl "
_APT += "libcrypt-openssl-bignum-perl"


@functools.cache
def slapd_missing() -> str | None:
    """Why the test directory cannot run here (a sentence naming what is missing), or None."""
    tools = ("slapd", "slapadd", "slappasswd", "ldapadd", "ldapsearch", "ldapmodify", "openssl")
    absent = [tool for tool in tools if shutil.which(tool, path=_SBIN_PATH) is None]
    if absent:
        return f"the test directory needs OpenLDAP's {', '.join(absent)}: {_APT}"
    return None


@functools.cache
def lemonldap_missing() -> str | None:
    """Why the test OpenID Connect provider cannot run here (a sentence naming what is missing), or None."""
    if shutil.which("plackup") is None or shutil.which("perl") is None:
        return f"the test OpenID Connect provider needs LemonLDAP::NG and plackup: {_APT}"
    script = 'for (@ARGV) { (my $f = "$_.pm") =~ s{::}{/}g; print "$_\\n" unless grep { -f "$_/$f" } @INC }'
    absent = subprocess.run(["perl", "-e", script, *_PERL_MODULES], capture_output=True, text=True).stdout.split()
    if absent:
        return f"the test OpenID Connect provider lacks the Perl modules {', '.join(absent)}: {_APT}"
    return None


def _run(command: Sequence[str], stdin: str | None = None, env: dict[str, str] | None = None) -> str:
    """Run a command; its output. A failure raises with the command's own words."""
    done = subprocess.run(
        list(command), input=stdin, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=60
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:2])} failed (exit {done.returncode}): {done.stderr.strip()}")
    return done.stdout


def _escape(value: str) -> str:
    """A value in an LDAP search filter (RFC 4515)."""
    return "".join(f"\\{ord(c):02x}" if c in "*()\\\0" else c for c in value)


def _parse_ldif(text: str) -> list[dict[str, list[str]]]:
    """ldapsearch -LLL -o ldif-wrap=no's entries: attribute -> values (the DN under "dn")."""
    entries: list[dict[str, list[str]]] = []
    for block in text.strip().split("\n\n"):
        entry: dict[str, list[str]] = {}
        for line in block.splitlines():
            if not line or line.startswith("#"):
                continue
            name, _, value = line.partition(":")
            # "name:: base64" where the value is not plain ASCII
            value = base64.b64decode(value[1:].strip()).decode() if value.startswith(":") else value.removeprefix(" ")
            entry.setdefault(name, []).append(value)
        if entry:
            entries.append(entry)
    return entries


def _first_rdn_values(dns: Iterable[str]) -> list[str]:
    return sorted(dn.split(",", 1)[0].split("=", 1)[1] for dn in dns)


class Directory:
    """A private slapd holding the test directory (``slapd.sh``): StartTLS on ``url``, TLS on ``ldaps_url``, both
    checked against ``ca_file``; the accounts of ``directory/passwords``.

    ``stop()`` and ``start()`` keep the ports and the data: the tests of a directory that goes down and comes back.
    """

    base_dn = BASE_DN
    people_dn = PEOPLE_DN
    groups_dn = GROUPS_DN
    services_dn = SERVICES_DN
    admin_dn = ADMIN_DN
    reader_dn = READER_DN

    def __init__(self, run_dir: Path, port: int, ldaps_port: int) -> None:
        self.run_dir = run_dir
        self.port = port
        self.ldaps_port = ldaps_port
        self.url = f"ldap://127.0.0.1:{port}"
        self.ldaps_url = f"ldaps://127.0.0.1:{ldaps_port}"
        self.ca_file = run_dir / "tls" / "ca.crt"
        self._passwords = passwords()
        self._next_uid_number = 21001  # people added by the tests (the directory's own are 20001-20006)

    # The server -------------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start slapd: the first time a new directory, later the same one on the same ports (about 0.1 s)."""
        _run([str(SLAPD_SH), "start", str(self.run_dir), str(self.port), str(self.ldaps_port)])

    def stop(self) -> None:
        """Stop slapd; its ports refuse connections until ``start()``."""
        _run([str(SLAPD_SH), "stop", str(self.run_dir)])

    @property
    def ldapi_url(self) -> str:
        """The ldapi socket's URL (written by slapd.sh at each start), where the fixtures bind as the rootdn."""
        return (self.run_dir / "ldapi.url").read_text().strip()

    def log(self) -> str:
        path = self.run_dir / "slapd.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # Names ------------------------------------------------------------------------------------------------------

    def password(self, name: str) -> str:
        """An account's password now (``directory/passwords``, or what a test set or added)."""
        try:
            return self._passwords[name]
        except KeyError:
            raise KeyError(f"no account {name!r} in the test directory") from None

    @property
    def reader_password(self) -> str:
        """The service account's (``reader_dn``) password."""
        return self.password("hub-reader")

    def user_dn(self, name: str) -> str:
        return f"uid={name},{PEOPLE_DN}"

    def group_dn(self, name: str) -> str:
        return f"cn={name},{GROUPS_DN}"

    # Reading ----------------------------------------------------------------------------------------------------

    def _admin(self) -> list[str]:
        return ["-x", "-H", self.ldapi_url, "-D", ADMIN_DN, "-y", str(self.run_dir / "admin.pw")]

    def search(self, base: str, search_filter: str = "(objectClass=*)", *attributes: str) -> list[dict[str, list[str]]]:
        """Entries under ``base`` (subtree) as the rootdn sees them: attribute -> values, the DN under "dn"."""
        out = _run(["ldapsearch", *self._admin(), "-LLL", "-o", "ldif-wrap=no", "-b", base, search_filter, *attributes])
        return _parse_ldif(out)

    def groups_of(self, user: str) -> list[str]:
        """The names of the groups ``user`` is in, as the directory says: groupOfNames (``member``) and posixGroup
        (``memberUid``), which is the hub's default group filter."""
        dn, uid = _escape(self.user_dn(user)), _escape(user)
        found = self.search(GROUPS_DN, f"(|(member={dn})(uniqueMember={dn})(memberUid={uid}))", "cn")
        return sorted(entry["cn"][0] for entry in found)

    def member_of(self, user: str) -> list[str]:
        """The names in ``user``'s ``memberOf`` (kept by the memberof overlay: groupOfNames only)."""
        found = self.search(self.user_dn(user), "(objectClass=*)", "memberOf")
        return _first_rdn_values(found[0].get("memberOf", [])) if found else []

    def is_locked(self, user: str) -> bool:
        """Whether ``user`` is locked (by an admin, or by ppolicy after 5 wrong passwords)."""
        found = self.search(self.user_dn(user), "(objectClass=*)", "pwdAccountLockedTime")
        return bool(found and found[0].get("pwdAccountLockedTime"))

    # Changing ---------------------------------------------------------------------------------------------------

    def modify(self, ldif: str, relax: bool = False) -> None:
        """Apply LDIF change records (``changetype: add|modify|delete``) through the running server, in one call.
        ``relax``: the relax control, which lets the rootdn change what ppolicy keeps for itself."""
        _run(["ldapmodify", *self._admin(), *(["-e", "relax"] if relax else [])], stdin=ldif)

    def _member_attribute(self, group: str) -> str:
        """What names a member of ``group``: ``member`` (a DN) in a groupOfNames, ``memberUid`` in a posixGroup."""
        found = self.search(self.group_dn(group), "(objectClass=*)", "objectClass")
        if not found:
            raise KeyError(f"no group {group!r} in the test directory")
        return "memberUid" if "posixGroup" in found[0].get("objectClass", []) else "member"

    def _membership_change(self, group: str, change: str, users: Iterable[str]) -> str:
        """The LDIF record that adds ``users`` to ``group`` or deletes them from it (``change``: add or delete)."""
        attribute = self._member_attribute(group)
        values = "".join(f"{attribute}: {u if attribute == 'memberUid' else self.user_dn(u)}\n" for u in users)
        return f"dn: {self.group_dn(group)}\nchangetype: modify\n{change}: {attribute}\n{values}"

    def add_member(self, group: str, user: str) -> None:
        self.modify(self._membership_change(group, "add", [user]))

    def remove_member(self, group: str, user: str) -> None:
        """Take ``user`` out of ``group`` (a groupOfNames keeps at least one member: the last one cannot go)."""
        self.modify(self._membership_change(group, "delete", [user]))

    def lock(self, user: str) -> None:
        """Lock ``user`` as an admin does (ppolicy's permanent lock): every bind is refused like a wrong password."""
        self.modify(
            f"dn: {self.user_dn(user)}\nchangetype: modify\nreplace: pwdAccountLockedTime\n"
            "pwdAccountLockedTime: 000001010000Z\n"
        )

    def unlock(self, user: str) -> None:
        """Lift an admin's or ppolicy's lock, and forget ``user``'s wrong passwords (the count starts again)."""
        dn = self.user_dn(user)
        self.modify(
            f"dn: {dn}\nchangetype: modify\nreplace: pwdAccountLockedTime\n-\nreplace: pwdFailureTime\n", relax=True
        )

    def set_password(self, user: str, password: str) -> None:
        """Give ``user`` a new password (sent in clear over ldapi, hashed by ppolicy into {SSHA})."""
        self.modify(f"dn: {self.user_dn(user)}\nchangetype: modify\nreplace: userPassword\nuserPassword: {password}\n")
        self._passwords[user] = password

    def add_user(self, name: str, groups: Sequence[str] = (), password: str | None = None) -> str:
        """Add one person (``<name>-pass-1`` unless ``password`` is given) in these groups; their DN."""
        self.add_users([name], groups, password)
        return self.user_dn(name)

    def add_users(self, names: Sequence[str], groups: Sequence[str] = (), password: str | None = None) -> None:
        """Add people, each in every one of ``groups``, in one ldapmodify call (200 in 0.2 s): a class that logs in
        at once. Each one's password is ``password``, or ``<name>-pass-1``."""
        secrets = {name: password if password is not None else f"{name}-pass-1" for name in names}
        records = []
        for name, secret in secrets.items():
            number, self._next_uid_number = self._next_uid_number, self._next_uid_number + 1
            records.append(
                f"dn: {self.user_dn(name)}\nchangetype: add\nobjectClass: inetOrgPerson\nobjectClass: posixAccount\n"
                f"uid: {name}\ncn: {name.capitalize()}\nsn: Student\nmail: {name}@workbench.test\n"
                f"uidNumber: {number}\ngidNumber: {number}\nhomeDirectory: /home/{name}\nloginShell: /bin/bash\n"
                f"userPassword: {secret}\n"
            )
        records += [self._membership_change(group, "add", names) for group in (groups if names else ())]
        if records:
            self.modify("\n".join(records))
        self._passwords.update(secrets)


# The single sign-on provider --------------------------------------------------------------------------------------


class SSOProvider:
    """A private LemonLDAP::NG portal (``lemonldap.sh``) that is an OpenID Connect provider for the hub, its people and
    groups the ``directory``'s.

    Hubs are registered with ``allow_hub`` (their callback must match exactly); ``logout_url`` is what the hub sends
    people to so that logging out of the hub ends the provider's session too.
    """

    client_id = lemonldap_conf.CLIENT_ID

    def __init__(
        self,
        run_dir: Path,
        port: int,
        directory: Directory,
        hub_urls: Sequence[str] = (),
        ldap_url: str | None = None,
    ) -> None:
        """``ldap_url``: how the provider reaches the directory, its StartTLS ``url`` unless this says its
        ``ldaps_url``; ``hub_urls``: hubs registered from the start (no wait, unlike ``allow_hub``)."""
        self.run_dir = run_dir
        self.port = port
        self.directory = directory
        self.ldap_url = ldap_url or directory.url
        self.issuer = lemonldap_conf.issuer(port)
        self.url = self.issuer
        self.discovery_url = f"{self.issuer}/.well-known/openid-configuration"
        self.client_secret = lemonldap_conf.CLIENT_SECRET
        self._hub_urls = list(hub_urls)
        self._running = False

    def start(self) -> None:
        """Start the portal (about 0.5 to 1 s); the first time with a new configuration, later the same one."""
        _run(
            [
                str(LEMONLDAP_SH),
                "start",
                str(self.run_dir),
                str(self.port),
                self.ldap_url,
                str(self.directory.ca_file),
                *self._hub_urls,
            ],
            env={"PYTHON": sys.executable},
        )
        self._running = True

    def stop(self) -> None:
        _run([str(LEMONLDAP_SH), "stop", str(self.run_dir)])
        self._running = False

    def log(self) -> str:
        path = self.run_dir / "portal.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def discovery(self) -> dict:
        """The provider's discovery document (``/.well-known/openid-configuration``)."""
        r = requests.get(self.discovery_url, timeout=10)
        r.raise_for_status()
        return r.json()

    def logout_url(self, post_logout_redirect: str) -> str:
        """The provider's logout, which ends its session without asking and sends the browser to
        ``post_logout_redirect`` (it must be registered: ``allow_hub`` registers a hub's /hub/login)."""
        return f"{self.issuer}/oauth2/logout?confirm=1&post_logout_redirect_uri={quote(post_logout_redirect, safe='')}"

    def allow_hub(self, hub_url: str) -> None:
        """Register a hub (``http://127.0.0.1:PORT``): its ``/hub/oauth_callback`` as a redirect URI, its
        ``/hub/login`` and ``/hub/logout`` as pages to return to after logging out. A running provider is waited for
        until it sends people back to that hub (about 1 to 2 s: it looks for a new configuration once a second)."""
        if not (self.run_dir / "lemonldap-ng.ini").exists():  # not started yet: registered in its first configuration
            self._hub_urls.append(hub_url)
            return
        lemonldap_conf.update_client(self.run_dir, hub_urls=[hub_url])
        if self._running:
            target = f"{hub_url.rstrip('/')}/hub/login"
            self._wait_for(
                lambda: (
                    requests.get(self.logout_url(target), allow_redirects=False, timeout=10).headers.get("Location")
                    == target
                ),
                f"the provider sends people back to {target} after logout",
            )

    def set_client_secret(self, secret: str) -> None:
        """Change the hub's client secret at the provider; a running provider is waited for until it takes it."""
        self.client_secret = secret
        if not (self.run_dir / "lemonldap-ng.ini").exists():
            raise RuntimeError("start the provider before changing its client secret")
        lemonldap_conf.update_client(self.run_dir, client_secret=secret)
        if self._running:
            # The new secret with a made-up code: invalid_grant (400) once the secret is right, invalid_client before.
            self._wait_for(
                lambda: self.token_request({"grant_type": "authorization_code", "code": "none"}).status_code == 400,
                "the provider takes the new client secret",
            )

    def token_request(self, data: dict[str, str], secret: str | None = None) -> requests.Response:
        """POST to the token endpoint as the hub does (client_secret_basic)."""
        auth = (self.client_id, self.client_secret if secret is None else secret)
        return requests.post(f"{self.issuer}/oauth2/token", data=data, auth=auth, timeout=10)

    def _wait_for(self, condition, what: str, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            time.sleep(0.1)
        raise AssertionError(f"not within {timeout} s: {what}; the end of the portal's log:\n{self.log()[-3000:]}")


# The provider's login page ----------------------------------------------------------------------------------------


def login_form(page: str) -> tuple[str, dict[str, str]]:
    """The portal's login form (``<form id="lform">``): its action and its fields with their values (the one-time
    ``token`` among them), to which a test adds ``user`` and ``password``."""
    form = re.search(r'(?s)<form[^>]*id="lform"[^>]*>(.*?)</form>', page)
    if form is None:
        raise AssertionError(f"no login form on the provider's page: {page[:500]}")
    head = re.match(r"<form[^>]*>", form.group(0))
    action_match = re.search(r'action="([^"]*)"', head.group(0) if head else "")
    fields = {}
    for tag in re.findall(r"<input[^>]*>", form.group(1)):
        name = re.search(r'name="([^"]+)"', tag)
        value = re.search(r'value="([^"]*)"', tag)
        if name:
            fields[name.group(1)] = html.unescape(value.group(1)) if value else ""
    return html.unescape(action_match.group(1)) if action_match else "", fields


def sign_in(session: requests.Session, page: requests.Response, user: str, password: str) -> requests.Response:
    """Fill in and send the login form of ``page`` (the provider's answer to an authorize request) as a browser does;
    the answer, not followed: a redirect to the client's callback once the password is right, the page again with a
    message (``portal_message``) when it is not."""
    action, fields = login_form(page.text)
    fields.update(user=user, password=password)
    return session.post(urljoin(page.url, action or page.url), data=fields, allow_redirects=False, timeout=30)


@functools.cache
def _portal_messages() -> dict[str, str]:
    return json.loads(_PORTAL_LANGUAGE.read_text()) if _PORTAL_LANGUAGE.exists() else {}


def portal_message(page: str) -> str | None:
    """The message the portal shows on ``page``, in English as the browser shows it (the page holds a number its
    JavaScript translates: ``<span trmsg="5">`` is "Wrong credentials"), or None."""
    found = re.search(r'class="message message-\w+ alert"[^>]*>\s*<span trmsg="(\d+)"', page)
    if found is None:
        return None
    return _portal_messages().get(f"PE{found.group(1)}", f"portal message {found.group(1)}")
