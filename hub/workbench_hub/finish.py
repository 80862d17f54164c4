"""The end of the hub's config, once every file has been read: one function for every way the hub is configured.

``hub/jupyterhub_config.py`` (a host, the hub image) and the Zero to
JupyterHub chart's last ``hub.extraConfig`` entry
(``workbench_spawner/backends/kubernetes/z2jh.py``) both end the same way, on
the final config (every file, with the command line's options on top):

* the ``_xsrf`` cookie gets the session cookies' ``Secure`` rule (``xsrf_cookie.py``);
* who shuts the hub down through its API is noted for the servers it stops
  (``workbench_spawner/stop_requester.py``);
* the spawner class must keep the backend contract, and the caller may refuse
  it for more (the chart runs only the Kubernetes backend's);
* the backend's own checks (its ``workbench.backends`` extension: the hub never
  imports a backend module) and where SSH forwards may lead; every problem is
  printed and the hub ends with status 2, before a user could spawn into it;
* the backend's additions to the hub (``setup_hub``);
* the spawner class's effective GPU policy settings, published once to the
  GPU database for the workbench service, which is pointed at them;
* the home page's stop boxes and JupyterHub's spawn limit above the GPU line.

Written once here so that a step added for a host cannot be missed under the
chart (the two copies had drifted apart before). What only one caller does
stays with it: the host's transport check and banner, the chart's one-line
summary.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from traitlets.config import Config

from . import class_start, configurer, course_roles, home_page, log_secrets, login_probe, xsrf_cookie

if TYPE_CHECKING:
    from workbench_spawner.mixin import GPUSpawnerMixin
    from workbench_spawner.policy.settings import PolicySettings
    from workbench_spawner.policy.spawn_limits import SpawnLimits


def fail(message: str) -> NoReturn:
    """End the hub with ``GPU Workbench: <sentence>`` and status 2 (a configuration it cannot run with)."""
    print(f"\nGPU Workbench: {message}\n", file=sys.stderr, flush=True)
    raise SystemExit(2)


def final_config(c: Config) -> Config:
    """``c`` with the command line's options on top, as the hub will apply them.

    ``c`` alone lacks the command line's options (traitlets merges them after
    the files are read); the running JupyterHub has them parsed already.
    """
    from jupyterhub.app import JupyterHub

    final = Config()
    final.merge(c)
    if JupyterHub.initialized():
        final.merge(JupyterHub.instance().cli_config)
    return final


@dataclass(frozen=True)
class Finished:
    """What the caller reports at the end: the spawner class, the published settings, the spawn limits."""

    spawner_class: type
    settings: PolicySettings
    limits: SpawnLimits


def finish_hub(
    c: Config,
    final: Config,
    class_problem: Callable[[type], str] | None = None,
    limits_hint: str = "",
) -> Finished:
    """Check the final config, add the backend's part of the hub and publish the GPU policy's settings.

    ``class_problem(spawner_class)`` may return a sentence that refuses the
    spawner class; ``limits_hint`` follows a spawn-limit warning (where the
    caller's operator sets the limit). Ends the hub (status 2) on any problem.
    """
    from workbench_spawner.backend import UnknownBackendError, backend_extension
    from workbench_spawner.policy.settings import publish_policy_settings, spawner_gpu_class
    from workbench_spawner.ssh_forwarding import ssh_forwarding_problems
    from workbench_spawner.stop_requester import note_shutdown_requests

    # The university's directory or single sign-on answers with these settings, or the hub stops with why
    # (login_probe.py); OpenID Connect's endpoints come from the provider's discovery document.
    try:
        login_probe.check_login_at_start(c, final)
    except login_probe.LoginProbeError as exc:
        fail(str(exc))
    # The _xsrf cookie gets the session cookies' Secure rule (JupyterHub leaves it out; xsrf_cookie.py).
    xsrf_cookie.secure_xsrf_cookie(c, final)
    # Tokens in URLs never reach the hub's log, tornado's warnings and tracebacks included (log_secrets.py).
    log_secrets.install()
    # Who shuts the hub down through its API is told to the students whose servers it stops (stop_requester.py).
    note_shutdown_requests(c)
    try:
        # The spawner class decides (a site's subclass of a backend's spawner keeps every feature of it).
        # A class that passed the backend contract (spawner_gpu_class checks it) is a GPUSpawnerMixin.
        spawner_class: type[GPUSpawnerMixin] = spawner_gpu_class(final)
        problem = class_problem(spawner_class) if class_problem else ""
        if problem:
            fail(problem)
        extension = backend_extension(spawner_class.workbench_backend)
    except (ValueError, UnknownBackendError) as exc:
        fail(str(exc))
    # Where SSH forwards may lead (WORKBENCH_SSH_PERMIT_OPEN), read as the spawner class will read it; then the
    # backend's own checks (docker: the containers' lock-down).
    problems = ssh_forwarding_problems(final, spawner_class) + extension.check(final)
    for problem in problems:
        print(f"\nGPU Workbench: {problem.removeprefix('GPU Workbench: ')}", file=sys.stderr)
    if problems:
        print(file=sys.stderr, flush=True)
        raise SystemExit(2)
    # What the backend adds to the hub (slurm, kubernetes: the start report's route).
    extension.setup_hub(c)
    try:
        # The spawner class's effective traits (the files, the command line, their defaults), stored once in
        # the GPU database for the workbench service.
        settings = publish_policy_settings(final, spawner_class)
    except ValueError as exc:
        fail(str(exc))
    configurer.point_service_at_settings(c, settings.db_url, settings.backend)
    # The home page shows why a server stopped, as the spawn page does (after any template paths set so far).
    home_page.update_home_page(c, settings.db_url)
    # A course roster's one-time sign-up links live in the same database (NativeAuthenticator hubs).
    c.WorkbenchAuthenticator.invite_db_url = settings.db_url
    # Each course's staff see their students in the hub itself (roles scoped to the course's group).
    course_roles.update_course_roles(c, settings.db_url)
    # A class start: JupyterHub's own spawn limit above the GPU line, so students queue instead of getting 429s.
    limits = settings.spawn_limits()
    warning = class_start.update_spawn_limits(c, final, limits)
    if warning:
        print(f"\nGPU Workbench: {warning}{f' ({limits_hint})' if limits_hint else ''}\n", file=sys.stderr)
    return Finished(spawner_class, settings, limits)
