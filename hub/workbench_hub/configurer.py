"""Turn the WORKBENCH_* environment into JupyterHub configuration.

``hub/jupyterhub_config.py`` (and, in the z2jh chart's hub pod, the
Kubernetes backend's ``z2jh.py``) calls these functions and does nothing else
but side effects (directories, the Docker engine, the banner, the local
config file); what runs on the final config, publishing the GPU policy's
settings included, is ``finish.py``. Each ``update_*`` function
manages one area, reads each of its variables exactly once from the ``env``
dict it is given (never from ``os.environ``) and writes plain values into a
traitlets ``Config``; a bad value raises :class:`ConfigError` with one
sentence, which the config file prints as ``GPU Workbench: <sentence>``
before it exits with status 2. In the manner of The Littlest JupyterHub's
``configurer.py``, so that tests can check environment -> config tables
without starting anything::

    c = Config()
    update_spawner(c, {"WORKBENCH_BACKEND": "docker", "WORKBENCH_IMAGE": "x"}, repo, docker_bridge)
    assert c.JupyterHub.spawner_class == "gpu-docker"

HTTPS has its own module (``transport.py``: the certificate or the proxy in
front, and the refusal of plain HTTP off loopback); the start-up banner too
(``banner.py``).

The README's configuration table lists every variable and its default.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

from traitlets.config import Config

from workbench_spawner.backend import HubContext, UnknownBackendError, backend_extension
from workbench_spawner.rules.profiles import ProfileError, parse_profiles, profiles_from_text

from . import login_settings, proxy_env
from .env_values import ConfigError, Env, comma_list, flag, number, port, text
from .service.scopes import ADMIN_SCOPE, READ_SCOPE, SCOPE_DESCRIPTIONS, SELF_SCOPE

# The launcher that ends a managed service when the hub process dies
# (workbench_hub/parent_guard.py explains why it is needed).
GUARD = [sys.executable, "-m", "workbench_hub.parent_guard"]


# -- areas ---------------------------------------------------------------------------


def data_dir(env: Env, repo: Path) -> Path:
    """Where the hub keeps its state: $WORKBENCH_DATA_DIR, else ``data`` in the checkout."""
    return Path(text(env, "WORKBENCH_DATA_DIR") or repo / "data").resolve()


def update_hub(c: Config, env: Env, data: Path, repo: Path) -> None:
    """The public address, the proxy (and the environment it gets) and the hub's own database."""
    public_port = port(env, "WORKBENCH_PORT", "8000")
    ip = text(env, "WORKBENCH_IP", "127.0.0.1")
    host = f"[{ip.strip('[]')}]" if ":" in ip else ip  # an IPv6 address goes in brackets
    c.JupyterHub.bind_url = f"http://{host}:{public_port}"
    c.JupyterHub.hub_port = port(env, "WORKBENCH_HUB_API_PORT", "8081")
    c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{port(env, 'WORKBENCH_PROXY_API_PORT', '8001')}"
    c.JupyterHub.db_url = f"sqlite:///{data / 'jupyterhub.sqlite'}"
    c.JupyterHub.cookie_secret_file = str(data / "jupyterhub_cookie_secret")
    c.ConfigurableHTTPProxy.pid_file = str(data / "jupyterhub-proxy.pid")
    proxy_env.forget_stale_pid_file(data / "jupyterhub-proxy.pid")
    # The proxy gets an allow-list of the environment, not the hub's secrets (proxy_env.py).
    c.ConfigurableHTTPProxy.command = proxy_env.proxy_command(env, repo)
    # Servers outlive the hub: a hub restart (upgrade, config change) must not
    # kill anyone's training run. The hub re-attaches to them on start.
    c.JupyterHub.cleanup_servers = False
    update_named_servers(c, env)


def update_named_servers(c: Config, env: Env) -> None:
    """JupyterHub's named servers (a GPU server for training beside a CPU server for writing), off by default.

    ``WORKBENCH_NAMED_SERVERS=N`` lets each user keep up to N named servers besides the default one
    (JupyterHub's ``named_server_limit_per_user``, which counts named servers only); 0 or unset leaves them
    off. Every server of a user counts against the same GPU quota (``ledger.lease_limits``)."""
    limit = number(env, "WORKBENCH_NAMED_SERVERS", "0", int)
    if limit:
        c.JupyterHub.allow_named_servers = True
        c.JupyterHub.named_server_limit_per_user = limit


AUTHENTICATORS = ("native", "pam", "ldap", "oidc")


def update_auth(c: Config, env: Env) -> None:
    """Who can log in, admins by name.

    ``WORKBENCH_AUTHENTICATOR=native`` (default): NativeAuthenticator sign-ups
    that an admin authorizes. ``pam``: the host's own accounts (JupyterHub's
    PAMAuthenticator), what a Slurm head node needs, since jobs run as the
    hub user's Unix account; ``WORKBENCH_PAM_GROUPS`` limits it to members of
    those Unix groups. ``ldap``: the university's directory; ``oidc``: its
    single sign-on (OpenID Connect); both with groups from the directory
    (``login_settings.py``, docs/login.md).

    With NativeAuthenticator: a name is locked out after
    ``WORKBENCH_LOGIN_ATTEMPTS`` failed logins for
    ``WORKBENCH_LOGIN_LOCKOUT_SECONDS`` (``lockout.py``), and
    ``WORKBENCH_ADMIN_PASSWORD`` gives the admins without an account one at
    start (``first_admin.py``).
    """
    import nativeauthenticator

    from . import lockout

    kind = text(env, "WORKBENCH_AUTHENTICATOR", "native").lower() or "native"
    directory = kind in ("ldap", "oidc")
    # With the university's accounts the default 'admin' could be anyone's name: admins are named or grouped.
    c.Authenticator.admin_users = set(comma_list(env, "WORKBENCH_ADMIN_USERS", "" if directory else "admin"))
    if directory and not c.Authenticator.admin_users and not comma_list(env, "WORKBENCH_ADMIN_GROUPS"):
        raise ConfigError(
            f"WORKBENCH_AUTHENTICATOR={kind} needs the hub's admins named: WORKBENCH_ADMIN_USERS (their "
            "university account names) or WORKBENCH_ADMIN_GROUPS (a directory group); the default 'admin' could "
            "be anyone's account in the directory"
        )
    if kind not in AUTHENTICATORS:
        raise ConfigError(
            f"WORKBENCH_AUTHENTICATOR={kind!r} is not available; use 'native' (sign-up with admin "
            "authorization), 'pam' (this host's Unix accounts), 'ldap' (the university's directory) or 'oidc' "
            "(its single sign-on)"
        )
    if directory:
        if kind == "ldap":
            login_settings.update_ldap(c, env)
            lockout.update_lockout(c, env, section="WorkbenchLDAPAuthenticator")
        else:
            # Where browsers come back after the provider: the public name behind Caddy (WORKBENCH_DOMAIN), else
            # the hub's own address (WORKBENCH_OIDC_CALLBACK_URL sets it where neither is what browsers use).
            domain = text(env, "WORKBENCH_DOMAIN").lower()
            login_settings.update_oidc(c, env, f"https://{domain}" if domain else proxy_url(c))
        if env.get("WORKBENCH_ADMIN_PASSWORD", "").strip():
            raise ConfigError(
                f"WORKBENCH_ADMIN_PASSWORD is for the hub's own accounts; with WORKBENCH_AUTHENTICATOR={kind} "
                "the admins log in with their university accounts: unset it"
            )
    if kind == "pam":
        if not text(env, "WORKBENCH_ADMIN_USERS"):
            raise ConfigError(
                "WORKBENCH_AUTHENTICATOR=pam needs WORKBENCH_ADMIN_USERS set to the Unix accounts "
                "that administer the hub: the default 'admin' could be anyone's account on this host"
            )
        c.JupyterHub.authenticator_class = "pam"
        c.Authenticator.blocked_users = {"root"}  # root's password never opens the hub
        groups = comma_list(env, "WORKBENCH_PAM_GROUPS")
        if groups:
            c.PAMAuthenticator.allowed_groups = set(groups)
        else:
            c.Authenticator.allow_all = True  # every account of the host that PAM accepts
        return
    if text(env, "WORKBENCH_PAM_GROUPS"):
        raise ConfigError(
            "WORKBENCH_PAM_GROUPS is set but WORKBENCH_AUTHENTICATOR is not 'pam'; set "
            "WORKBENCH_AUTHENTICATOR=pam or unset WORKBENCH_PAM_GROUPS"
        )
    if directory:
        return
    c.JupyterHub.authenticator_class = "workbench_hub.auth.WorkbenchAuthenticator"
    # Our authorization page (buttons that POST, sign_up_approval.py) ahead of NativeAuthenticator's pages.
    c.JupyterHub.template_paths = [
        str(Path(__file__).with_name("auth_templates")),
        str(Path(nativeauthenticator.__file__).parent / "templates"),
    ]
    # NativeAuthenticator itself refuses sign-ups an admin has not authorized;
    # every authorized account may use the hub.
    c.Authenticator.allow_all = True
    c.NativeAuthenticator.minimum_password_length = 8
    c.NativeAuthenticator.check_common_password = True
    # Lock-out after failed logins, on by default (lockout.py).
    lockout.update_lockout(c, env)
    # The admins' accounts made at start (first_admin.py); read raw: a password's spaces are its own.
    password = env.get("WORKBENCH_ADMIN_PASSWORD", "")
    if password.strip():
        c.WorkbenchAuthenticator.admin_password = password


def _token_service(c: Config, env: Env, variable: str, name: str, role: dict) -> bool:
    """Register the API token in ``variable`` (if set) as service ``name`` with ``role``."""
    token = text(env, variable)
    if not token:
        return False
    if len(token) < 16:
        raise ConfigError(f"{variable} must be at least 16 characters (try: openssl rand -hex 32)")
    c.JupyterHub.services.append({"name": name, "api_token": token})
    c.JupyterHub.load_roles.append({**role, "services": [name]})
    return True


def guarded(command: list[str], hub_pid: int | None = None) -> list[str]:
    """``command`` behind the launcher that ends it when the hub process dies."""
    parent = [f"--parent-pid={hub_pid}"] if hub_pid else []
    return [*GUARD, *parent, "--", *command]


def proxy_url(c: Config) -> str:
    """The public proxy's address as this machine reaches it (a wildcard bind address becomes loopback)."""
    bind = urlparse(c.JupyterHub.bind_url if "bind_url" in c.JupyterHub else "http://:8000")
    host = bind.hostname or ""
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    host = f"[{host}]" if ":" in host else host
    return f"{bind.scheme or 'http'}://{host}:{bind.port or 8000}"


def update_idle(mixin, env: Env) -> None:
    """Idle-GPU reclaim: WORKBENCH_GPU_IDLE_MINUTES (0 = off), its threshold and warning lead."""
    from workbench_spawner.rules.idle import MAX_IDLE_MINUTES, MIN_IDLE_MINUTES

    minutes = number(env, "WORKBENCH_GPU_IDLE_MINUTES", "0")
    if minutes and not (math.isfinite(minutes) and MIN_IDLE_MINUTES <= minutes <= MAX_IDLE_MINUTES):
        raise ConfigError(
            f"WORKBENCH_GPU_IDLE_MINUTES must be 0 (off) or between {MIN_IDLE_MINUTES:g} and "
            f"{MAX_IDLE_MINUTES:g} minutes, not {text(env, 'WORKBENCH_GPU_IDLE_MINUTES')!r}"
        )
    threshold = number(env, "WORKBENCH_GPU_IDLE_THRESHOLD", "5")
    if not (math.isfinite(threshold) and 0 < threshold <= 100):
        raise ConfigError(
            "WORKBENCH_GPU_IDLE_THRESHOLD must be a percentage above 0 and at most 100, "
            f"not {text(env, 'WORKBENCH_GPU_IDLE_THRESHOLD')!r}"
        )
    warn = number(env, "WORKBENCH_GPU_IDLE_WARN_MINUTES", "10")
    if not math.isfinite(warn):
        raise ConfigError(
            f"WORKBENCH_GPU_IDLE_WARN_MINUTES must be a number of minutes, not "
            f"{text(env, 'WORKBENCH_GPU_IDLE_WARN_MINUTES')!r}"
        )
    mixin.gpu_idle_minutes = float(minutes)
    mixin.gpu_idle_threshold = float(threshold)
    mixin.gpu_idle_warn_minutes = float(warn)
    urls = dcgm_exporter_urls(env)
    if urls:
        mixin.dcgm_exporter_urls = urls


def dcgm_exporter_urls(env: Env) -> list[str]:
    """``WORKBENCH_DCGM_EXPORTER_URL``: the dcgm-exporters' /metrics URLs (comma-separated), where idle
    reclaim reads MIG slices' utilization; a bare ``host:port`` gets ``http://`` and ``/metrics``."""
    urls = []
    for item in comma_list(env, "WORKBENCH_DCGM_EXPORTER_URL"):
        url = item if "://" in item else f"http://{item}"
        parsed = urlparse(url)
        try:
            parsed.port  # noqa: B018 - raises ValueError for a port that is not a number
        except ValueError:
            parsed = parsed._replace(netloc="")
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ConfigError(
                f"WORKBENCH_DCGM_EXPORTER_URL: cannot read {item[:80]!r}; write dcgm-exporter's metrics URL, "
                "e.g. http://gpu-node-1:9400/metrics (several: comma-separated)"
            )
        urls.append(url if parsed.path not in ("", "/") else url.rstrip("/") + "/metrics")
    return urls


def update_services(c: Config, env: Env, hub_pid: int | None = None) -> None:
    """Custom scopes, the automation tokens, the idle culler and the workbench service.

    The workbench service gets its database URL later, from
    :func:`point_service_at_settings`, once the GPU policy's settings are
    resolved (after the local config file).
    """
    c.JupyterHub.services = []
    c.JupyterHub.load_roles = []
    admin_users = sorted(c.Authenticator.admin_users) if "admin_users" in c.Authenticator else []

    automation = _token_service(
        c,
        env,
        "WORKBENCH_ADMIN_TOKEN",
        "workbench-admin",
        {
            "name": "workbench-automation",
            "description": "Scripts that manage users, groups and servers (WORKBENCH_ADMIN_TOKEN)",
            "scopes": ["admin:users", "admin:servers", "admin:groups", "access:servers", "read:hub", "tokens"],
        },
    )

    cull_after = number(env, "WORKBENCH_CULL_IDLE_SECONDS", "3600", int)
    if cull_after:
        # Idle servers give their GPUs back: the culler stops them through the
        # REST API, which runs the spawner's stop() and so releases the lease.
        c.JupyterHub.services.append(
            {
                "name": "idle-culler",
                "command": guarded(
                    [sys.executable, "-m", "jupyterhub_idle_culler", f"--timeout={cull_after}"], hub_pid
                ),
            }
        )
        c.JupyterHub.load_roles.append(
            {
                "name": "idle-culler",
                "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
                "services": ["idle-culler"],
            }
        )

    # The workbench service: GPU quotas, the fleet view, My GPUs and Prometheus
    # metrics at /services/workbench/ (hub/workbench_hub/service). It checks
    # the custom scopes below itself on every request (service/scopes.py):
    # custom:workbench:admin reads and changes quotas, custom:workbench:read
    # reads everyone's data, custom:workbench:self a user's own (quota,
    # GPU-hours, servers, past stops). It reads the policy's settings from the
    # GPU database, so it gets no WORKBENCH_* environment.
    service_port = number(env, "WORKBENCH_SERVICE_PORT", "10101", int)
    session_check = number(env, "WORKBENCH_SESSION_CHECK_SECONDS", "60")
    # Idle-GPU reclaim and notice delivery (service/gpu_reclaim.py); the proxy is how it reaches user servers.
    idle_check = number(env, "WORKBENCH_GPU_IDLE_CHECK_SECONDS", "30")
    c.JupyterHub.custom_scopes = {scope: {"description": text} for scope, text in SCOPE_DESCRIPTIONS.items()}
    c.JupyterHub.services.append(
        {
            "name": "workbench",
            "url": f"http://127.0.0.1:{service_port}",
            "command": guarded(
                [
                    sys.executable,
                    "-m",
                    "workbench_hub.service",
                    f"--port={service_port}",
                    f"--session-check-seconds={session_check}",
                    f"--idle-check-seconds={idle_check}",
                    f"--reservation-check-seconds={number(env, 'WORKBENCH_RESERVATION_CHECK_SECONDS', '15')}",
                    f"--save-wait-seconds={number(env, 'WORKBENCH_SAVE_WAIT_SECONDS', '20')}",
                    f"--proxy-url={proxy_url(c)}",
                ],
                hub_pid,
            ),
            "oauth_no_confirm": True,
            # What a browser login to the service may carry: each user's OAuth token gets those of these
            # they hold (a student: custom:workbench:self, so My GPUs opens; an admin: all three).
            "oauth_client_allowed_scopes": [ADMIN_SCOPE, READ_SCOPE, SELF_SCOPE],
        }
    )
    groups_from = login_settings.groups_source(c)
    if groups_from:
        # The admin page says where groups come from when the login manages them (login_settings.py).
        c.JupyterHub.services[-1]["environment"] = {"WORKBENCH_GROUPS_FROM": groups_from}
    if c.JupyterHub.get("authenticator_class") == "workbench_hub.auth.WorkbenchAuthenticator":
        # Accounts are sign-ups: a course's roster gives each new student a one-time sign-up link (invite_book.py).
        service = c.JupyterHub.services[-1]
        service["environment"] = {**service.get("environment", {}), "WORKBENCH_SIGN_UPS": "1"}
    # JupyterHub's default role of every user, plus the workbench's: their own data on the service and the
    # right to open it in the browser (without access:services the hub's OAuth refuses a student the service).
    c.JupyterHub.load_roles.append(
        {
            "name": "user",
            "description": "Every user: their own servers and tokens, and their own GPUs on the workbench service",
            "scopes": ["self", SELF_SCOPE, "access:services!service=workbench"],
        }
    )
    c.JupyterHub.load_roles.append(
        {
            "name": "workbench-service",
            "description": "What the workbench service reads from the hub, stopping over-long sessions and idle "
            "GPUs, reaching user servers' GPU monitors (readings, notices), and a course roster's accounts and "
            "group members",
            "scopes": [
                "list:users",
                "read:users",
                "list:groups",
                "read:groups",
                "read:servers",
                "delete:servers",
                "access:servers",
                # A course's roster (roster_handlers.py): the hub users it names, its group and members.
                "admin:users",
                "admin:groups",
            ],
            "services": ["workbench"],
        }
    )
    c.JupyterHub.load_roles.append(
        {
            "name": "workbench-admins",
            "description": "GPU quota admins: the hub admins (WORKBENCH_ADMIN_USERS) and the automation token",
            "scopes": ["custom:workbench:admin", "custom:workbench:read", "access:services!service=workbench"],
            "users": admin_users,
            "services": ["workbench-admin"] if automation else [],
        }
    )
    # Prometheus scrapes /services/workbench/metrics with this token (read only).
    _token_service(
        c,
        env,
        "WORKBENCH_METRICS_TOKEN",
        "workbench-metrics",
        {
            "name": "workbench-metrics",
            "description": "Prometheus: read the fleet metrics of the workbench service",
            "scopes": ["custom:workbench:read", "access:services!service=workbench"],
        },
    )


def point_service_at_settings(c: Config, db_url: str, backend: str = "") -> None:
    """Give the workbench service the GPU database its settings were published to, and the backend.

    Called after the local config file, so a ``gpu_db_url`` set only there
    counts; the service reads everything else from that database. The URL
    goes in the service's environment (``WORKBENCH_DB_URL``), never on its
    command line: any account on the host can read a command line
    (``ps``), and a PostgreSQL URL carries a password. The backend (the
    ``workbench.backends`` name the spawner class declares) decides which
    backend routes the service adds.
    """
    for service in c.JupyterHub.services:
        if service.get("name") == "workbench" and service.get("command"):
            command = [arg for arg in service["command"] if not arg.startswith(("--db-url=", "--backend="))]
            at = next(i for i, arg in enumerate(command) if arg.startswith("--port=")) + 1
            extra = [f"--backend={backend}"] if backend else []
            service["command"] = [*command[:at], *extra, *command[at:]]
            service["environment"] = {**service.get("environment", {}), "WORKBENCH_DB_URL": db_url}


def update_fairness(mixin, env: Env) -> None:
    """The wait list's order, the reservations' time zone, and the opt-in test clock (queue_order.py, clock.py)."""
    from workbench_spawner.policy.clock import ClockError, zone
    from workbench_spawner.rules.queue_order import QueueOrderError, parse_queue_order

    try:
        mixin.gpu_queue_order = parse_queue_order(env.get("WORKBENCH_QUEUE_ORDER"))
    except QueueOrderError as exc:
        raise ConfigError(str(exc)) from None
    mixin.gpu_queue_aging_minutes = number(env, "WORKBENCH_QUEUE_AGING_MINUTES", "30")
    if text(env, "WORKBENCH_TIME_ZONE"):
        try:
            zone(text(env, "WORKBENCH_TIME_ZONE"))
        except ClockError as exc:
            raise ConfigError(str(exc)) from None
        mixin.gpu_time_zone = text(env, "WORKBENCH_TIME_ZONE")
    if text(env, "WORKBENCH_TEST_CLOCK_FILE"):
        mixin.gpu_test_clock_file = text(env, "WORKBENCH_TEST_CLOCK_FILE")


def servers_per_gpu(value: str) -> tuple[int, dict[str, int]]:
    """``WORKBENCH_SERVERS_PER_GPU``: ``4`` for every GPU, or ``1,T4-16GB=4,GPU-5f3c…=2``: a default
    (0 reads as 1) and the GPUs (a model, a MIG profile or one device's UUID) that differ from it."""
    default = 1
    per_device: dict[str, int] = {}
    for item in (part.strip() for part in value.split(",")):
        if "=" not in item:
            default = max(1, number({"WORKBENCH_SERVERS_PER_GPU": item}, "WORKBENCH_SERVERS_PER_GPU", "1", int))
            continue
        key, _, count = (part.strip() for part in item.rpartition("="))
        if not key or not count.isdigit() or int(count) < 1:
            raise ConfigError(
                f"WORKBENCH_SERVERS_PER_GPU: cannot read {item[:60]!r}; for some GPUs write MODEL=N, PROFILE=N "
                "or UUID=N with N at least 1, after the default for all: e.g. 1,T4-16GB=4"
            )
        same = next((k for k in per_device if k.lower() == key.lower()), None)
        if same is not None:
            twice = f"{key!r} twice" if same == key else f"{same!r} and {key!r}, the same GPUs whatever the case"
            raise ConfigError(f"WORKBENCH_SERVERS_PER_GPU names {twice}: keep one")
        per_device[key] = int(count)
    return default, per_device


def update_policy(c: Config, env: Env, data: Path) -> None:
    """The GPU policy's settings from ``WORKBENCH_*`` (``GPUSpawnerMixin``), on a host or under z2jh."""
    mixin = c.GPUSpawnerMixin
    mixin.gpu_db_url = text(env, "WORKBENCH_DB_URL") or f"sqlite:///{data / 'workbench.sqlite'}"
    simulated = text(env, "WORKBENCH_SIMULATED_GPUS")
    if simulated:
        mixin.simulated_gpus = simulated
    mixin.gpu_queue_timeout = number(env, "WORKBENCH_QUEUE_TIMEOUT", "300")
    mixin.inventory_refresh_seconds = number(env, "WORKBENCH_INVENTORY_REFRESH_SECONDS", "60")
    mixin.reconcile_seconds = number(env, "WORKBENCH_RECONCILE_SECONDS", "30")
    # A class start (policy/spawn_limits.py): how many may wait, how many servers start at once (0: derived).
    waiting = number(env, "WORKBENCH_MAX_WAITING", "1000", int)
    if waiting < 1:
        raise ConfigError("WORKBENCH_MAX_WAITING must be at least 1: it is how many spawns may wait in line")
    mixin.max_waiting_spawns = waiting
    mixin.max_starting_servers = number(env, "WORKBENCH_MAX_STARTING", "0", int)
    update_fairness(mixin, env)
    mixin.servers_per_gpu, mixin.servers_per_device = servers_per_gpu(text(env, "WORKBENCH_SERVERS_PER_GPU", "1"))
    mixin.default_max_gpus = number(env, "WORKBENCH_DEFAULT_MAX_GPUS", "1", int)
    mixin.cpu_servers_allowed = flag(env, "WORKBENCH_CPU_SERVERS", "1")
    update_idle(mixin, env)
    # The stop box names the culler's timeout; kernels get this long to checkpoint when a server stops.
    mixin.idle_culler_seconds = number(env, "WORKBENCH_CULL_IDLE_SECONDS", "3600", int)
    mixin.kernel_stop_grace = number(env, "WORKBENCH_KERNEL_GRACE", "30")
    contact = text(env, "WORKBENCH_QUOTA_CONTACT")
    if contact:
        mixin.quota_contact = contact
    profiles_text = text(env, "WORKBENCH_PROFILES")
    if profiles_text:
        try:
            profiles = profiles_from_text(profiles_text)
            parse_profiles(profiles)
        except ProfileError as exc:
            raise ConfigError(f"WORKBENCH_PROFILES: {exc}") from None
        mixin.resource_profiles = profiles


def update_spawner(
    c: Config,
    env: Env,
    data: Path,
    repo: Path,
    docker_bridge: Callable[[], str] | None = None,
) -> str:
    """The GPU spawner: backend, how servers reach the hub, the GPU policy's settings.

    The backend's own part comes from its extension (``workbench.backends``
    entry points, ``workbench_spawner/backend.py``): this module names no
    backend. ``docker_bridge`` answers the docker backend's question for the
    Docker default bridge's gateway address (tests pass their own; without
    it the backend asks the engine). Returns the backend name.
    """
    backend = text(env, "WORKBENCH_BACKEND", "local").lower()
    try:
        extension = backend_extension(backend)
    except UnknownBackendError as exc:
        raise ConfigError(str(exc)) from None
    lookups = {"docker_bridge": docker_bridge} if docker_bridge is not None else {}
    extension.configure(c, env, HubContext(data, repo, Path(sys.executable).parent, lookups))
    c.Spawner.default_url = "/lab"

    update_policy(c, env, data)
    return backend
