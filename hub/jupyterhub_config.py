"""JupyterHub configuration for GPU Workbench, driven by WORKBENCH_* variables.

`make run` starts the hub with this file; the hub image does too. Everything
an operator is expected to change is an environment variable (see the README
table); anything finer can go in a `jupyterhub_config.local.py` next to this
file, which is loaded after the environment's settings.

The environment becomes config in workbench_hub/configurer.py (plain
functions, tested with tables). This file only does what has side effects:
it creates the data directory, loads the local config file, runs the
backend's checks and hub set-up (its ``workbench.backends`` extension:
this file imports no backend module), checks on the final config that plain
HTTP is served on loopback only and that the certificate can be served (the
files are read), gives the ``_xsrf`` cookie the session cookies' ``Secure``
rule, publishes the GPU policy's settings to the GPU database (where the
workbench service reads them) and prints the banner (with the local
backend's warning when more than one person can use the hub).
"""

import os
import sys
from pathlib import Path

from workbench_hub import accounts, banner, class_start, configurer, home_page, hub_db, transport, xsrf_cookie
from workbench_hub.configurer import ConfigError

c = get_config()  # noqa: F821  (provided by JupyterHub when it loads this file)

REPO = Path(__file__).resolve().parent.parent


def fail(message: str) -> None:
    print(f"\nGPU Workbench: {message}\n", file=sys.stderr)
    raise SystemExit(2)


# JupyterHub's database in WAL mode: its commits on the event loop stop waiting for fsync.
hub_db.tune_sqlite()

env = dict(os.environ)
try:
    data_dir = configurer.data_dir(env, REPO)
    data_dir.mkdir(parents=True, exist_ok=True)
    # The spawners read this too: one place decides where state lives.
    os.environ["WORKBENCH_DATA_DIR"] = str(data_dir)
    configurer.update_hub(c, env, data_dir, REPO)
    transport.update_tls(c, env)
    configurer.update_auth(c, env)
    # Managed services end with this process (workbench_hub/parent_guard.py).
    configurer.update_services(c, env, hub_pid=os.getpid())
    backend = configurer.update_spawner(c, env, data_dir, REPO)
except ConfigError as exc:
    fail(str(exc))

# WORKBENCH_LOCAL_CONFIG names another local file (tests, several hubs on one checkout).
local_config = Path(env.get("WORKBENCH_LOCAL_CONFIG") or Path(__file__).with_name("jupyterhub_config.local.py"))
if env.get("WORKBENCH_LOCAL_CONFIG") and not local_config.is_file():
    fail(f"WORKBENCH_LOCAL_CONFIG={local_config} is not a file")
if local_config.exists():
    load_subconfig(str(local_config))  # noqa: F821

# -- after the local config: what is now final ------------------------------------------


def final_config():
    """This file's and the local file's settings, with the command line's on top (as the hub will apply them).

    ``c`` alone lacks the command line's options (traitlets merges them after
    the files are read); the running JupyterHub has them parsed already.
    """
    from jupyterhub.app import JupyterHub
    from traitlets.config import Config

    final = Config()
    final.merge(c)
    if JupyterHub.initialized():
        final.merge(JupyterHub.instance().cli_config)
    return final


final = final_config()

try:
    # Plain HTTP only on loopback; the certificate that will be served is usable now.
    served = transport.check_transport(final, env)
except ConfigError as exc:
    fail(str(exc))
# The _xsrf cookie gets the session cookies' Secure rule (JupyterHub leaves it out; xsrf_cookie.py).
xsrf_cookie.secure_xsrf_cookie(c, final)

# The backend's own checks on the final config (docker: the containers' lock-down), and what it
# adds to the hub (slurm: the job's start report); by its workbench.backends entry point, never by import.
from workbench_spawner.backend import UnknownBackend, backend_extension  # noqa: E402
from workbench_spawner.policy.settings import publish_policy_settings, spawner_gpu_class  # noqa: E402
from workbench_spawner.ssh_forwarding import ssh_forwarding_problems  # noqa: E402

try:
    # The spawner class decides (a site's subclass of a backend's spawner keeps every feature of it).
    spawner_class = spawner_gpu_class(final)
    extension = backend_extension(spawner_class.workbench_backend)
except (ValueError, UnknownBackend) as exc:
    fail(str(exc))
# Where SSH forwards may lead (WORKBENCH_SSH_PERMIT_OPEN), read as the spawner class will read it.
problems = ssh_forwarding_problems(final, spawner_class) + extension.check(final)
for problem in problems:
    print(f"\nGPU Workbench: {problem.removeprefix('GPU Workbench: ')}", file=sys.stderr)
if problems:
    print(file=sys.stderr)
    raise SystemExit(2)
extension.setup_hub(c)

try:
    # The spawner class's effective traits (these files, the command line,
    # their defaults), stored once in the GPU database for the workbench service.
    settings = publish_policy_settings(final, spawner_class)
except ValueError as exc:
    fail(str(exc))
configurer.point_service_at_settings(c, settings.db_url, settings.backend)
# The home page shows why a server stopped, as the spawn page does (workbench_hub/home_page.py).
home_page.update_home_page(c, settings.db_url)
# A class start: JupyterHub's own spawn limit above the GPU line, so students queue instead of getting 429s.
limits = settings.spawn_limits()
limits_warning = class_start.update_spawn_limits(c, final, limits)
if limits_warning:
    print(f"\nGPU Workbench: {limits_warning}\n", file=sys.stderr)

# Who can use the hub: the local backend warns when more than one person can (workbench_hub/accounts.py).
reach = accounts.who_can_use(final) if backend == "local" else None
print(
    banner.banner(final, backend, data_dir, settings.inventory, served, reach, limits.describe()),
    file=sys.stderr,
    flush=True,
)
