"""NativeAuthenticator, made to work on JupyterHub 6.

NativeAuthenticator 1.3.0 (the newest release) predates JupyterHub 6, whose
handlers no longer carry a ``statsd`` client: its login handler then fails
every sign-in with a 500. This module keeps NativeAuthenticator's sign-up,
authorization and password handling untouched and only supplies what its
login page expects. Drop it when a NativeAuthenticator release supports
JupyterHub 6.
"""

from __future__ import annotations

from nativeauthenticator import NativeAuthenticator
from nativeauthenticator.handlers import LoginHandler as NativeLoginHandler


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


class WorkbenchAuthenticator(NativeAuthenticator):
    """NativeAuthenticator with a login page that runs on JupyterHub 6."""

    def get_handlers(self, app):
        return [
            (path, LoginHandler if handler is NativeLoginHandler else handler)
            for path, handler in super().get_handlers(app)
        ]
