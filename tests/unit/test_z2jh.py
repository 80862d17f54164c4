"""The workbench's glue for the z2jh chart's hub pod (backends/kubernetes/z2jh.py), with tables, without a cluster.

The chart's side is played by a stand-in for its ``z2jh.get_config``/``get_name``
over ``deploy/z2jh/values.yaml`` (the values we ship) with each table's
changes on top, and by the few things the chart's ``jupyterhub_config.py``
sets before ``hub.extraConfig`` runs (its culler service and role, the
``hub.services``/``hub.loadRoles`` entries, template paths, default URL).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from traitlets.config import Config

from workbench_hub import configurer
from workbench_hub.env_values import ConfigError
from workbench_spawner.backends.kubernetes import z2jh

REPO = Path(__file__).resolve().parents[2]
VALUES = REPO / "deploy" / "z2jh" / "values.yaml"
PVC = "/srv/jupyterhub"


def shipped() -> dict:
    return yaml.safe_load(VALUES.read_text())


def shipped_env() -> dict[str, str]:
    """hub.extraEnv's plain values (the Secret's tokens are absent: ``optional: true``)."""
    return {k: v for k, v in shipped()["hub"]["extraEnv"].items() if isinstance(v, str)}


def merge(base: dict, changes: dict) -> dict:
    merged = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


class Chart:
    """z2jh's get_config/get_name over our values (+ changes); resource names with a release prefix."""

    def __init__(self, changes: dict | None = None, prefix: str = "rel-"):
        self.values = merge(shipped(), changes or {})
        self.prefix = prefix

    def get_config(self, key: str, default=None):
        value = self.values
        for level in key.split("."):
            if not isinstance(value, dict) or level not in value:
                return default
            value = value[level]
        return value

    def get_name(self, name: str) -> str:
        return self.prefix + name


CULLER = {"name": "jupyterhub-idle-culler", "command": ["python3", "-m", "jupyterhub_idle_culler"]}
CULLER_ROLE = {"name": "jupyterhub-idle-culler", "scopes": ["list:users"], "services": ["jupyterhub-idle-culler"]}


def chart_config(chart: Chart) -> Config:
    """What the chart's jupyterhub_config.py has set when hub.extraConfig runs (the parts the glue meets)."""
    c = Config()
    c.JupyterHub.services = [CULLER] if chart.get_config("cull.enabled") else []
    c.JupyterHub.load_roles = [CULLER_ROLE] if chart.get_config("cull.enabled") else []
    for key, service in (chart.get_config("hub.services") or {}).items():
        c.JupyterHub.services.append({"name": key, **service})
    for key, role in (chart.get_config("hub.loadRoles") or {}).items():
        c.JupyterHub.load_roles.append({"name": key, **role})
    c.JupyterHub.template_paths = chart.get_config("hub.templatePaths") or []
    for trait, key in (
        ("allow_named_servers", "allowNamedServers"),
        ("named_server_limit_per_user", "namedServerLimitPerUser"),
    ):
        if chart.get_config(f"hub.{key}") is not None:  # the chart's set_config_if_not_none
            setattr(c.JupyterHub, trait, chart.get_config(f"hub.{key}"))
    if chart.get_config("singleuser.defaultUrl"):
        c.Spawner.default_url = chart.get_config("singleuser.defaultUrl")
    return c


def build(env: dict | None = None, changes: dict | None = None) -> tuple[Config, Path]:
    chart = Chart(changes)
    c = chart_config(chart)
    data = z2jh.update_z2jh(c, {**shipped_env(), **(env or {})}, chart.get_config, chart.get_name)
    return c, data


def service(c: Config, name: str) -> dict | None:
    return next((s for s in c.JupyterHub.services if s["name"] == name), None)


def role(c: Config, name: str) -> dict | None:
    return next((r for r in c.JupyterHub.load_roles if r["name"] == name), None)


def option(command: list[str], name: str) -> str | None:
    return next((arg.split("=", 1)[1] for arg in command if arg.startswith(f"--{name}=")), None)


# -- the shipped values ----------------------------------------------------------------------


def test_shipped_values_give_the_workbench_its_place_in_the_chart():
    c, data = build()
    assert data == Path(PVC)
    # login: NativeAuthenticator sign-ups, the admins from WORKBENCH_ADMIN_USERS
    assert c.JupyterHub.authenticator_class == "workbench_hub.auth.WorkbenchAuthenticator"
    assert c.Authenticator.admin_users == {"admin"}
    # the lock-out as shipped, and the admins' accounts made before the chart's proxy lets anyone sign up
    assert c.NativeAuthenticator.allowed_failed_logins == 5
    assert c.NativeAuthenticator.seconds_before_next_try == 300
    assert c.WorkbenchAuthenticator.reached_from == "the z2jh chart's proxy-public Service"
    # the workbench service: in the hub pod, reached through the hub's Service, reaching the proxy's
    workbench = service(c, "workbench")
    assert workbench["url"] == "http://rel-hub:10101"
    assert option(workbench["command"], "ip") == ""
    assert option(workbench["command"], "port") == "10101"
    assert option(workbench["command"], "proxy-url") == "http://rel-proxy-public:80"
    assert workbench["command"].count("--ip=") == 1
    # the chart's culler and role stay, first; the workbench's own culler is left out
    assert c.JupyterHub.services[0] == CULLER
    assert c.JupyterHub.load_roles[0] == CULLER_ROLE
    assert service(c, "idle-culler") is None
    assert role(c, "idle-culler") is None
    assert role(c, "workbench-service")
    assert role(c, "workbench-admins")["users"] == ["admin"]
    # the spawner: the chart's NetworkPolicy, not the backend's; the policy's database on the PVC
    assert c.KubernetesGPUSpawner.workbench_network_policy is False
    assert c.GPUSpawnerMixin.gpu_db_url == f"sqlite:///{PVC}/workbench.sqlite"
    assert c.GPUSpawnerMixin.gpu_queue_timeout == 300.0
    assert c.GPUSpawnerMixin.default_max_gpus == 1
    assert c.Spawner.default_url == "/lab"
    # z2jh's own settings are not the glue's to make
    for owned in ("bind_url", "hub_bind_url", "hub_connect_url", "hub_ip", "hub_port", "db_url", "spawner_class"):
        assert owned not in c.JupyterHub, owned
    assert "ConfigurableHTTPProxy" not in c
    assert "KubeSpawner" not in c


def test_the_shipped_extra_config_runs_as_the_chart_runs_it(monkeypatch, tmp_path):
    """hub.extraConfig's entries exec'd in name order, with the names z2jh's config file has."""
    chart = Chart()
    for name, value in shipped_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WORKBENCH_DATA_DIR", str(tmp_path / "pvc"))
    finished = []
    monkeypatch.setattr(z2jh, "finish_hub", lambda c: finished.append(dict(c.JupyterHub)))
    c = chart_config(chart)
    namespace = {"c": c, "get_config": chart.get_config, "get_name": chart.get_name}
    entries = chart.get_config("hub.extraConfig")
    for key in sorted(entries):
        exec(entries[key], namespace)
    assert c.JupyterHub.spawner_class == "gpu-kubernetes"
    assert (tmp_path / "pvc").is_dir()
    assert service(c, "workbench")["url"] == "http://rel-hub:10101"
    assert len(finished) == 1
    assert finished[0]["spawner_class"] == "gpu-kubernetes"
    assert z2jh.os.environ["WORKBENCH_DATA_DIR"] == str(tmp_path / "pvc")


# -- tables ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "changes", "expected"),
    [
        ({}, {}, "http://rel-proxy-public:80"),
        # automatic HTTPS: proxy-public leads to the TLS terminator; the proxy pod has its own Service
        (
            {},
            {"proxy": {"https": {"enabled": True, "type": "letsencrypt", "hosts": ["gpu.example.org"]}}},
            "http://rel-proxy-http:8000",
        ),
        # letsencrypt without hosts: the chart makes no autohttps pod
        ({}, {"proxy": {"https": {"enabled": True, "type": "letsencrypt", "hosts": []}}}, "http://rel-proxy-public:80"),
        ({}, {"proxy": {"https": {"enabled": True, "type": "manual"}}}, "http://rel-proxy-public:80"),
        (
            {},
            {"proxy": {"https": {"enabled": True, "type": "offload"}, "service": {"disableHttpPort": True}}},
            "http://rel-proxy-public:443",
        ),
        ({"WORKBENCH_PROXY_URL": "http://chp.internal:8000/"}, {}, "http://chp.internal:8000"),
    ],
)
def test_the_service_reaches_user_servers_through_the_proxys_service(env, changes, expected):
    c, _ = build(env, changes)
    assert option(service(c, "workbench")["command"], "proxy-url") == expected


@pytest.mark.parametrize(
    ("env", "changes", "says"),
    [
        ({"WORKBENCH_BACKEND": "docker"}, {}, "WORKBENCH_BACKEND='docker'"),
        ({"WORKBENCH_IMAGE": "gpu-workbench/singleuser:latest"}, {}, "singleuser.image"),
        ({"WORKBENCH_AUTHENTICATOR": "pam"}, {}, "no host accounts"),
        ({}, {"hub": {"db": {"type": "postgres"}}}, "set WORKBENCH_DB_URL"),
        ({}, {"singleuser": {"profileList": [{"display_name": "GPU"}]}}, "singleuser.profileList"),
        ({}, {"singleuser": {"networkPolicy": {"enabled": False}}}, "singleuser.networkPolicy.enabled is false"),
        ({}, {"singleuser": {"storage": {"type": "dynamic"}}}, "singleuser.storage.type is 'dynamic'"),
        ({}, {"hub": {"service": {"extraPorts": []}}}, "hub.service.extraPorts has no port with targetPort 10101"),
        ({"WORKBENCH_SERVICE_PORT": "10102"}, {}, "targetPort 10102"),
        ({}, {"hub": {"networkPolicy": {"ingress": []}}}, "NetworkPolicy lets nothing in on port 10101"),
        ({}, {"proxy": {"service": {"disableHttpPort": True}}}, "set WORKBENCH_PROXY_URL"),
        ({"WORKBENCH_PROXY_URL": "proxy-public"}, {}, "WORKBENCH_PROXY_URL must be an http"),
        ({}, {"hub": {"services": {"workbench": {"url": "http://x"}}}}, "hub.services names workbench"),
        ({}, {"hub": {"loadRoles": {"workbench-service": {"scopes": []}}}}, "hub.loadRoles names workbench-service"),
        ({"WORKBENCH_PROFILES": "small:x:2G"}, {}, "WORKBENCH_PROFILES"),
        ({"WORKBENCH_GPU_IDLE_MINUTES": "99999"}, {}, "WORKBENCH_GPU_IDLE_MINUTES"),
        ({"WORKBENCH_NAMED_SERVERS": "two"}, {}, "WORKBENCH_NAMED_SERVERS must be a non-negative whole number"),
    ],
)
def test_what_the_glue_refuses_with_a_sentence(env, changes, says):
    with pytest.raises(ConfigError) as caught:
        build(env, changes)
    assert says in str(caught.value), str(caught.value)


@pytest.mark.parametrize(
    ("env", "changes", "check"),
    [
        # JupyterHub's database elsewhere: the GPU database goes where WORKBENCH_DB_URL says
        (
            {"WORKBENCH_DB_URL": "postgresql+psycopg://db/gpus"},
            {"hub": {"db": {"type": "postgres"}}},
            lambda c, data: c.GPUSpawnerMixin.gpu_db_url == "postgresql+psycopg://db/gpus",
        ),
        ({"WORKBENCH_DATA_DIR": "/data"}, {}, lambda c, data: data == Path("/data")),
        # a remapped Service port: the proxy goes to the Service's port
        (
            {},
            {"hub": {"service": {"extraPorts": [{"name": "wb", "port": 80, "targetPort": 10101}]}}},
            lambda c, data: service(c, "workbench")["url"] == "http://rel-hub:80",
        ),
        # the port opened by allowedIngressPorts instead of a rule
        (
            {},
            {"hub": {"networkPolicy": {"ingress": [], "allowedIngressPorts": [10101]}}},
            lambda c, data: service(c, "workbench") is not None,
        ),
        ({}, {"hub": {"networkPolicy": {"enabled": False, "ingress": []}}}, lambda c, data: True),
        # no chart culler: the workbench's own runs
        (
            {},
            {"cull": {"enabled": False}},
            lambda c, data: option(service(c, "idle-culler")["command"], "timeout") == "3600",
        ),
        # the chart's services and roles stay beside the workbench's
        (
            {},
            {"hub": {"services": {"grafana": {"url": "http://grafana"}}, "loadRoles": {"viewers": {"scopes": []}}}},
            lambda c, data: service(c, "grafana") and role(c, "viewers") and service(c, "workbench"),
        ),
        # another authenticator configured under hub.config: login left to it
        (
            {},
            {"hub": {"config": {"JupyterHub": {"authenticator_class": "github"}}}},
            lambda c, data: "authenticator_class" not in c.JupyterHub and "admin_users" not in c.Authenticator,
        ),
        # the chart's default (dummy: any password) never stands
        (
            {},
            {"hub": {"config": {"JupyterHub": {"authenticator_class": "dummy"}}}},
            lambda c, data: c.JupyterHub.authenticator_class == "workbench_hub.auth.WorkbenchAuthenticator",
        ),
        # a site's templates stay first, before ours (the authorization page) and NativeAuthenticator's
        (
            {},
            {"hub": {"templatePaths": ["/etc/site-templates"]}},
            lambda c, data: (
                c.JupyterHub.template_paths[0] == "/etc/site-templates"
                and c.JupyterHub.template_paths[1].endswith("workbench_hub/auth_templates")
                and c.JupyterHub.template_paths[2].endswith("nativeauthenticator/templates")
            ),
        ),
        ({}, {"singleuser": {"defaultUrl": "/tree"}}, lambda c, data: c.Spawner.default_url == "/tree"),
        # named servers: off as shipped; the chart's own values, or WORKBENCH_NAMED_SERVERS over them
        ({}, {}, lambda c, data: c.JupyterHub.allow_named_servers is False),
        (
            {},
            {"hub": {"allowNamedServers": True, "namedServerLimitPerUser": 2}},
            lambda c, data: (c.JupyterHub.allow_named_servers, c.JupyterHub.named_server_limit_per_user) == (True, 2),
        ),
        (
            {"WORKBENCH_NAMED_SERVERS": "3"},
            {"hub": {"allowNamedServers": True, "namedServerLimitPerUser": 2}},
            lambda c, data: (c.JupyterHub.allow_named_servers, c.JupyterHub.named_server_limit_per_user) == (True, 3),
        ),
        (
            {"WORKBENCH_NAMED_SERVERS": "3"},
            {},
            lambda c, data: (c.JupyterHub.allow_named_servers, c.JupyterHub.named_server_limit_per_user) == (True, 3),
        ),
        (
            {"WORKBENCH_ADMIN_TOKEN": "a" * 32, "WORKBENCH_METRICS_TOKEN": "b" * 32},
            {},
            lambda c, data: service(c, "workbench-admin") and service(c, "workbench-metrics"),
        ),
        (
            {"WORKBENCH_PROFILES": "small:1:2G,large*:4:16G"},
            {},
            lambda c, data: [p["slug"] for p in c.GPUSpawnerMixin.resource_profiles] == ["small", "large"],
        ),
    ],
)
def test_chart_settings_and_environment_become_config(env, changes, check):
    c, data = build(env, changes)
    assert check(c, data)


# -- the policy's settings are those of a host hub ---------------------------------------------------


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"WORKBENCH_DB_URL": "postgresql+psycopg://db/gpus", "WORKBENCH_QUEUE_TIMEOUT": "30"},
        {"WORKBENCH_SIMULATED_GPUS": "2xH200-141GB", "WORKBENCH_SERVERS_PER_GPU": "3", "WORKBENCH_CPU_SERVERS": "0"},
        {"WORKBENCH_DEFAULT_MAX_GPUS": "4", "WORKBENCH_QUOTA_CONTACT": "gpu-help@example.edu"},
        {
            "WORKBENCH_GPU_IDLE_MINUTES": "30",
            "WORKBENCH_GPU_IDLE_THRESHOLD": "10",
            "WORKBENCH_QUEUE_ORDER": "fair-share",
        },
        {"WORKBENCH_TIME_ZONE": "Europe/Berlin", "WORKBENCH_PROFILES": "small:1:2G,large*:4:16G"},
    ],
)
def test_update_policy_sets_what_update_spawner_sets(monkeypatch, env):
    """``update_policy`` is ``configurer.update_spawner``'s GPU policy part: a new variable there must come here too."""
    from workbench_spawner.backends.local.extension import extension as local

    # update_spawner with the local backend (its own part lands elsewhere: LocalGPUSpawner, hub_ip...).
    monkeypatch.setattr(configurer, "backend_extension", lambda name: local)
    data = Path(PVC)
    host = Config()
    configurer.update_spawner(host, {**env, "WORKBENCH_DATA_DIR": PVC}, data, REPO)
    pod = Config()
    z2jh.update_policy(pod, env, data)
    assert dict(pod.GPUSpawnerMixin) == dict(host.GPUSpawnerMixin)


# -- the two entry points: a sentence and exit status 2 -------------------------------------------


def test_configure_hub_ends_the_hub_with_a_sentence(capsys):
    chart = Chart({"singleuser": {"profileList": [{"display_name": "x"}]}})
    with pytest.raises(SystemExit) as exited:
        z2jh.configure_hub(chart_config(chart), chart.get_config, chart.get_name, env=shipped_env())
    assert exited.value.code == 2
    assert "GPU Workbench: singleuser.profileList is set" in capsys.readouterr().err


def test_finish_hub_refuses_a_spawner_of_another_backend(capsys):
    c = Config()
    c.JupyterHub.spawner_class = "gpu-local"
    with pytest.raises(SystemExit) as exited:
        z2jh.finish_hub(c)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "LocalGPUSpawner is the local backend's" in err
    assert "gpu-kubernetes" in err


@pytest.mark.parametrize(("backend", "refused"), [("kubernetes", False), ("local", True), ("", True)])
def test_only_kubernetes_spawner_classes_run_under_the_chart(backend, refused):
    cls = type("SiteSpawner", (), {"workbench_backend": backend})
    assert bool(z2jh.kubernetes_class_problem(cls)) is refused


def test_the_chart_logs_in_with_the_university_directory_or_single_sign_on():
    ldap, _ = build(
        {
            "WORKBENCH_AUTHENTICATOR": "ldap",
            "WORKBENCH_ADMIN_USERS": "tina",
            "WORKBENCH_ADMIN_PASSWORD": "",
            "WORKBENCH_LDAP_URL": "ldaps://ldap.example.edu",
            "WORKBENCH_LDAP_BIND_TEMPLATE": "uid={username},ou=people,dc=example,dc=edu",
            "WORKBENCH_LDAP_GROUP_BASE": "ou=groups,dc=example,dc=edu",
        }
    )
    assert ldap.JupyterHub.authenticator_class == "workbench_hub.ldap_login.WorkbenchLDAPAuthenticator"
    assert ldap.Authenticator.manage_groups is True
    assert "reached_from" not in ldap.WorkbenchAuthenticator  # NativeAuthenticator's first-admin rule is not asked
    oidc, _ = build(
        {
            "WORKBENCH_AUTHENTICATOR": "oidc",
            "WORKBENCH_ADMIN_GROUPS": "staff",
            "WORKBENCH_ADMIN_PASSWORD": "",
            "WORKBENCH_OIDC_ISSUER": "https://login.example.edu",
            "WORKBENCH_OIDC_CLIENT_ID": "gpu-hub",
            "WORKBENCH_OIDC_CLIENT_SECRET": "s3cret",
            "WORKBENCH_OIDC_CALLBACK_URL": "https://gpu.example.edu/hub/oauth_callback",
        }
    )
    assert oidc.WorkbenchOIDCAuthenticator.oauth_callback_url == "https://gpu.example.edu/hub/oauth_callback"
    workbench = service(oidc, "workbench")
    assert workbench is not None
    assert workbench["environment"]["WORKBENCH_GROUPS_FROM"] == "the university's single sign-on (OpenID Connect)"
