"""NativeAuthenticator, made to work on JupyterHub 6, with authorized sign-ups known to the hub.

NativeAuthenticator 1.3.0 (the newest release) predates JupyterHub 6, whose
handlers no longer carry a ``statsd`` client: its login handler then fails
every sign-in with a 500. This module keeps NativeAuthenticator's sign-up,
authorization and password handling and only supplies what its login page
expects.

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

Drop the JupyterHub 6 part when a NativeAuthenticator release supports
JupyterHub 6.
"""

from __future__ import annotations

from jupyterhub.utils import maybe_future
from nativeauthenticator import NativeAuthenticator
from nativeauthenticator.handlers import EmailAuthorizationHandler as NativeEmailAuthorizationHandler
from nativeauthenticator.handlers import LoginHandler as NativeLoginHandler
from nativeauthenticator.handlers import SignUpHandler as NativeSignUpHandler
from nativeauthenticator.handlers import ToggleAuthorizationHandler as NativeToggleAuthorizationHandler
from nativeauthenticator.handlers import admin_users_scope
from nativeauthenticator.orm import UserInfo
from tornado import web


class _NoTimer:
    def start(self):
        return self

    def stop(self, send=True):
        return self


class _NoStats:
    """Stands in for the statsd client JupyterHub 6 dropped."""

    def timer(self, _name):
        return _NoTimer()


class LoginHandler(NativeLoginHandler):
    statsd = _NoStats()

    def _render(self, login_error=None, username=None, **_ignored):
        # JupyterHub 6 renders login errors through _render(**namespace),
        # passing keys (sync, status_code, ...) NativeAuthenticator's
        # version does not accept.
        return super()._render(login_error=login_error, username=username)


async def make_hub_user(handler, name: str) -> None:
    """Create the hub user of an authorized sign-up, as the hub's own user API does."""
    if handler.find_user(name) is not None:
        return
    user = handler.user_from_username(name)  # creates the orm.User, with the default roles
    await maybe_future(handler.authenticator.add_user(user))
    handler.log.info("Authorized sign-up %s is now a hub user (quotas can be set before the first login)", name)


def _authorized(db, name: str) -> bool:
    info = UserInfo.find(db, name)
    return bool(info is not None and info.is_authorized)


class SignUpHandler(NativeSignUpHandler):
    async def post(self):
        await super().post()
        # Authorized at once (an admin's own sign-up, or open sign-up): a hub user now.
        name = self.authenticator.normalize_username(self.get_body_argument("username", "", strip=False))
        if name and _authorized(self.db, name):
            await make_hub_user(self, name)


class ToggleAuthorizationHandler(NativeToggleAuthorizationHandler):
    @admin_users_scope
    async def get(self, slug):
        if UserInfo.find(self.db, slug) is None:
            raise web.HTTPError(404, f"no sign-up named {slug!r}")
        info = UserInfo.change_authorization(self.db, slug)
        if info.is_authorized:
            await make_hub_user(self, info.username)
        self.redirect(self.hub.base_url + "authorize#" + slug)


class EmailAuthorizationHandler(NativeEmailAuthorizationHandler):
    async def get(self, slug):
        await super().get(slug)
        try:
            name = self.validate_slug(slug, self.authenticator.secret_key)["username"]
        except (ValueError, KeyError, TypeError):
            return
        if _authorized(self.db, name):
            await make_hub_user(self, name)


REPLACED = {
    NativeLoginHandler: LoginHandler,
    NativeSignUpHandler: SignUpHandler,
    NativeToggleAuthorizationHandler: ToggleAuthorizationHandler,
    NativeEmailAuthorizationHandler: EmailAuthorizationHandler,
}


class WorkbenchAuthenticator(NativeAuthenticator):
    """NativeAuthenticator with a login page that runs on JupyterHub 6, whose authorized
    sign-ups are hub users at once."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Sign-ups authorized before hub users were made at authorization:
        # JupyterHub creates every name in allowed_users when it starts
        # (allow_all stays what the config says, so this lets no one else in).
        try:
            authorized = {info.username for info in UserInfo.all_users(self.db) if info.is_authorized}
        except Exception as exc:  # no users_info table yet, or no database: nothing to carry over
            self.log.debug("No authorized sign-ups to carry over: %s", exc)
            return
        if authorized - set(self.allowed_users):
            self.allowed_users = set(self.allowed_users) | authorized

    def get_handlers(self, app):
        return [(path, REPLACED.get(handler, handler)) for path, handler in super().get_handlers(app)]
