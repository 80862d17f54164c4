"""JupyterHub configuration for GPU Workbench, driven by WORKBENCH_* variables.

`make run` starts the hub with this file; the hub image does too. Everything
an operator is expected to change is an environment variable (see the README
table); anything finer can go in a `jupyterhub_config.local.py` next to this
file, which is loaded after the environment's settings.

The environment becomes config in workbench_hub/configurer.py (plain
functions, tested with tables). This file only does what has side effects:
it creates the data directory, loads the local config file, runs the
checks on the final config that plain HTTP is served on loopback only and
that the certificate can be served (the files are read), then ends as the
z2jh chart's hub pod does (``workbench_hub/finish.py``: the backend's checks
and hub set-up through its ``workbench.backends`` extension, as this file
imports no backend module; the ``_xsrf`` cookie's ``Secure`` rule; the GPU
policy's settings published to the GPU database, where the workbench service
reads them) and prints the banner (with the local backend's warning when
more than one person can use the hub).
"""

import os
import sys
from pathlib import Path

from workbench_hub import accounts, banner, configurer, finish, first_admin, hub_db, subdomains, transport
from workbench_hub.configurer import ConfigError

c = get_config()  # provided by JupyterHub when it loads this file (a builtin in ruff's settings)

REPO = Path(__file__).resolve().parent.parent


fail = finish.fail


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
    # Users' servers on their own origins (WORKBENCH_SUBDOMAIN_HOST): host routing, the services' aliases, no
    # login on a user's host (workbench_hub/subdomains.py).
    subdomains.update_subdomains(c, env)
    backend = configurer.update_spawner(c, env, data_dir, REPO)
except ConfigError as exc:
    fail(str(exc))

# WORKBENCH_LOCAL_CONFIG names another local file (tests, several hubs on one checkout).
local_config = Path(env.get("WORKBENCH_LOCAL_CONFIG") or Path(__file__).with_name("jupyterhub_config.local.py"))
if env.get("WORKBENCH_LOCAL_CONFIG") and not local_config.is_file():
    fail(f"WORKBENCH_LOCAL_CONFIG={local_config} is not a file")
if local_config.exists():
    load_subconfig(str(local_config))

# -- after the local config: what is now final ------------------------------------------

# This file's and the local file's settings, with the command line's on top (as the hub will apply them).
final = finish.final_config(c)

try:
    # Plain HTTP only on loopback; the certificate that will be served is usable now.
    served = transport.check_transport(final, env)
except ConfigError as exc:
    fail(str(exc))
# Where other machines reach the hub, its admins need accounts before anyone can sign up under their names: the
# authenticator makes them from WORKBENCH_ADMIN_PASSWORD at start, or stops the hub (workbench_hub/first_admin.py).
first_admin.guard_first_admin(c, final, env)

# The _xsrf cookie's Secure rule, the spawner class's contract, the backend's checks and hub additions (by its
# workbench.backends entry point, never by import), the policy's settings published, the home page and the spawn
# limit: workbench_hub/finish.py, shared with the z2jh chart's hub pod.
finished = finish.finish_hub(c, final)

# Who can use the hub: the local backend warns when more than one person can (workbench_hub/accounts.py).
reach = accounts.who_can_use(final) if backend == "local" else None
print(
    banner.banner(final, backend, data_dir, finished.settings.inventory, served, reach, finished.limits.describe()),
    file=sys.stderr,
    flush=True,
)
