# GPU Workbench: every user's Jupyter server starts without reaching past loopback.
#
# JupyterLab 4 on its own, with no browser open yet or on the page's first requests:
#   * runs `node .../jupyter_builder/yarn.js config --json` (jlpm) to learn the npm registry, when
#     jupyterlab/labapp.py is imported (get_app_version -> AppOptions.registry -> _yarn_config), and
#     again for each listing of the installed extensions. At a class start (200 servers on one host)
#     that was a node process per server, and servers stopped while in it died with
#     "KeyError: 'registry'" (traitlets' "no value yet", the first exception of that traceback);
#   * the extension manager ("pypi") asks pypi.org for every installed extension's latest version;
#   * /lab/api/news fetches jupyterlab.github.io's feed, /lab/api/update asks pypi.org.
# Users cannot install into the image or the shared environment, and the hosts may have no way out.
# This file turns all of it off; installed extensions are still listed, enabled and disabled.
#
# One file for every backend: `make install` puts it in .venv/etc/jupyter/ (the local backend, and the
# Slurm jobs when WORKBENCH_SLURM_ENV is the repository's .venv), images/singleuser/Dockerfile in the
# image's venv (Docker, Kubernetes); docs/slurm.md says how to put it in a shared Slurm environment.
# It is Python, not a jupyter_server_config.d/*.json, because the jlpm call happens when JupyterLab's
# labapp module is imported, before any setting is read: only code run before that can stop it. The
# server loads this file (sys-prefix config) before it imports its extensions.
# tests/integration/test_no_outbound.py starts a real server with no route out and checks all of this.

import importlib.util as _importlib_util
import json as _json
import logging as _logging
import os as _os
import signal as _signal
import sys as _sys

c = get_config()  # provided by Jupyter when it loads this file

# The extension manager lists what is installed and installs nothing: no PyPI search, no version look-ups.
c.LabApp.extension_manager = "readonly"
# No announcements feed (the page then does not offer it) and no "a newer JupyterLab is available".
c.LabApp.news_url = None
c.LabApp.check_for_updates_class = "jupyterlab.NeverCheckForUpdate"

try:
    from jupyterlab import commands as _lab_commands
except ImportError:  # an environment without JupyterLab: nothing to stop
    _lab_commands = None

if _lab_commands is not None and hasattr(_lab_commands, "_yarn_config"):

    def _no_yarn_config(logger=None):
        """What JupyterLab's _yarn_config answers on a host without Node.js: no yarn or npm settings.

        Its only use is the npm registry for source-extension installs and update checks, which
        the read-only extension manager never makes; JupyterLab then names its default registry."""
        return {"yarn config": {}, "npm config": {}}

    _lab_commands._yarn_config = _no_yarn_config

# Kernels get time to save when the server stops (issue 37): the spawner passes
# WORKBENCH_KERNEL_GRACE (seconds, default 30; 0 = jupyter_client's usual interrupt-first shutdown).
# On a server stop every kernel gets SIGTERM (which runs `workbench_gpu_monitor.on_stop` callbacks)
# and up to that long before SIGKILL; see workbench_gpu_monitor/kernel_grace.py for why the stock
# shutdown (SIGINT first, 5 s in all) cannot do it. A kernel the student shuts down or restarts is
# stopped as before. Not with a kernel gateway, whose kernels this server does not run.

if _importlib_util.find_spec("workbench_gpu_monitor") is not None and not _os.environ.get("JUPYTER_GATEWAY_URL"):
    from workbench_gpu_monitor.kernel_grace import grace_from_env as _grace_from_env

    c.ServerApp.kernel_manager_class = "workbench_gpu_monitor.kernel_grace.GracefulKernelManager"
    c.GracefulKernelManager.stop_grace_seconds = _grace_from_env(_os.environ, _logging.getLogger("ServerApp"))

# Every cookie this server sets says SameSite=Lax (issue 46), as the hub's do (workbench_hub/xsrf_cookie.py):
# JupyterHub's login cookie for this server (jupyterhub-user-NAME) and its OAuth state cookie (HubOAuth's
# cookie_options; JUPYTERHUB_COOKIE_OPTIONS, when a spawner sets it, is read first and wins), and the server's
# _xsrf (tornado's xsrf_cookie_kwargs, on the server's own prefix as jupyter_server puts it when none are given).
# A browser then sends them on a top-level link into the server but not on another site's form, frame or fetch.
_cookie_options = dict(_json.loads(_os.environ.get("JUPYTERHUB_COOKIE_OPTIONS") or "{}"))
_cookie_options.setdefault("samesite", "Lax")
c.HubOAuth.cookie_options = _cookie_options
if _os.environ.get("JUPYTERHUB_SERVICE_PREFIX"):
    _tornado_settings = dict(c.ServerApp.tornado_settings) if "tornado_settings" in c.ServerApp else {}
    _xsrf_cookie = {"path": _os.environ["JUPYTERHUB_SERVICE_PREFIX"], **_tornado_settings.get("xsrf_cookie_kwargs", {})}
    _xsrf_cookie.setdefault("samesite", "Lax")
    c.ServerApp.tornado_settings = {**_tornado_settings, "xsrf_cookie_kwargs": _xsrf_cookie}


if not (_sys.stdin and _sys.stdin.isatty()):
    # JupyterHub's local spawner stops a server with SIGINT first. Without a tty, jupyter_server leaves SIGINT
    # to Python: a KeyboardInterrupt ends the server without shutting its kernels down, so they never get
    # their grace to checkpoint (workbench_gpu_monitor.on_stop). Taken as SIGTERM, the server's own handler
    # stops it as any engine's stop does. (This file runs in the main thread, before the server starts.)
    _signal.signal(_signal.SIGINT, lambda _signum, _frame: _os.kill(_os.getpid(), _signal.SIGTERM))
