"""Plain JupyterHub 6.1.1 for ``benchmarks/class_start.py``: the baseline hub, not GPU Workbench.

NativeAuthenticator 1.3.0 as it comes, with only what its login page needs to run on JupyterHub 6
at all (the ``statsd`` stand-in and the ``_render`` signature; the same two fixes as
``hub/workbench_hub/auth.py``, and nothing else of that file: no hub users at authorization, no
password check off the event loop). ``SimpleLocalProcessSpawner`` (``LocalProcessSpawner``
without a Unix account per user, as the local backend's spawner is built on) runs
``jupyterhub-singleuser`` with a home under the data dir; a static spawn form, so the form step is
a page of its own as on our hub. ``concurrent_spawn_limit`` is JupyterHub's default unless the
command line sets it (``class_start.py`` sets the GPU count, as the issue did).

Ports, data dir and the admin token come from the ``WORKBENCH_*`` variables that
``tests/conftest.py``'s ``Hub`` sets for every hub it starts, so the same class runs this file.
"""

import os
import sys
from pathlib import Path

import nativeauthenticator
from jupyterhub.spawner import SimpleLocalProcessSpawner
from nativeauthenticator import NativeAuthenticator
from nativeauthenticator.handlers import LoginHandler as NativeLoginHandler

c = get_config()  # provided by JupyterHub when it loads this file

REPO = Path(__file__).resolve().parent.parent
DATA = Path(os.environ["WORKBENCH_DATA_DIR"])


class _NoTimer:
    def start(self):
        return self

    def stop(self, send=True):
        return self


class _NoStats:
    """Stands in for the statsd client JupyterHub 6 dropped (NativeAuthenticator's login times itself)."""

    def timer(self, _name):
        return _NoTimer()


class LoginHandler(NativeLoginHandler):
    statsd = _NoStats()

    def _render(self, login_error=None, username=None, **_ignored):
        # JupyterHub 6 passes keys (sync, status_code, ...) that 1.3.0's _render does not accept.
        return super()._render(login_error=login_error, username=username)


class PlainNativeAuthenticator(NativeAuthenticator):
    """NativeAuthenticator 1.3.0 with the login handler above; everything else its own."""

    def get_handlers(self, app):
        return [
            (path, LoginHandler if handler is NativeLoginHandler else handler)
            for path, handler in super().get_handlers(app)
        ]


c.JupyterHub.bind_url = "http://127.0.0.1:" + os.environ["WORKBENCH_PORT"]
c.JupyterHub.hub_port = int(os.environ["WORKBENCH_HUB_API_PORT"])
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:" + os.environ["WORKBENCH_PROXY_API_PORT"]
c.ConfigurableHTTPProxy.command = [str(REPO / "node_modules" / ".bin" / "configurable-http-proxy")]
c.ConfigurableHTTPProxy.pid_file = str(DATA / "jupyterhub-proxy.pid")
c.JupyterHub.db_url = f"sqlite:///{DATA / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(DATA / "jupyterhub_cookie_secret")
c.JupyterHub.cleanup_servers = False  # the benchmark stops them itself, as on our hub
# The benchmark's admin token (creating users, stopping servers at the end).
c.JupyterHub.services = [{"name": "bench-admin", "api_token": os.environ["WORKBENCH_ADMIN_TOKEN"]}]
c.JupyterHub.load_roles = [
    {"name": "bench-admin", "scopes": ["admin:users", "admin:servers", "tokens"], "services": ["bench-admin"]}
]

c.JupyterHub.authenticator_class = PlainNativeAuthenticator
c.JupyterHub.template_paths = [str(Path(nativeauthenticator.__file__).parent / "templates")]
c.Authenticator.allow_all = True  # every authorized sign-up, as on our hub
c.Authenticator.admin_users = {"admin"}
c.NativeAuthenticator.minimum_password_length = 8
c.NativeAuthenticator.check_common_password = True

c.JupyterHub.spawner_class = SimpleLocalProcessSpawner
c.SimpleLocalProcessSpawner.home_dir_template = str(DATA / "homes" / "{username}")
c.Spawner.cmd = [str(Path(sys.executable).parent / "jupyterhub-singleuser")]
if os.geteuid() == 0:
    # As the local backend does: the server runs as the hub's own user, which Jupyter refuses when root.
    c.Spawner.args = ["--ServerApp.allow_root=True"]
# A static form: one field, no server-side work to render it.
c.Spawner.options_form = """
<label for="plain-note">Note for this server (optional)</label>
<input type="text" class="form-control" id="plain-note" name="note" value="">
"""
