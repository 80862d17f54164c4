"""The Kubernetes backend's part of the hub's config inside the Zero to JupyterHub chart's hub pod.

With the Kubernetes backend deployed by the z2jh chart (``deploy/z2jh/values.yaml``),
the hub pod runs the chart's own ``jupyterhub_config.py``: it reads the chart's
values and owns the proxy (a pod of its own), ``hub_connect_url``, the hub's
ports and bind address, JupyterHub's database, the cookie secret, KubeSpawner's
namespace and image and the user pods' NetworkPolicy. The workbench comes
in last, through two ``hub.extraConfig`` entries that call this module::

    00-workbench:  c.JupyterHub.spawner_class = "gpu-kubernetes"
                   configure_hub(c, get_config, get_name)
    zz-workbench:  finish_hub(c)

The chart runs only this backend, so its glue lives here, beside the
backend's own configuration (``config.py``), and the hub package names no
backend. ``configure_hub`` (first) adds what ``hub/jupyterhub_config.py``
adds on a host, from the same ``WORKBENCH_*`` variables (``hub.extraEnv``)
and with the same ``workbench_hub.configurer`` functions where they fit: the
authenticator (``update_auth``), the workbench service, the automation and
metrics tokens (``update_services``) and the GPU policy's settings
(``update_policy``). What differs in a pod:

* the workbench service listens on every address of the hub pod and the proxy
  pod reaches it through the hub's Service (``hub.service.extraPorts``, and a
  ``hub.networkPolicy.ingress`` rule for the port), not on loopback;
* it reaches user servers through the proxy's Service, not 127.0.0.1;
* the chart's idle culler (``cull.*``) replaces the workbench's own;
* the services and roles of the chart (``hub.services``, ``hub.loadRoles``,
  the culler) are kept beside the workbench's;
* the GPU database lies on the hub's PVC (``/srv/jupyterhub``), or at
  ``WORKBENCH_DB_URL`` when JupyterHub's database is not on that PVC;
* the chart's singleuser NetworkPolicy isolates user servers, so the backend
  makes none of its own (``workbench_network_policy = False``);
* the spawn form replaces KubeSpawner's ``profile_list``, which must stay empty;
* the backend mounts each user's home volume itself, so the chart's
  ``singleuser.storage.type`` must be ``none``;
* named servers are the chart's own ``hub.allowNamedServers`` and
  ``hub.namedServerLimitPerUser``, or ``WORKBENCH_NAMED_SERVERS=N`` in
  ``hub.extraEnv`` as on a host, which wins over them.

``finish_hub`` (last, after any entry of the site's own that sorts between
the two) ends as ``hub/jupyterhub_config.py`` does, with the same function
(``workbench_hub.finish.finish_hub``: the ``_xsrf`` cookie's ``Secure`` rule,
the spawner class's contract, the backend's checks and hub additions,
publishing the GPU policy's settings), and refuses a spawner class of another
backend.

Both print ``GPU Workbench: <sentence>`` and end the hub with status 2 on a
configuration they cannot run with, as ``hub/jupyterhub_config.py`` does.
The ``update_*`` functions here are plain (a ``Config``, an ``env`` dict and
the chart's ``get_config``/``get_name``), tested with tables in
``tests/unit/test_z2jh.py``; this module imports nothing of KubeSpawner.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from traitlets.config import Config

from workbench_hub import configurer, finish, first_admin, subdomains
from workbench_hub.env_values import ConfigError, Env, text
from workbench_hub.finish import fail

# z2jh's helpers, as its jupyterhub_config.py imports them from its z2jh.py:
# get_config("hub.db.type", default) reads the chart's values, get_name("hub") a resource's full name.
GetConfig = Callable[..., Any]
GetName = Callable[[str], str]

# Where the chart mounts the hub's PVC (hub.db.type sqlite-pvc): JupyterHub's database and ours.
HUB_PVC = Path("/srv/jupyterhub")
BACKEND = "kubernetes"
SERVICE = "workbench"
# The chart's default authenticator (hub.config.JupyterHub.authenticator_class): never for a real hub.
CHART_DEFAULT_AUTHENTICATOR = "dummy"
WORKBENCH_AUTHENTICATOR = "workbench_hub.auth.WorkbenchAuthenticator"
# The chart's culler service (cull.enabled).
CHART_CULLER = "jupyterhub-idle-culler"


# -- the two entry points of hub.extraConfig ---------------------------------------------


def configure_hub(c: Config, get_config: GetConfig, get_name: GetName, env: Env | None = None) -> Path:
    """``hub.extraConfig`` ``00-workbench``: the workbench's config from the chart's values and ``WORKBENCH_*``.

    Returns the data directory; ends the hub with a sentence on a bad value.
    """
    env = dict(os.environ if env is None else env)
    try:
        data = update_z2jh(c, env, get_config, get_name, hub_pid=os.getpid())
    except ConfigError as exc:
        fail(str(exc))
    data.mkdir(parents=True, exist_ok=True)
    # The spawners read it too (as under hub/jupyterhub_config.py): one place decides where state lives.
    os.environ["WORKBENCH_DATA_DIR"] = str(data)
    return data


def finish_hub(c: Config) -> None:
    """``hub.extraConfig`` ``zz-workbench``: the hub's shared end on the final config, then one summary line."""
    finished = finish.finish_hub(
        c,
        finish.final_config(c),
        kubernetes_class_problem,
        limits_hint="hub.concurrentSpawnLimit in the chart's values",
    )
    settings, inventory = finished.settings, finished.settings.inventory
    print(
        f"GPU Workbench: {finished.spawner_class.__name__} ({settings.backend} backend, "
        f"{len(inventory.devices)} GPUs: {inventory.message or inventory.source}), "
        f"workbench service at /services/{SERVICE}/; class start: {finished.limits.describe()}",
        file=sys.stderr,
        flush=True,
    )


def kubernetes_class_problem(cls: type) -> str:
    """A sentence when the spawner class is not one of the Kubernetes backend's (or a site's subclass of it)."""
    backend = getattr(cls, "workbench_backend", "")
    if backend != BACKEND:
        return (
            f"c.JupyterHub.spawner_class = {cls.__name__} is the {backend or 'unknown'} backend's; the z2jh "
            "chart runs the Kubernetes backend: gpu-kubernetes (or a subclass of KubernetesGPUSpawner)"
        )
    return ""


# -- areas -------------------------------------------------------------------------------


def update_z2jh(c: Config, env: Env, get_config: GetConfig, get_name: GetName, hub_pid: int | None = None) -> Path:
    """Everything ``configure_hub`` sets, from ``env`` and the chart's values; returns the data directory."""
    backend = text(env, "WORKBENCH_BACKEND", BACKEND).lower() or BACKEND
    if backend != BACKEND:
        raise ConfigError(
            f"WORKBENCH_BACKEND={backend!r} in the z2jh chart's hub pod; the chart runs the Kubernetes backend "
            "(WORKBENCH_BACKEND=kubernetes, or leave it unset)"
        )
    if text(env, "WORKBENCH_IMAGE") or text(env, "WORKBENCH_IMAGES"):
        raise ConfigError(
            "WORKBENCH_IMAGE/WORKBENCH_IMAGES are the docker backend's; under the z2jh chart the user image is "
            "singleuser.image (name, tag) in the chart's values"
        )
    data = data_dir(env, get_config)
    update_chart_auth(c, env, get_config)
    update_chart_services(c, env, get_config, get_name, hub_pid)
    update_chart_spawner(c, env, get_config, data)
    # WORKBENCH_NAMED_SERVERS=N as on a host, over the chart's hub.allowNamedServers/namedServerLimitPerUser
    # (its jupyterhub_config.py set them already); unset or 0 leaves the chart's values as they are.
    configurer.update_named_servers(c, env)
    update_chart_subdomains(c, env, get_config)
    return data


def update_chart_subdomains(c: Config, env: Env, get_config: GetConfig) -> None:
    """Users' servers on their own subdomains (``WORKBENCH_SUBDOMAIN_HOST`` in ``hub.extraEnv``, or the chart's
    ``hub.config.JupyterHub.subdomain_host``), as on a host (``workbench_hub/subdomains.py``).

    The chart's proxy pod is not started by the hub, so it routes by host only
    with ``--host-routing`` in ``proxy.chp.extraCommandLineFlags``; without it
    every user server would answer with the hub's 404. TLS is the chart's
    (``proxy.https``), so the scheme is not compared with it here.
    """
    subdomains.update_subdomains(c, env, scheme=None)
    if "subdomain_host" in c.JupyterHub and c.JupyterHub.subdomain_host:
        flags = [str(flag) for flag in get_config("proxy.chp.extraCommandLineFlags", None) or []]
        if "--host-routing" not in flags:
            raise ConfigError(
                f"users' servers are on subdomains of {c.JupyterHub.subdomain_host} but the chart's proxy pod does "
                "not route by host: add --host-routing to proxy.chp.extraCommandLineFlags"
            )


def data_dir(env: Env, get_config: GetConfig) -> Path:
    """``WORKBENCH_DATA_DIR``, else the hub's PVC; a GPU database that would not survive a restart is refused."""
    db_type = get_config("hub.db.type", "sqlite-pvc")
    if db_type != "sqlite-pvc" and not text(env, "WORKBENCH_DB_URL"):
        raise ConfigError(
            f"hub.db.type is {db_type!r}, so the hub has no PVC at {HUB_PVC} for the GPU database (leases, quotas, "
            "usage); set WORKBENCH_DB_URL in hub.extraEnv (e.g. a database on the same PostgreSQL server)"
        )
    return Path(text(env, "WORKBENCH_DATA_DIR") or HUB_PVC)


def update_chart_auth(c: Config, env: Env, get_config: GetConfig) -> None:
    """NativeAuthenticator, or the university's login (``configurer.update_auth``: ``WORKBENCH_AUTHENTICATOR``
    ``ldap`` or ``oidc``), unless the chart's values name another authenticator.

    ``hub.config.JupyterHub.authenticator_class`` left at the chart's default
    (``dummy``: any password) or set to the workbench's means the workbench's
    sign-up with admin authorization; any other class (GitHub, LDAP, OIDC...)
    is the site's choice, configured under ``hub.config``, and left alone.
    Host accounts (``pam``) do not exist in a pod.
    """
    kind = text(env, "WORKBENCH_AUTHENTICATOR", "native").lower() or "native"
    if kind == "pam":
        raise ConfigError(
            "WORKBENCH_AUTHENTICATOR='pam' cannot be used in the z2jh chart's hub pod, which has no host "
            "accounts; leave it unset (NativeAuthenticator), use 'ldap' or 'oidc' (the university's login), or "
            "set another authenticator in hub.config.JupyterHub.authenticator_class"
        )
    chosen = get_config("hub.config.JupyterHub.authenticator_class")
    if chosen not in (None, "", CHART_DEFAULT_AUTHENTICATOR, WORKBENCH_AUTHENTICATOR):
        return
    if kind in ("ldap", "oidc"):
        # The directory's or the provider's accounts (workbench_hub/login_settings.py); checked at start.
        configurer.update_auth(c, env)
        return
    # The chart's hub.templatePaths stay first: a site's own templates win over NativeAuthenticator's.
    site_templates = list(c.JupyterHub.template_paths) if "template_paths" in c.JupyterHub else []
    configurer.update_auth(c, env)
    c.JupyterHub.template_paths = [*site_templates, *c.JupyterHub.template_paths]
    # Browsers reach the hub through the chart's proxy: the admins' accounts come from WORKBENCH_ADMIN_PASSWORD
    # (a Secret, deploy/z2jh/README.md) unless they exist already (workbench_hub/first_admin.py).
    c.WorkbenchAuthenticator.reached_from = first_admin.CHART_PROXY


def update_chart_services(
    c: Config, env: Env, get_config: GetConfig, get_name: GetName, hub_pid: int | None = None
) -> None:
    """The workbench service and its roles (``configurer.update_services``), made to work across pods.

    The chart's services and roles (its culler, ``hub.services``,
    ``hub.loadRoles``) stay, before the workbench's; the workbench's own
    idle culler is left out when the chart's runs.
    """
    chart_services = list(c.JupyterHub.services) if "services" in c.JupyterHub else []
    chart_roles = list(c.JupyterHub.load_roles) if "load_roles" in c.JupyterHub else []
    chart_culler = any(s.get("name") == CHART_CULLER for s in chart_services)
    configurer.update_services(c, {**env, "WORKBENCH_CULL_IDLE_SECONDS": "0"} if chart_culler else env, hub_pid)
    ours = c.JupyterHub.services
    taken = {s.get("name") for s in chart_services} & {s["name"] for s in ours}
    if taken:
        raise ConfigError(
            f"hub.services names {', '.join(sorted(taken))}, which the workbench registers itself; rename it"
        )
    taken_roles = {r.get("name") for r in chart_roles} & {r["name"] for r in c.JupyterHub.load_roles}
    if taken_roles:
        raise ConfigError(
            f"hub.loadRoles names {', '.join(sorted(taken_roles))}, which the workbench defines itself; rename it"
        )

    service = next(s for s in ours if s["name"] == SERVICE)
    target = urlparse(service["url"]).port
    service_port = hub_service_port(get_config, target)
    service["url"] = f"http://{get_name('hub')}:{service_port}"
    proxy = in_cluster_proxy_url(env, get_config, get_name)
    command = [arg for arg in service["command"] if not arg.startswith(("--proxy-url=", "--ip="))]
    at = next(i for i, arg in enumerate(command) if arg.startswith("--port=")) + 1
    # Every address of the hub pod, IPv4 and IPv6 (as the chart's hub_bind_url "http://:8081"):
    # the proxy pod comes through the hub's Service.
    service["command"] = [*command[:at], "--ip=", f"--proxy-url={proxy}", *command[at:]]
    c.JupyterHub.services = [*chart_services, *ours]
    c.JupyterHub.load_roles = [*chart_roles, *c.JupyterHub.load_roles]


def hub_service_port(get_config: GetConfig, target: int) -> int:
    """The hub Service's port that leads to the workbench service's ``target`` port (``hub.service.extraPorts``).

    The proxy pod routes ``/services/workbench/`` to the hub's Service: without
    that port (and, with the hub's NetworkPolicy on, an ingress rule for it)
    every page and API call of the service would fail at the proxy.
    """
    for entry in get_config("hub.service.extraPorts", None) or []:
        port = entry.get("port")
        if str(entry.get("targetPort", port)) == str(target) and port:
            break
    else:
        raise ConfigError(
            f"the workbench service listens on port {target} (WORKBENCH_SERVICE_PORT) but hub.service.extraPorts "
            f"has no port with targetPort {target}: the proxy could not reach /services/{SERVICE}/"
        )
    if get_config("hub.networkPolicy.enabled", True):
        opened = {
            str(p.get("port"))
            for rule in get_config("hub.networkPolicy.ingress", None) or []
            for p in rule.get("ports") or []
        } | {str(p) for p in get_config("hub.networkPolicy.allowedIngressPorts", None) or []}
        if str(target) not in opened:
            raise ConfigError(
                f"the hub's NetworkPolicy lets nothing in on port {target}, where the workbench service listens; "
                f"add a hub.networkPolicy.ingress rule from the proxy pods for port {target}"
            )
    return int(port)


def in_cluster_proxy_url(env: Env, get_config: GetConfig, get_name: GetName) -> str:
    """How the hub pod reaches the chart's proxy over plain HTTP: the workbench service reaches user servers so.

    ``WORKBENCH_PROXY_URL`` overrides. Otherwise the chart's Services: with
    automatic HTTPS the proxy pod's own ``proxy-http`` Service (``proxy-public``
    leads to the TLS terminator, which redirects plain HTTP), else
    ``proxy-public``'s HTTP port.
    """
    override = text(env, "WORKBENCH_PROXY_URL")
    if override:
        if urlparse(override).scheme not in ("http", "https"):
            raise ConfigError(f"WORKBENCH_PROXY_URL must be an http:// or https:// URL, not {override!r}")
        return override.rstrip("/")
    https = get_config("proxy.https", None) or {}
    on = bool(https.get("enabled"))
    if on and https.get("type") == "letsencrypt" and https.get("hosts"):
        return f"http://{get_name('proxy-http')}:8000"
    if not get_config("proxy.service.disableHttpPort", False):
        return f"http://{get_name('proxy-public')}:80"
    if on and https.get("type") == "offload":
        return f"http://{get_name('proxy-public')}:443"
    raise ConfigError(
        "proxy.service.disableHttpPort is set, so the hub pod has no plain-HTTP way to the proxy; set "
        "WORKBENCH_PROXY_URL (hub.extraEnv) to the URL at which the hub pod reaches the proxy"
    )


def update_chart_spawner(c: Config, env: Env, get_config: GetConfig, data: Path) -> None:
    """The spawn form's defaults and the GPU policy; the chart's KubeSpawner settings stay the chart's."""
    if get_config("singleuser.profileList", None):
        raise ConfigError(
            "singleuser.profileList is set, but the workbench's spawn form replaces KubeSpawner's profile list; "
            "offer CPU and memory sizes as resource_profiles (WORKBENCH_PROFILES, or "
            "hub.config.KubernetesGPUSpawner.resource_profiles) and leave profileList empty"
        )
    storage = get_config("singleuser.storage.type", "dynamic")
    if storage != "none":
        raise ConfigError(
            f"singleuser.storage.type is {storage!r}, but the Kubernetes backend mounts each user's home volume "
            "itself (home_volume_size, KubeSpawner's storage_class): a second volume at the home would make every "
            "pod invalid; set singleuser.storage.type to none"
        )
    if not get_config("singleuser.networkPolicy.enabled", True):
        raise ConfigError(
            "singleuser.networkPolicy.enabled is false: user servers could reach each other and the cluster's "
            "private ranges; the workbench relies on the chart's singleuser NetworkPolicy (docs/security.md)"
        )
    # The chart's NetworkPolicy isolates the user pods: the backend adds none of its own (and needs no RBAC for it).
    c.KubernetesGPUSpawner.workbench_network_policy = False
    if "default_url" not in c.Spawner:  # singleuser.defaultUrl wins
        c.Spawner.default_url = "/lab"
    update_policy(c, env, data)


def update_policy(c: Config, env: Env, data: Path) -> None:
    """The GPU policy's settings from ``WORKBENCH_*``: ``configurer.update_policy``, as on a host.

    ``configurer.update_spawner`` also runs the backend's own configuration
    (on a host: the hub's address, the image, the namespace), which the
    chart owns here. Anything finer: ``hub.config.KubernetesGPUSpawner`` (a
    subclass's section wins over ``GPUSpawnerMixin``'s, as the local config
    file does on a host).
    """
    configurer.update_policy(c, env, data)
