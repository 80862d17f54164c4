"""Log in with the university's directory (LDAP): ``WORKBENCH_AUTHENTICATOR=ldap``.

``jupyterhub-ldapauthenticator`` does the binding: a DN made from a template
(``uid={username},ou=people,...``) or found by a service account's search,
over StartTLS or LDAPS. Four things it does not do, which a lab needs, are
added here:

* **Groups from the directory.** Its ``authenticate`` returns no ``groups``,
  so JupyterHub's ``manage_groups`` fails every login ("auth_model ...
  specifies no groups"). This class searches ``group_search_base`` for the
  groups that name the user (``group_search_filter``: ``member``,
  ``uniqueMember`` or a posixGroup's ``memberUid``) with the connection bound
  as that user, and returns their names; JupyterHub then makes the user's
  hub groups exactly these at each login, so the directory's ``ml-course``
  decides the GPU quota (quotas per group, the most generous wins).
  ``login_groups`` limits the hub to members of some groups, and
  ``admin_groups`` makes a group's members hub admins.
* **The event loop stays free.** Its ``authenticate`` is an ``async def``
  that calls the synchronous ldap3 and never awaits: each login froze the
  hub for its two TLS handshakes and searches (60-130 ms; 50 logins at once
  froze it for 3.3 s on this machine kind). A worker thread is not enough
  (ldap3 holds the interpreter's lock while it works: 200 logins in threads
  still lagged the loop by 5 s at p95), so the whole login runs in worker
  processes (``directory_workers.py``).
* **The directory down is said, not hidden.** An unreachable server or a
  failed TLS handshake raised out of ``authenticate`` (a 500 page). Here
  the login page answers 503 with a sentence; servers already running are
  not touched (the hub asks the directory only at login).
* **Wrong passwords count toward the hub's lock-out** (``lockout.py``,
  ``WORKBENCH_LOGIN_ATTEMPTS`` in ``WORKBENCH_LOGIN_LOCKOUT_SECONDS``), as
  with NativeAuthenticator; the directory's own policy (OpenLDAP's ppolicy)
  counts them too, since every guess is a bind.

Names are lowercased before the check against ``valid_username_regex``
(``Alice`` logs in as ``alice``; ldapauthenticator refused her), and TLS
always verifies the server's certificate (ldap3's default is
``CERT_NONE``: any certificate was accepted).
"""

from __future__ import annotations

import ssl
from typing import Any

import ldap3
from jupyterhub.handlers.login import LoginHandler
from ldap3.utils.conv import escape_filter_chars
from ldap3.utils.dn import parse_dn
from ldapauthenticator import LDAPAuthenticator
from tornado import web
from traitlets import Integer, Set, Unicode, default

from workbench_hub import lockout
from workbench_hub.directory_workers import DirectoryUnreachableError, DirectoryWorkers

DIRECTORY_DOWN = (
    "The university directory cannot be reached, so no one can log in just now; servers already "
    "running are not affected. Try again in a few minutes, or tell the hub's admins if it lasts."
)


class DirectoryUnavailable(web.HTTPError):
    """The directory (or the provider) did not answer a login: a 503 whose sentence the login page shows."""

    def __init__(self, sentence: str = DIRECTORY_DOWN):
        super().__init__(503, reason=sentence)
        self.sentence = sentence


class NotInLoginGroups(web.HTTPError):
    """The password was right but the person is in none of ``login_groups``: a 403 that says so."""

    def __init__(self, name: str, groups: set[str]):
        self.sentence = (
            f"{name}, your account is not in a group that may use this hub ({', '.join(sorted(groups))}). "
            "Ask your course's staff to add you to the course's group in the university directory."
        )
        super().__init__(403, reason=self.sentence)


class DirectoryLoginHandler(LoginHandler):
    """JupyterHub's login form, saying why a login failed: locked out, directory down, not in a course."""

    async def post(self) -> None:
        data = {arg: self.get_argument(arg, strip=arg == "username") for arg in self.request.body_arguments}
        data.pop("_xsrf", None)
        username = data.get("username", "")
        try:
            user = await self.login_user(data)
        except (DirectoryUnavailable, NotInLoginGroups) as exc:
            self.set_status(exc.status_code)
            self.finish(await self._render(login_error=exc.sentence, username=username[:64]))
            return
        if user:
            self._jupyterhub_user = user
            self.redirect(self.get_next_url(user))
            return
        error = "Invalid username or password."
        locked_for = self.authenticator.lockout_seconds_left(self.authenticator.normalize_username(username))
        if locked_for:
            error = lockout.locked_out_sentence(username[:64], locked_for)
        self.set_status(403)
        self.finish(await self._render(login_error=error, username=username[:64]))


class WorkbenchLDAPAuthenticator(LDAPAuthenticator):
    """LDAPAuthenticator with the directory's groups, off the event loop, with a lock-out and plain errors."""

    group_search_base = Unicode(
        "",
        config=True,
        help="""The subtree searched for the groups a user is in (``WORKBENCH_LDAP_GROUP_BASE``), e.g.
        ``ou=groups,dc=example,dc=edu``. Their names (``group_name_attribute``) become the user's hub
        groups at each login, which decide GPU quotas. Empty: the directory gives no groups, and the
        hub's groups are managed by hand as with other authenticators.""",
    )

    group_name_attribute = Unicode(
        "cn",
        config=True,
        help="""The group entry's attribute that names the hub group (``WORKBENCH_LDAP_GROUP_ATTRIBUTE``);
        ``cn`` in most directories.""",
    )

    login_groups = Set(
        Unicode(),
        config=True,
        help="""Only members of these directory groups (by name) may log in (``WORKBENCH_LOGIN_GROUPS``);
        admins (``admin_users``, members of ``admin_groups``) always may. Empty: everyone the directory
        accepts.""",
    )

    admin_groups = Set(
        Unicode(),
        config=True,
        help="""Members of these directory groups are hub admins (``WORKBENCH_ADMIN_GROUPS``); leaving
        the group takes admin away at the next login. Names in ``admin_users`` stay admins.""",
    )

    ca_file = Unicode(
        "",
        config=True,
        help="""The CA certificates (PEM) that sign the directory's certificate (``WORKBENCH_LDAP_CA_FILE``);
        empty: the system's. The certificate and its host name are always checked.""",
    )

    allowed_failed_logins = Integer(
        5,
        config=True,
        help="""Wrong passwords in a row before a name is refused without asking the directory
        (``WORKBENCH_LOGIN_ATTEMPTS``); 0 turns the hub's lock-out off.""",
    )

    seconds_before_next_try = Integer(
        300,
        config=True,
        help="""How long a name stays locked out after ``allowed_failed_logins`` wrong passwords
        (``WORKBENCH_LOGIN_LOCKOUT_SECONDS``).""",
    )

    login_processes = Integer(
        1,
        config=True,
        help="""How many worker processes run directory logins (``directory_workers.py``): ldap3 is pure
        Python, so logins in the hub's own process stall its event loop under a class logging in at once.
        On a two-core hub one worker let 200 students log in within 37 s with the loop's lag at 94 ms (p95);
        two workers logged them in no faster and lagged it by 382 ms, competing with the hub for the
        cores. Raise it on a hub with more cores.""",
    )

    @default("tls_kwargs")
    def _verified_tls(self) -> dict[str, Any]:
        # ldap3.Tls() checks nothing by default; a directory's certificate must be the directory's.
        return {"validate": ssl.CERT_REQUIRED, **({"ca_certs_file": self.ca_file} if self.ca_file else {})}

    @default("valid_username_regex")
    def _lowercase_names(self) -> str:
        # Names are lowercased before this check (authenticate), so the default stays ldapauthenticator's.
        return r"^[a-z][.a-z0-9_-]*$"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.failed_logins = lockout.FailedLogins()
        self._turns = lockout.OneCheckAtATime()
        self._workers: DirectoryWorkers | None = None

    def workers(self) -> DirectoryWorkers:
        """The worker processes, given every directory setting of this authenticator (built once)."""
        if self._workers is None:
            own = {**LDAPAuthenticator.class_own_traits(config=True), **type(self).class_own_traits(config=True)}
            settings = {name: getattr(self, name) for name in own if name != "login_processes"}
            self._workers = DirectoryWorkers(type(self), settings, max(1, self.login_processes))
        return self._workers

    def check_allow_config(self) -> None:
        """JupyterHub's start-time check; the directory workers start now, not at the first login."""
        super().check_allow_config()
        self.workers().warm_up()

    def get_handlers(self, app: Any) -> list[tuple[str, type]]:
        return [("/login", DirectoryLoginHandler)]

    def normalize_username(self, username: str) -> str:
        return super().normalize_username(username.strip().lower())

    def lockout_seconds_left(self, username: str) -> float:
        """How long the (normalized) name is still locked out; 0 when it may try (or lock-out is off)."""
        if not self.allowed_failed_logins or not self.seconds_before_next_try:
            return 0.0
        return self.failed_logins.seconds_left(username, self.allowed_failed_logins, self.seconds_before_next_try)

    def refuses(self, username: str, groups: list[str]) -> bool:
        """Whether ``login_groups`` keep this person out: in none of them and not an admin (by name or by an
        admin group), as oauthenticator decides for single sign-on."""
        if not self.login_groups or set(groups) & self.login_groups:
            return False
        return username not in self.admin_users and not set(groups) & self.admin_groups

    def get_user_attributes(self, conn: ldap3.Connection, userdn: str) -> dict[str, Any]:
        """ldapauthenticator's attributes, plus the user's groups under ``_groups`` (the connection is
        bound as the user)."""
        attributes = dict(super().get_user_attributes(conn, userdn))
        attributes["_groups"] = self.directory_groups(conn, userdn) if self.group_search_base else None
        return attributes

    def directory_groups(self, conn: ldap3.Connection, userdn: str) -> list[str]:
        """The names of the groups under ``group_search_base`` that have ``userdn`` (or its uid) as member."""
        uid = parse_dn(userdn)[0][1]  # uid=alice,ou=people,... -> alice, for a posixGroup's memberUid
        conn.search(
            search_base=self.group_search_base,
            search_scope=ldap3.SUBTREE,
            search_filter=self.group_search_filter.format(
                userdn=escape_filter_chars(userdn), uid=escape_filter_chars(uid)
            ),
            attributes=[self.group_name_attribute],
        )
        return sorted(
            {str(value) for entry in conn.entries for value in entry[self.group_name_attribute].values if value}
        )

    async def authenticate(self, handler: Any, data: dict[str, str]) -> dict[str, Any] | None:
        """Bind as the user in a worker process (one check at a time per name, so guesses sent at once are
        all counted), then the groups and the admin flag the directory gives."""
        username = self.normalize_username(data.get("username", ""))
        password = data.get("password", "")
        async with self._turns.turn(username):
            locked_for = self.lockout_seconds_left(username)
            if locked_for:
                lockout.log_refusal(self.log, username, self.allowed_failed_logins, locked_for, "asking the directory")
                return None
            try:
                model = await self.workers().login({"username": username, "password": password})
            except DirectoryUnreachableError as exc:
                self.log.error("The directory did not answer the login of %s: %s", username, exc)
                raise DirectoryUnavailable() from None
            if model is None:
                self.failed_logins.failed(username)
                return None
            self.failed_logins.succeeded(username)
        groups = model["auth_state"]["user_attributes"].pop("_groups", None)
        if groups is None:
            return model
        if self.refuses(username, groups):
            self.log.warning(
                "Login refused for %s: in none of the login groups %s", username, sorted(self.login_groups)
            )
            raise NotInLoginGroups(username, set(self.login_groups))
        model["groups"] = groups
        if self.admin_groups:
            model["admin"] = bool(set(groups) & self.admin_groups) or username in self.admin_users
        return model
