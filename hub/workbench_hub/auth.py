"""NativeAuthenticator, made to work on JupyterHub 6, with authorized sign-ups known to the hub,
bcrypt kept off the hub's event loop, no state change on GET, a lock-out that says when to try
again, and the first admin's account made at start where others reach the hub.

NativeAuthenticator 1.3.0 (the newest release) predates JupyterHub 6, whose
handlers no longer carry a ``statsd`` client: its login handler then fails
every sign-in with a 500. This module keeps NativeAuthenticator's sign-up,
authorization and password rules and supplies its own login form handler.

It also closes a gap between NativeAuthenticator's sign-ups (its own table,
``users_info``) and the hub's users: JupyterHub learns a user only at their
first login, so an admin could authorize a sign-up at ``/hub/authorize`` and
still not give them a GPU quota (the workbench service answered "no user
named ... on this hub"). Now a sign-up becomes a hub user the moment it is
authorized: when an admin authorizes it (``/hub/authorize/NAME``), when it
approves itself by e-mail (``/hub/confirm/...``), when it is authorized at
once (an admin's own sign-up, or open sign-up), and, for sign-ups authorized
before this existed, when the hub starts. Taking an authorization back
leaves the hub user in place (they can no longer log in; delete them on the
hub's admin page to remove them and their servers).

And it moves NativeAuthenticator's bcrypt work (~0.2 s of CPU per password
at cost 12) off the event loop, into ``password_checks``' thread pool: the
check at login (and the second one NativeAuthenticator's login page makes to
tell an unauthorized sign-up apart), the hash at sign-up and the hash and
check at password change. The hashes, their cost and every rule stay
NativeAuthenticator's; only the bcrypt call moves, the database stays on
the loop. A class logging in at once used to stall the whole hub for as
long as all its checks took (200 logins: 55 s); now they queue in the pool.

Authorizing, taking back and discarding sign-ups, and the self-approval
e-mail's confirmation, are POSTs with ``_xsrf`` (``sign_up_approval.py``):
NativeAuthenticator did them on GET, which any other site could make an
admin's browser send. After ``allowed_failed_logins`` failures a name is
refused without a password check until ``seconds_before_next_try`` has
passed, and the login page says how long that is (``lockout.py``: on by
default). Where other machines reach the hub, the admins' accounts are made
at start from ``WORKBENCH_ADMIN_PASSWORD``, or the hub does not start
(``first_admin.py``).

Drop the JupyterHub 6 part when a NativeAuthenticator release supports
JupyterHub 6.
"""

from __future__ import annotations

import asyncio
import re
from contextlib import contextmanager
from contextvars import ContextVar

from nativeauthenticator import NativeAuthenticator
from nativeauthenticator.handlers import ChangePasswordAdminHandler as NativeChangePasswordAdminHandler
from nativeauthenticator.handlers import ChangePasswordHandler as NativeChangePasswordHandler
from nativeauthenticator.handlers import DiscardHandler as NativeDiscardHandler
from nativeauthenticator.handlers import EmailAuthorizationHandler as NativeEmailAuthorizationHandler
from nativeauthenticator.handlers import LoginHandler as NativeLoginHandler
from nativeauthenticator.handlers import SignUpHandler as NativeSignUpHandler
from nativeauthenticator.handlers import ToggleAuthorizationHandler as NativeToggleAuthorizationHandler
from nativeauthenticator.handlers import admin_users_scope
from nativeauthenticator.orm import UserInfo
from sqlalchemy.exc import SQLAlchemyError
from tornado import web
from traitlets import Unicode

from workbench_hub import first_admin, lockout, password_checks
from workbench_hub.sign_up_approval import (
    DiscardHandler,
    EmailAuthorizationHandler,
    ToggleAuthorizationHandler,
    is_authorized,
    make_hub_user,
)
from workbench_spawner.ledger.invite_book import InviteBook
from workbench_spawner.ledger.store import AllocationStore

# A password and its bcrypt hash, made in the pool by the handler now serving a request (a sign-up
# or a password change); NativeAuthenticator's create_user/change_password, called by that handler,
# store it instead of hashing on the loop. Per request: a ContextVar follows its task.
_hashed_in_pool: ContextVar[tuple[str, bytes] | None] = ContextVar("workbench_hashed_in_pool", default=None)


# The name a valid one-time sign-up link (a course roster's invite, ledger/invite_book.py) vouches for, in the
# request now signing up: NativeAuthenticator's create_user treats it as authorized in advance.
_invited: ContextVar[str | None] = ContextVar("workbench_invited", default=None)
INVALID_INVITE = (
    "This sign-up link is not valid for that name: it was used already, it has expired, or it was made for "
    "another name. Sign up with the name your instructor gave you, or ask them for a new link."
)


@contextmanager
def _using_hash(password: str, hashed: bytes | None):
    token = _hashed_in_pool.set((password, hashed) if hashed is not None else None)
    try:
        yield
    finally:
        _hashed_in_pool.reset(token)


def _hash_for(password: str) -> bytes | None:
    """The hash the current request made in the pool for exactly this password, if any."""
    made = _hashed_in_pool.get()
    return made[1] if made is not None and made[0] == password else None


async def _hash_in_pool(password: str) -> bytes | None:
    try:
        return await password_checks.hash_password(password)
    except ValueError:  # over bcrypt's 72 bytes: NativeAuthenticator's own call refuses it as before
        return None


class LoginHandler(NativeLoginHandler):
    def _render(self, login_error=None, username=None, **_ignored):
        # JupyterHub 6 renders login errors through _render(**namespace),
        # passing keys (sync, status_code, ...) NativeAuthenticator's
        # version does not accept.
        return super()._render(login_error=login_error, username=username)

    async def post(self):
        # NativeAuthenticator's LoginHandler.post, without its statsd timer (gone in JupyterHub 6) and
        # with its second password check (to say "not authorized yet") in the pool, made only where
        # that message could be the answer (an existing sign-up that is not authorized) and never
        # while the name is locked out (it would check passwords past the lock-out); a locked-out name
        # reads when it may try again.
        data = {arg: self.get_argument(arg, strip=False) for arg in self.request.arguments}
        if "username" not in data or "password" not in data:
            raise web.HTTPError(400, "A login needs a username and a password.")
        user = await self.login_user(data)
        if user:
            # register current user for subsequent requests to user (e.g. logging the request)
            self._jupyterhub_user = user
            self.redirect(self.get_next_url(user))
            return
        error = "Invalid username or password."
        username = data["username"]
        info = self.authenticator.get_user(username)
        locked_for = self.authenticator.lockout_seconds_left(self.authenticator.normalize_username(username))
        if locked_for:
            error = lockout.locked_out_sentence(username, locked_for)
        elif (
            info is not None
            and not info.is_authorized
            and await password_checks.check_password(data["password"], info.password)
        ):
            error = f"User {username} has not been authorized by an administrator yet."
        html = await self._render(login_error=error, username=username)
        self.finish(html)


class SignUpHandler(NativeSignUpHandler):
    def get_result_message(self, user, *args):
        if user is not None and _invited.get() is not None and getattr(user, "is_authorized", False):
            return "alert-success", "The signup was successful! You can now log in with your name and password."
        return super().get_result_message(user, *args)

    async def post(self):
        # A course roster's one-time link (/hub/signup?invite=...; the form posts back to its address): a
        # sign-up with the link's name is authorized at once, and the link is used up.
        authenticator = self.authenticator
        invite = self.get_query_argument("invite", "")
        invited = None
        if invite and authenticator.enable_signup:
            name = authenticator.normalize_username(self.get_body_argument("username", "", strip=False))
            if not await asyncio.to_thread(authenticator.invite_valid, name, invite):
                self.set_status(403)
                html = await self.render_template(
                    "signup.html",
                    alert="alert-danger",
                    result_message=INVALID_INVITE,
                    ask_email=authenticator.ask_email_on_signup,
                    two_factor_auth=authenticator.allow_2fa,
                    recaptcha_key=authenticator.recaptcha_key,
                    tos=authenticator.tos,
                )
                return self.finish(html)
            invited = name
        token = _invited.set(invited)
        try:
            await self._sign_up()
        finally:
            _invited.reset(token)
        if invited and is_authorized(self.db, invited):
            await asyncio.to_thread(authenticator.use_invite, invited, invite)

    async def _sign_up(self):
        # The password is hashed in the pool first, where create_user could store it; create_user
        # still applies every rule (on the loop, with the insert). With reCAPTCHA on, the captcha
        # is checked inside NativeAuthenticator's post before any hashing, so its hash stays there.
        authenticator = self.authenticator
        name = self.get_body_argument("username", "", strip=False)
        password = self.get_body_argument("signup_password", "", strip=False)
        hashed = None
        if (
            authenticator.enable_signup
            and not authenticator.recaptcha_key
            and password == self.get_body_argument("signup_password_confirmation", None, strip=False)
            and not authenticator.user_exists(name)
            and authenticator.is_password_strong(password)
        ):
            hashed = await _hash_in_pool(password)
        with _using_hash(password, hashed):
            await super().post()
        # Authorized at once (an admin's own sign-up, or open sign-up): a hub user now.
        name = authenticator.normalize_username(name)
        if name and is_authorized(self.db, name):
            await make_hub_user(self, name)


class ChangePasswordHandler(NativeChangePasswordHandler):
    @web.authenticated
    async def post(self):
        # NativeAuthenticator's ChangePasswordHandler.post, its messages and order, with the check of
        # the current password and the new hash made in the pool.
        user = await self.get_current_user()
        old_password = self.get_body_argument("old_password", strip=False)
        new_password = self.get_body_argument("new_password", strip=False)
        confirmation = self.get_body_argument("new_password_confirmation", strip=False)
        info = self.authenticator.get_user(user.name)
        correct_password_provided = info is not None and await password_checks.check_password(
            old_password, info.password
        )
        if not correct_password_provided:
            alert = "alert-danger"
            message = "Your current password was incorrect. Please try again."
        elif new_password != confirmation:
            alert = "alert-danger"
            message = "Your new password didn't match the confirmation. Please try again."
        else:
            hashed = await _hash_in_pool(new_password) if self.authenticator.is_password_strong(new_password) else None
            with _using_hash(new_password, hashed):
                success = self.authenticator.change_password(user.name, new_password)
            if success:
                alert = "alert-success"
                message = "Your password has been changed successfully!"
            else:
                alert = "alert-danger"
                minimum_password_length = self.authenticator.minimum_password_length
                if minimum_password_length > 0:
                    message = (
                        "Something went wrong!\n"
                        "Be sure your new password has at least"
                        f" {minimum_password_length} characters "
                        "and is not too common."
                    )
                else:
                    message = "Something went wrong!\nBe sure your new password is not too common."
        html = await self.render_template(
            "change-password.html",
            user_name=user.name,
            result_message=message,
            alert=alert,
        )
        self.finish(html)


class ChangePasswordAdminHandler(NativeChangePasswordAdminHandler):
    @admin_users_scope
    async def post(self, user_name):
        # The new password is hashed in the pool first; NativeAuthenticator's post (its messages)
        # and change_password (its rules) then store that hash.
        new_password = self.get_body_argument("new_password", strip=False)
        hashed = None
        if (
            new_password == self.get_body_argument("new_password_confirmation", strip=False)
            and self.authenticator.user_exists(user_name)
            and self.authenticator.is_password_strong(new_password)
        ):
            hashed = await _hash_in_pool(new_password)
        with _using_hash(new_password, hashed):
            await super().post(user_name)


REPLACED = {
    NativeLoginHandler: LoginHandler,
    NativeSignUpHandler: SignUpHandler,
    NativeChangePasswordHandler: ChangePasswordHandler,
    NativeChangePasswordAdminHandler: ChangePasswordAdminHandler,
    NativeToggleAuthorizationHandler: ToggleAuthorizationHandler,
    NativeDiscardHandler: DiscardHandler,
    NativeEmailAuthorizationHandler: EmailAuthorizationHandler,
}


class WorkbenchAuthenticator(NativeAuthenticator):
    """NativeAuthenticator with a login page that runs on JupyterHub 6, whose authorized
    sign-ups are hub users at once, whose bcrypt work runs off the event loop, whose state
    changes are POSTs, and whose admins have accounts before anyone else can sign up."""

    # JupyterHub's Authenticator trait, declared for the type checker (nativeauthenticator has no types).
    allowed_users: set[str]

    admin_password = Unicode(
        "",
        help="""The password of the admins' accounts made at start (``WORKBENCH_ADMIN_PASSWORD``).

        Each name in ``admin_users`` that has no account when the hub starts gets one,
        authorized, with this password; accounts that exist are not changed. It must pass
        the password rules (``minimum_password_length``, ``check_common_password``), or the
        hub does not start. Empty: no accounts are made (admins sign up, authorized at once).
        """,
    ).tag(config=True)

    reached_from = Unicode(
        "",
        help="""Where other machines reach this hub, in words (set by the hub's config, e.g.
        "the proxy's address 0.0.0.0"); empty when only this machine does.

        When set, the hub does not start while an admin in ``admin_users`` has no account and
        ``admin_password`` is empty: otherwise whoever signed up first under an admin's name
        would own the hub (workbench_hub/first_admin.py).
        """,
    ).tag(config=True)

    invite_db_url = Unicode(
        "",
        help="""The GPU database whose one-time sign-up links (a course roster's, ``workbench course import``)
        authorize a sign-up at once. Set by the hub's config to the spawner's ``gpu_db_url``; empty: links are
        refused as not valid.""",
    ).tag(config=True)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._invites: InviteBook | None = None
        # One password check at a time per name (authenticate), so guesses sent at once are all counted.
        self._turns = lockout.OneCheckAtATime()
        # Sign-ups authorized before hub users were made at authorization:
        # JupyterHub creates every name in allowed_users when it starts
        # (allow_all stays what the config says, so this lets no one else in).
        try:
            authorized = {info.username for info in UserInfo.all_users(self.db) if info.is_authorized}
        except (
            SQLAlchemyError,
            AttributeError,
        ) as exc:  # no users_info table yet, or no database: nothing to carry over
            self.log.debug("No authorized sign-ups to carry over: %s", exc)
            return
        if authorized - set(self.allowed_users):
            self.allowed_users = set(self.allowed_users) | authorized

    def get_handlers(self, app):
        return [(path, REPLACED.get(handler, handler)) for path, handler in super().get_handlers(app)]

    def check_allow_config(self):
        """JupyterHub's start-time check of the authenticator's config (``init_users``), then the
        admins' accounts: made from ``admin_password``, or the hub stops where others reach it."""
        super().check_allow_config()
        try:
            first_admin.set_up_admins(self)
        except first_admin.FirstAdminError as exc:
            from workbench_hub.finish import fail

            fail(str(exc))

    def lockout_seconds_left(self, username: str) -> float:
        """How long the (normalized) name is still locked out; 0 when it may try (or lock-out is off)."""
        attempts = self.login_attempts.get(username)
        if not self.allowed_failed_logins or not attempts or attempts["count"] < self.allowed_failed_logins:
            return 0.0
        return lockout.seconds_left(attempts["time"], self.seconds_before_next_try)

    def is_blocked(self, username):
        """NativeAuthenticator's rule (``allowed_failed_logins`` failures, then ``seconds_before_next_try``),
        counting the whole time since the last failure (its own check dropped whole days)."""
        return self.lockout_seconds_left(username) > 0

    async def authenticate(self, handler, data):
        """NativeAuthenticator.authenticate, its rules and order, with the bcrypt check in the pool."""
        username = self.normalize_username(data["username"])
        password = data["password"]
        async with self._turns.turn(username):
            user = self.get_user(username)
            if not user:
                return None
            locked_for = self.lockout_seconds_left(username)
            if locked_for:
                lockout.log_refusal(self.log, username, self.allowed_failed_logins, locked_for, "a password check")
                return None
            # Everything is evaluated, as NativeAuthenticator does; the row is read before the wait.
            validations = [user.is_authorized]
            if user.has_2fa:
                validations.append(user.is_valid_token(data.get("2fa")))
            validations.append(await password_checks.check_password(password, user.password))
            if all(validations):
                self.successful_login(username)
                return username
            self.add_login_attempt(username)
            return None

    def create_user(self, username, password, **kwargs):
        """NativeAuthenticator.create_user; where the request's handler already hashed this password
        in the pool (SignUpHandler), that hash is stored and the same rules apply, in the same order."""
        hashed = _hash_for(password)
        if hashed is None:
            return super().create_user(username, password, **kwargs)
        username = self.normalize_username(username)
        if self.user_exists(username) or not self.validate_username(username):
            return None
        if not self.is_password_strong(password):
            return None
        if not self.enable_signup:
            return None
        infos = {"username": username, "password": hashed, **kwargs}
        # Pre-authorized users (admins, or any users during open signup)
        pre_authorized = self.open_signup or username in self.get_authed_users()
        if pre_authorized:
            infos["is_authorized"] = True
        try:
            user_info = UserInfo(**infos)
        except AssertionError:
            return None
        # Don't send authorization emails to pre-authorized users.
        if (
            self.allow_self_approval_for
            and not pre_authorized
            and re.match(self.allow_self_approval_for, user_info.email)
        ):
            url = self.generate_approval_url(username)
            self.send_approval_email(user_info.email, url)
            user_info.login_email_sent = True
        self.db.add(user_info)
        self.db.commit()
        return user_info

    def change_password(self, username, new_password):
        """NativeAuthenticator.change_password; where the request's handler already hashed the new
        password in the pool, that hash is stored under the same rules."""
        hashed = _hash_for(new_password)
        if hashed is None:
            return super().change_password(username, new_password)
        user = self.get_user(username)
        if user is None or not self.is_password_strong(new_password):
            return None
        user.password = hashed
        self.db.commit()
        return True

    def get_authed_users(self):
        """NativeAuthenticator's set (authorized sign-ups, allowed users, admins) in one query: its
        own reads every sign-up and then each one again by name, at every sign-up."""
        authorized = {name for (name,) in self.db.query(UserInfo.username).filter(UserInfo.is_authorized)}
        invited = _invited.get()
        return authorized | set(self.allowed_users) | set(self.admin_users) | ({invited} if invited else set())

    @property
    def invites(self) -> InviteBook:
        """The GPU database's one-time sign-up links (opened on first use)."""
        if self._invites is None:
            self._invites = InviteBook(AllocationStore(self.invite_db_url))
        return self._invites

    def invite_valid(self, name: str, token: str) -> bool:
        """Whether ``token`` is ``name``'s unused, unexpired sign-up link (blocking)."""
        return bool(self.invite_db_url) and self.invites.valid(name, token)

    def use_invite(self, name: str, token: str) -> None:
        """Use up ``name``'s link after its sign-up (blocking)."""
        self.invites.use(name, token)

    def get_unauthed_amount(self):
        """NativeAuthenticator's count of sign-ups not yet authorized, without its query per sign-up
        (and its get_authed_users per sign-up)."""
        authed = self.get_authed_users()
        return sum(1 for (name,) in self.db.query(UserInfo.username) if name not in authed)
