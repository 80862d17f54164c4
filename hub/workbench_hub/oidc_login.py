"""Log in with the university's single sign-on (OpenID Connect): ``WORKBENCH_AUTHENTICATOR=oidc``.

oauthenticator's ``GenericOAuthenticator`` runs the authorization-code flow
(with PKCE) against the provider and reads the user from its userinfo
endpoint. This class adds what a lab needs around it:

* **The provider's own addresses.** oauthenticator 17 has no discovery: it
  needs ``authorize_url``, ``token_url`` and ``userdata_url`` written out.
  Here the operator gives the issuer (``WORKBENCH_OIDC_ISSUER``); at start
  ``login_probe.py`` reads the provider's discovery document, checks that
  the provider calls itself exactly that issuer and that it accepts the
  client's id and secret, and fills in the endpoints (and the logout).
* **Groups from a claim** (``groups_claim``, ``WORKBENCH_OIDC_GROUPS_CLAIM``)
  become the hub's groups at each login (``manage_groups``). A provider
  leaves the claim out for someone in no group (LemonLDAP::NG does): that
  is no groups, where oauthenticator's string key logged an error at each
  such login.
* **The provider down is said, not hidden.** The login page asks the
  provider's discovery document (a few seconds at most, remembered for
  ``provider_check_seconds``) and says in a sentence when it does not
  answer, instead of sending the browser to a page that cannot load; a
  failure during the callback's token exchange answers 503 with the same
  sentence. Servers already running are not touched.
"""

from __future__ import annotations

import time
from typing import Any

from jupyterhub.handlers.login import LoginHandler
from oauthenticator.generic import GenericOAuthenticator
from oauthenticator.oauth2 import OAuthLoginHandler
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.httputil import url_concat
from traitlets import Float, Unicode

from workbench_hub.ldap_login import DirectoryUnavailable

PROVIDER_DOWN = (
    "The university's login service cannot be reached, so no one can log in just now; servers already "
    "running are not affected. Try again in a few minutes, or tell the hub's admins if it lasts."
)


class ProviderLoginPage(LoginHandler):
    """JupyterHub's login page (the "Sign in with ..." button), with a sentence while the provider is down."""

    async def get(self) -> None:
        if self.current_user is None and not await self.authenticator.provider_answers():
            self.set_status(503)
            self.finish(await self._render(login_error=PROVIDER_DOWN))
            return
        await super().get()


class ProviderRedirect(OAuthLoginHandler):
    """oauthenticator's redirect to the provider, which sends the browser back to the login page (and its
    sentence) when the provider does not answer."""

    async def get(self) -> None:
        if not await self.authenticator.provider_answers():
            self.redirect(url_concat(self.settings["login_url"], {"next": self.get_argument("next", "")}))
            return
        super().get()


class WorkbenchOIDCAuthenticator(GenericOAuthenticator):
    """GenericOAuthenticator for an OpenID Connect provider: endpoints from its issuer, groups from a claim
    that may be missing, and a sentence when the provider is down."""

    login_handler = ProviderRedirect

    issuer = Unicode(
        "",
        config=True,
        help="""The provider's issuer URL (``WORKBENCH_OIDC_ISSUER``), exactly as its discovery document
        (``<issuer>/.well-known/openid-configuration``) says it. At start the hub reads that document for
        the endpoints and stops with a sentence when the provider is unreachable or names another
        issuer.""",
    )

    groups_claim = Unicode(
        "groups",
        config=True,
        help="""The userinfo claim that lists the user's groups (``WORKBENCH_OIDC_GROUPS_CLAIM``): a list
        of names, or one name. Missing means no groups (providers leave an empty claim out).""",
    )

    provider_check_seconds = Float(
        5.0,
        config=True,
        help="""How long the login page trusts its last look at the provider's discovery document before
        asking again; a login page shown every second asks at most this often.""",
    )

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._provider_seen: tuple[float, bool] = (0.0, True)

    def get_handlers(self, app: Any) -> list[tuple[str, type]]:
        return [("/login", ProviderLoginPage), *super().get_handlers(app)]

    async def get_user_groups(self, auth_state: dict) -> set[str]:
        claim = (auth_state.get(self.user_auth_state_key) or {}).get(self.groups_claim)
        if claim is None:
            return set()
        if isinstance(claim, str):
            return {claim}
        return {str(group) for group in claim if group}

    async def provider_answers(self) -> bool:
        """Whether the provider's discovery document answered just now (remembered a few seconds)."""
        checked_at, answered = self._provider_seen
        if time.monotonic() - checked_at < self.provider_check_seconds:
            return answered
        url = self.issuer.rstrip("/") + "/.well-known/openid-configuration"
        try:
            await AsyncHTTPClient().fetch(
                HTTPRequest(url, connect_timeout=3, request_timeout=5, **self._tls_arguments())
            )
            answered = True
        except (OSError, HTTPClientError) as exc:
            self.log.error("The login provider at %s did not answer: %s", url, exc)
            answered = False
        self._provider_seen = (time.monotonic(), answered)
        return answered

    def _tls_arguments(self) -> dict[str, Any]:
        ca_certs = self.http_request_kwargs.get("ca_certs")
        return {"ca_certs": ca_certs} if ca_certs else {}

    async def authenticate(self, handler: Any, data: Any = None, **kwargs: Any) -> dict | None:
        """oauthenticator's token exchange and userinfo; a provider that stopped answering is a 503
        with a sentence, not a 500."""
        try:
            return await super().authenticate(handler, data, **kwargs)
        except HTTPClientError as exc:
            if exc.code < 500:
                raise
            self.log.error("The login provider failed during a login: %s", exc)
        except OSError as exc:
            self.log.error("The login provider could not be reached during a login: %s", exc)
        self._provider_seen = (time.monotonic(), False)
        raise DirectoryUnavailable(PROVIDER_DOWN)
