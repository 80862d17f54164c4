"""Authorizing, taking back and discarding sign-ups: buttons that POST with ``_xsrf``, never a link.

NativeAuthenticator changes state on GET: ``/hub/authorize/NAME`` toggles a
sign-up's authorization, ``/hub/discard/NAME`` deletes a waiting sign-up and
``/hub/confirm/SLUG`` (the self-approval e-mail's link) authorizes one. A
browser sends the login cookies on a top-level GET navigation from any site
(SameSite=Lax lets exactly that through), so while an admin was logged in, a
page elsewhere that navigated to ``/hub/authorize/eve`` authorized eve
(cross-site request forgery). Here every change is a POST, which JupyterHub
checks for ``_xsrf`` before the handler runs (``BaseHandler.prepare`` with
``xsrf_cookies``), and which a browser sends without the ``SameSite=Lax``
login cookies when another site submits it:

* ``POST /hub/authorize/NAME`` authorizes (``action=unauthorize``: takes
  the authorization back); it sets the state asked for, no toggle: a form
  sent twice, or a page older than another admin's click, does not undo itself.
  Authorizing makes the hub user at once (:func:`make_hub_user`) and forgets
  the name's failed logins (a student who tried before being authorized is
  not locked out by those tries); taking it back leaves the hub user, as before.
* ``POST /hub/discard/NAME`` deletes a sign-up that waits for authorization.
* ``GET`` of either answers 405 with a sentence that points at
  ``/hub/authorize``. No confirmation page: the authorization page is that
  page already (every sign-up, its state, its buttons), and a link that
  arrives from elsewhere is exactly what must not act.
* ``GET /hub/confirm/SLUG`` (from the e-mail, so it must open with a click)
  shows whose sign-up it confirms and a Confirm button; its ``POST`` does
  what NativeAuthenticator's GET did.

The buttons are on our ``authorization-area.html`` (``auth_templates/``,
ahead of NativeAuthenticator's templates in ``template_paths``), which shows
what NativeAuthenticator's shows.
"""

from __future__ import annotations

from jupyterhub.utils import maybe_future
from nativeauthenticator.handlers import DiscardHandler as NativeDiscardHandler
from nativeauthenticator.handlers import EmailAuthorizationHandler as NativeEmailAuthorizationHandler
from nativeauthenticator.handlers import ToggleAuthorizationHandler as NativeToggleAuthorizationHandler
from nativeauthenticator.handlers import admin_users_scope
from nativeauthenticator.orm import UserInfo
from tornado import web
from tornado.escape import url_escape

ACTIONS = {"authorize": True, "unauthorize": False}


async def make_hub_user(handler, name: str) -> None:
    """Create the hub user of an authorized sign-up, as the hub's own user API does."""
    if handler.find_user(name) is not None:
        return
    user = handler.user_from_username(name)  # creates the orm.User, with the default roles
    await maybe_future(handler.authenticator.add_user(user))
    handler.log.info("Authorized sign-up %s is now a hub user (quotas can be set before the first login)", name)


def is_authorized(db, name: str) -> bool:
    info = UserInfo.find(db, name)
    return bool(info is not None and info.is_authorized)


def forget_failed_logins(authenticator, name: str) -> None:
    """A newly authorized name starts with no failed logins (its tries while it waited counted as failures)."""
    attempts = getattr(authenticator, "login_attempts", None)
    if attempts is not None:
        attempts.pop(name, None)


async def grant(handler, name: str) -> None:
    """What an authorization gives a name: its hub user, and a clean slate of failed logins."""
    await make_hub_user(handler, name)
    forget_failed_logins(handler.authenticator, name)


def acting(handler) -> str:
    """Who sent an admin's request, for the log: the admin's name, or a token's."""
    return handler.current_user.name if handler.current_user else "an API token"


class PostOnly:
    """A handler whose GET changes nothing: 405 with ``get_refusal`` and ``Allow: POST``."""

    get_refusal = ""

    async def get(self, *args: str) -> None:
        raise web.HTTPError(405, self.get_refusal)

    def write_error(self, status_code: int, **kwargs) -> None:
        if status_code == 405:
            self.set_header("Allow", "POST")  # type: ignore[attr-defined]
        super().write_error(status_code, **kwargs)  # type: ignore[misc]


class ToggleAuthorizationHandler(PostOnly, NativeToggleAuthorizationHandler):
    """``POST /hub/authorize/NAME``: authorize a sign-up (and make its hub user) or take it back."""

    get_refusal = (
        "A link cannot authorize a sign-up or take an authorization back (it could be followed from "
        "another site): use the Authorize and Unauthorize buttons on the hub's /hub/authorize page."
    )

    @admin_users_scope
    async def post(self, name: str) -> None:
        action = self.get_body_argument("action", "authorize")
        if action not in ACTIONS:
            raise web.HTTPError(400, "Send action=authorize or action=unauthorize with the sign-up's name.")
        info = UserInfo.find(self.db, name)
        if info is None:
            raise web.HTTPError(404, f"No sign-up named {name!r}.")
        wanted = ACTIONS[action]
        if bool(info.is_authorized) != wanted:
            UserInfo.change_authorization(self.db, name)
        if wanted:
            await grant(self, name)
        self.log.info("%s: sign-up %s %s", acting(self), name, "authorized" if wanted else "no longer authorized")
        self.redirect(self.hub.base_url + "authorize#" + url_escape(name, plus=False))


class DiscardHandler(PostOnly, NativeDiscardHandler):
    """``POST /hub/discard/NAME``: delete a sign-up that waits for authorization, as NativeAuthenticator did."""

    get_refusal = (
        "A link cannot discard a sign-up (it could be followed from another site): use the Discard button "
        "on the hub's /hub/authorize page."
    )

    @admin_users_scope
    async def post(self, name: str) -> None:
        info = self.authenticator.get_user(name)
        if info is None:
            raise web.HTTPError(404, f"No sign-up named {name!r}.")
        if info.is_authorized:
            raise web.HTTPError(
                409, f"{name} is authorized: take the authorization back first, then discard the sign-up."
            )
        # NativeAuthenticator's DiscardHandler: its users_info row, then the hub user if there is one.
        self.authenticator.delete_user(type("User", (), {"name": name}))
        if self.users.get(name) is not None:
            self.users.delete(name)
        self.log.info("%s: sign-up %s discarded", acting(self), name)
        self.redirect(self.hub.base_url + "authorize")


class EmailAuthorizationHandler(NativeEmailAuthorizationHandler):
    """``/hub/confirm/SLUG``: the e-mail's link opens a page with a Confirm button; its POST authorizes."""

    async def get(self, slug: str) -> None:
        name = self._signed_name(slug)
        if name is None:
            html = await self.render_template("my_message.html", message="Invalid URL")
        else:
            html = await self.render_template("confirm-sign-up.html", username=name, slug=slug)
        self.finish(html)

    async def post(self, slug: str) -> None:
        name = self._signed_name(slug)
        if name is None:
            self.finish(await self.render_template("my_message.html", message="Invalid URL"))
            return
        # NativeAuthenticator's GET, unchanged (it checks the signature again and renders its answer).
        await NativeEmailAuthorizationHandler.get(self, slug)
        if is_authorized(self.db, name):
            await grant(self, name)

    def _signed_name(self, slug: str) -> str | None:
        """The name a valid, unexpired link was signed for; None when self-approval is off or the link is bad."""
        if not self.authenticator.allow_self_approval_for:
            return None
        try:
            name = self.validate_slug(slug, self.authenticator.secret_key)["username"]
        except (ValueError, KeyError, TypeError):
            return None
        return name if UserInfo.find(self.db, name) is not None else None
