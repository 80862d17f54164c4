"""JupyterHub configuration for GPU Workbench, driven by WORKBENCH_* variables.

`make run` starts the hub with this file; the hub image does too. Everything
an operator is expected to change is an environment variable (see the README
table); anything finer can go in a `jupyterhub_config.local.py` next to this
file, which is loaded last.
"""

import os
import sys
from pathlib import Path

import nativeauthenticator

from workbench_gpu_monitor.devices import DeviceSpecError, discover_devices
from workbench_spawner.profiles import ProfileError, parse_profiles, profiles_from_text

c = get_config()  # noqa: F821  (provided by JupyterHub when it loads this file)

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def env(name: str, default: str = "") -> str:
    return os.environ.get(name, default).strip()


def fail(message: str) -> None:
    print(f"\nGPU Workbench: {message}\n", file=sys.stderr)
    raise SystemExit(2)


def number(name: str, default: str, kind=float):
    text = env(name, default)
    try:
        value = kind(text)
    except ValueError:
        value = -1
    if value < 0:
        fail(f"{name} must be a non-negative {'whole ' if kind is int else ''}number, not {text!r}")
    return value


backend = env("WORKBENCH_BACKEND", "local").lower()
port_text = env("WORKBENCH_PORT", "8000")
if not port_text.isdigit() or not 0 < int(port_text) < 65536:
    fail(f"WORKBENCH_PORT must be a port number, not {port_text!r}")
port = int(port_text)
ip = env("WORKBENCH_IP", "127.0.0.1")
data_dir = Path(env("WORKBENCH_DATA_DIR") or REPO / "data").resolve()
data_dir.mkdir(parents=True, exist_ok=True)
# The spawners read these too: one place decides where state lives.
os.environ["WORKBENCH_DATA_DIR"] = str(data_dir)
admin_users = {u.strip() for u in env("WORKBENCH_ADMIN_USERS", "admin").split(",") if u.strip()}
admin_token = env("WORKBENCH_ADMIN_TOKEN")
simulated = env("WORKBENCH_SIMULATED_GPUS")

# -- the hub and its proxy ---------------------------------------------------
c.JupyterHub.bind_url = f"http://{ip}:{port}"
c.JupyterHub.hub_ip = env("WORKBENCH_HUB_IP", "127.0.0.1")
c.JupyterHub.hub_port = int(env("WORKBENCH_HUB_API_PORT", "8081"))
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{int(env('WORKBENCH_PROXY_API_PORT', '8001'))}"
c.JupyterHub.db_url = f"sqlite:///{data_dir / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(data_dir / "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.pid_file = str(data_dir / "jupyterhub-proxy.pid")
chp = REPO / "node_modules" / ".bin" / "configurable-http-proxy"
if chp.exists():
    c.ConfigurableHTTPProxy.command = [str(chp)]
# Servers outlive the hub: a hub restart (upgrade, config change) must not
# kill anyone's training run. The hub re-attaches to them on start.
c.JupyterHub.cleanup_servers = False

# -- who can log in ------------------------------------------------------------
c.JupyterHub.authenticator_class = "workbench_hub.auth.WorkbenchAuthenticator"
c.JupyterHub.template_paths = [str(Path(nativeauthenticator.__file__).parent / "templates")]
c.Authenticator.admin_users = admin_users
# NativeAuthenticator itself refuses sign-ups an admin has not authorized;
# every authorized account may use the hub.
c.Authenticator.allow_all = True
c.NativeAuthenticator.minimum_password_length = 8
c.NativeAuthenticator.check_common_password = True

# -- custom scopes and automation tokens ---------------------------------------------
roles = []
services = []


def token_service(variable: str, name: str, role: str, description: str, scopes: list[str]) -> str:
    """Register the API token in ``variable`` (if set) as service ``name`` with ``scopes``."""
    token = env(variable)
    if token:
        if len(token) < 16:
            fail(f"{variable} must be at least 16 characters (try: openssl rand -hex 32)")
        services.append({"name": name, "api_token": token})
        roles.append({"name": role, "description": description, "scopes": scopes, "services": [name]})
    return token


token_service(
    "WORKBENCH_ADMIN_TOKEN", "workbench-admin", "workbench-automation",
    "Scripts that manage users, groups and servers (WORKBENCH_ADMIN_TOKEN)",
    ["admin:users", "admin:servers", "admin:groups", "access:servers", "read:hub", "tokens"],
)

cull_after = number("WORKBENCH_CULL_IDLE_SECONDS", "3600", int)
if cull_after:
    # Idle servers give their GPUs back: the culler stops them through the
    # REST API, which runs the spawner's stop() and so releases the lease.
    services.append(
        {
            "name": "idle-culler",
            "command": [sys.executable, "-m", "jupyterhub_idle_culler", f"--timeout={cull_after}"],
        }
    )
    roles.append(
        {
            "name": "idle-culler",
            "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
            "services": ["idle-culler"],
        }
    )
# -- the workbench service ------------------------------------------------------
# GPU quotas, the fleet view and Prometheus metrics at /services/workbench/
# (hub/workbench_hub/service). It checks the custom scopes below itself on
# every request: custom:workbench:admin reads and changes quotas,
# custom:workbench:read only reads; any user may read their own usage.
service_port = number("WORKBENCH_SERVICE_PORT", "10101", int)
c.GPUSpawnerMixin.default_max_gpus = number("WORKBENCH_DEFAULT_MAX_GPUS", "1", int)
c.GPUSpawnerMixin.cpu_servers_allowed = env("WORKBENCH_CPU_SERVERS", "1").lower() not in ("0", "false", "no")
if env("WORKBENCH_QUOTA_CONTACT"):
    c.GPUSpawnerMixin.quota_contact = env("WORKBENCH_QUOTA_CONTACT")
c.JupyterHub.custom_scopes = {
    "custom:workbench:admin": {"description": "Read and change GPU quotas; see every GPU, lease and user's usage"},
    "custom:workbench:read": {"description": "See every GPU, lease, quota and user's usage on the workbench service"},
}
services.append(
    {
        "name": "workbench",
        "url": f"http://127.0.0.1:{service_port}",
        "command": [sys.executable, "-m", "workbench_hub.service", f"--port={service_port}"],
        "environment": {
            "WORKBENCH_DATA_DIR": str(data_dir),
            "WORKBENCH_DB_URL": env("WORKBENCH_DB_URL"),
            "WORKBENCH_SIMULATED_GPUS": simulated,
            "WORKBENCH_DEFAULT_MAX_GPUS": str(number("WORKBENCH_DEFAULT_MAX_GPUS", "1", int)),
            "WORKBENCH_SERVERS_PER_GPU": str(max(1, number("WORKBENCH_SERVERS_PER_GPU", "1", int))),
            "WORKBENCH_SESSION_CHECK_SECONDS": str(number("WORKBENCH_SESSION_CHECK_SECONDS", "60")),
        },
        "oauth_no_confirm": True,
        "oauth_client_allowed_scopes": ["custom:workbench:admin", "custom:workbench:read"],
    }
)
roles.append(
    {
        "name": "workbench-service",
        "description": "What the workbench service reads from the hub, and stopping over-long sessions",
        "scopes": ["list:users", "read:users", "list:groups", "read:groups", "read:servers", "delete:servers"],
        "services": ["workbench"],
    }
)
roles.append(
    {
        "name": "workbench-admins",
        "description": "GPU quota admins: the hub admins (WORKBENCH_ADMIN_USERS) and the automation token",
        "scopes": ["custom:workbench:admin", "custom:workbench:read", "access:services!service=workbench"],
        "users": sorted(admin_users),
        "services": ["workbench-admin"] if admin_token else [],
    }
)
# Prometheus scrapes /services/workbench/metrics with this token (read only).
token_service(
    "WORKBENCH_METRICS_TOKEN", "workbench-metrics", "workbench-metrics",
    "Prometheus: read the fleet metrics of the workbench service",
    ["custom:workbench:read", "access:services!service=workbench"],
)

c.JupyterHub.services = services
c.JupyterHub.load_roles = roles

# -- the GPU spawner --------------------------------------------------------------
if backend == "local":
    c.JupyterHub.spawner_class = "gpu-local"
    c.Spawner.cmd = [str(BIN / "jupyterhub-singleuser")]
    c.LocalGPUSpawner.starter_notebooks_dir = str(REPO / "notebooks")
elif backend == "docker":
    c.JupyterHub.spawner_class = "gpu-docker"
    if not env("WORKBENCH_IMAGE"):
        fail("the docker backend needs WORKBENCH_IMAGE, the single-user image (e.g. gpu-workbench/singleuser:latest)")
    c.DockerGPUSpawner.image = env("WORKBENCH_IMAGE")
    offered = [i.strip() for i in env("WORKBENCH_IMAGES").split(",") if i.strip()]
    if offered:
        c.DockerGPUSpawner.offered_images = offered
    network = env("WORKBENCH_DOCKER_NETWORK")
    if network:
        # The hub runs in a container on this network (docker compose):
        # user containers join it and are reached by their internal address.
        c.DockerGPUSpawner.network_name = network
        c.DockerGPUSpawner.use_internal_ip = True
        c.JupyterHub.hub_ip = env("WORKBENCH_HUB_IP", "0.0.0.0")
        c.JupyterHub.hub_connect_ip = env("WORKBENCH_HUB_CONNECT_IP", "hub")
    else:
        # The hub runs on the host: containers reach it through the default
        # bridge's gateway address, which is a local address of the host.
        import ipaddress

        import docker

        try:
            ipam = docker.from_env().networks.get("bridge").attrs["IPAM"]["Config"][0]
            # The gateway is the bridge's first address when the engine does not name it.
            bridge = ipam.get("Gateway") or str(next(ipaddress.ip_network(ipam["Subnet"]).hosts()))
        except Exception as exc:
            fail(f"the docker backend cannot reach the Docker engine ({exc}); is dockerd running?")
        c.JupyterHub.hub_ip = env("WORKBENCH_HUB_IP", bridge)
        c.JupyterHub.hub_connect_ip = env("WORKBENCH_HUB_CONNECT_IP", bridge)
    c.DockerGPUSpawner.datasets_volume = env("WORKBENCH_DATASETS_VOLUME", "workbench-datasets")
    if env("WORKBENCH_MEM_LIMIT"):
        c.DockerGPUSpawner.mem_limit = env("WORKBENCH_MEM_LIMIT")
    if env("WORKBENCH_CPU_LIMIT"):
        c.DockerGPUSpawner.cpu_limit = number("WORKBENCH_CPU_LIMIT", "1")
else:
    fail(f"WORKBENCH_BACKEND={backend!r} is not available; use 'local' or 'docker'")
c.Spawner.default_url = "/lab"


c.GPUSpawnerMixin.gpu_queue_timeout = number("WORKBENCH_QUEUE_TIMEOUT", "300")
c.GPUSpawnerMixin.servers_per_gpu = max(1, number("WORKBENCH_SERVERS_PER_GPU", "1", int))
if env("WORKBENCH_PROFILES"):
    try:
        profiles = profiles_from_text(env("WORKBENCH_PROFILES"))
        parse_profiles(profiles)
    except ProfileError as exc:
        fail(f"WORKBENCH_PROFILES: {exc}")
    c.GPUSpawnerMixin.resource_profiles = profiles

try:
    inventory = discover_devices(simulated)
except DeviceSpecError as exc:
    fail(str(exc))

# -- what the operator sees first ------------------------------------------------------
if inventory.source == "simulated":
    gpu_line = f"GPUs: {len(inventory.devices)} SIMULATED ({simulated}); no real hardware is used"
elif inventory.devices:
    gpu_line = f"GPUs: {len(inventory.devices)} found by NVML: " + ", ".join(
        sorted({d.name for d in inventory.devices})
    )
else:
    gpu_line = f"GPUs: none, servers will be CPU only ({inventory.message})"
print(
    "\n".join(
        [
            "",
            "=" * 72,
            f"GPU Workbench ({backend} backend) at http://{'127.0.0.1' if ip in ('0.0.0.0', '') else ip}:{port}/",
            gpu_line,
            f"Data: {data_dir}",
            f"First admin: open http://127.0.0.1:{port}/hub/signup and sign up as "
            f"{' or '.join(sorted(admin_users)) or '(set WORKBENCH_ADMIN_USERS)'}; "
            "admins are authorized at once, other sign-ups wait for an admin at /hub/authorize",
            "=" * 72,
            "",
        ]
    ),
    file=sys.stderr,
    flush=True,
)

local_config = Path(__file__).with_name("jupyterhub_config.local.py")
if local_config.exists():
    load_subconfig(str(local_config))  # noqa: F821
