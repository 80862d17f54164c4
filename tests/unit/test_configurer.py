"""The environment -> JupyterHub config tables (workbench_hub.configurer), without starting anything."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from traitlets.config import Config

from workbench_devices import DeviceInventory, GPUDevice
from workbench_hub import banner, class_start, configurer, parent_guard, proxy_env, transport
from workbench_hub.configurer import ConfigError

REPO = Path(__file__).resolve().parents[2]
DATA = Path("/srv/workbench-data")


def bridge() -> str:
    return "172.17.0.1"


def no_bridge() -> str:
    raise AssertionError("the Docker engine was asked although nothing needed it")


def build(env: dict[str, str], repo: Path = REPO, docker_bridge=bridge) -> Config:
    """What jupyterhub_config.py builds from ``env`` (before the local config file)."""
    c = Config()
    data = configurer.data_dir(env, repo)
    configurer.update_hub(c, env, data, repo)
    transport.update_tls(c, env)
    configurer.update_auth(c, env)
    configurer.update_services(c, env)
    configurer.update_spawner(c, env, data, repo, docker_bridge)
    return c


def get(c: Config, dotted: str):
    section, _, name = dotted.rpartition(".")
    node = c
    for part in section.split("."):
        node = node[part]
    return node[name]


def service(c: Config, name: str) -> dict | None:
    return next((s for s in c.JupyterHub.services if s["name"] == name), None)


def role(c: Config, name: str) -> dict | None:
    return next((r for r in c.JupyterHub.load_roles if r["name"] == name), None)


# -- defaults and single settings ---------------------------------------------------------


PAM = {"WORKBENCH_AUTHENTICATOR": "pam", "WORKBENCH_ADMIN_USERS": "ada"}


@pytest.mark.parametrize(
    ("env", "trait", "expected"),
    [
        ({}, "JupyterHub.bind_url", "http://127.0.0.1:8000"),
        ({"WORKBENCH_PORT": "9000", "WORKBENCH_IP": "0.0.0.0"}, "JupyterHub.bind_url", "http://0.0.0.0:9000"),
        ({"WORKBENCH_PORT": " 8443 "}, "JupyterHub.bind_url", "http://127.0.0.1:8443"),
        ({}, "JupyterHub.hub_port", 8081),
        ({"WORKBENCH_HUB_API_PORT": "18081"}, "JupyterHub.hub_port", 18081),
        ({}, "ConfigurableHTTPProxy.api_url", "http://127.0.0.1:8001"),
        ({"WORKBENCH_PROXY_API_PORT": "18001"}, "ConfigurableHTTPProxy.api_url", "http://127.0.0.1:18001"),
        ({"WORKBENCH_DATA_DIR": str(DATA)}, "JupyterHub.db_url", f"sqlite:///{DATA}/jupyterhub.sqlite"),
        ({"WORKBENCH_DATA_DIR": str(DATA)}, "JupyterHub.cookie_secret_file", f"{DATA}/jupyterhub_cookie_secret"),
        ({"WORKBENCH_DATA_DIR": str(DATA)}, "ConfigurableHTTPProxy.pid_file", f"{DATA}/jupyterhub-proxy.pid"),
        ({}, "JupyterHub.db_url", f"sqlite:///{REPO}/data/jupyterhub.sqlite"),
        ({}, "JupyterHub.cleanup_servers", False),
        ({"WORKBENCH_NAMED_SERVERS": "3"}, "JupyterHub.allow_named_servers", True),
        ({"WORKBENCH_NAMED_SERVERS": " 3 "}, "JupyterHub.named_server_limit_per_user", 3),
        # who can log in
        ({}, "JupyterHub.authenticator_class", "workbench_hub.auth.WorkbenchAuthenticator"),
        ({}, "Authenticator.admin_users", {"admin"}),
        ({"WORKBENCH_ADMIN_USERS": "ada, grace,,"}, "Authenticator.admin_users", {"ada", "grace"}),
        ({"WORKBENCH_ADMIN_USERS": ""}, "Authenticator.admin_users", set()),
        ({}, "Authenticator.allow_all", True),
        ({}, "NativeAuthenticator.minimum_password_length", 8),
        (
            {"WORKBENCH_AUTHENTICATOR": "native"},
            "JupyterHub.authenticator_class",
            "workbench_hub.auth.WorkbenchAuthenticator",
        ),
        # a Slurm head node: the host's own accounts, since jobs run as the user's Unix account
        ({**PAM, "WORKBENCH_AUTHENTICATOR": "PAM"}, "JupyterHub.authenticator_class", "pam"),
        (PAM, "Authenticator.allow_all", True),
        (PAM, "Authenticator.admin_users", {"ada"}),
        (PAM, "Authenticator.blocked_users", {"root"}),
        (
            {**PAM, "WORKBENCH_PAM_GROUPS": "gpu-users, staff"},
            "PAMAuthenticator.allowed_groups",
            {"gpu-users", "staff"},
        ),
        # the spawner
        ({}, "JupyterHub.spawner_class", "gpu-local"),
        ({"WORKBENCH_BACKEND": "LOCAL"}, "JupyterHub.spawner_class", "gpu-local"),
        ({}, "JupyterHub.hub_ip", "127.0.0.1"),
        ({"WORKBENCH_HUB_IP": "10.0.0.5"}, "JupyterHub.hub_ip", "10.0.0.5"),
        ({}, "Spawner.cmd", [str(Path(sys.executable).parent / "jupyterhub-singleuser")]),
        ({}, "LocalGPUSpawner.starter_notebooks_dir", str(REPO / "notebooks")),
        ({}, "Spawner.default_url", "/lab"),
        ({"WORKBENCH_DATA_DIR": str(DATA)}, "GPUSpawnerMixin.gpu_db_url", f"sqlite:///{DATA}/workbench.sqlite"),
        (
            {"WORKBENCH_DB_URL": "postgresql+psycopg://db/gpus"},
            "GPUSpawnerMixin.gpu_db_url",
            "postgresql+psycopg://db/gpus",
        ),
        ({"WORKBENCH_SIMULATED_GPUS": "2xH100-80GB"}, "GPUSpawnerMixin.simulated_gpus", "2xH100-80GB"),
        ({}, "GPUSpawnerMixin.gpu_queue_timeout", 300.0),
        ({"WORKBENCH_QUEUE_TIMEOUT": "2.5"}, "GPUSpawnerMixin.gpu_queue_timeout", 2.5),
        ({"WORKBENCH_INVENTORY_REFRESH_SECONDS": "5"}, "GPUSpawnerMixin.inventory_refresh_seconds", 5.0),
        ({}, "GPUSpawnerMixin.inventory_refresh_seconds", 60.0),
        ({}, "GPUSpawnerMixin.reconcile_seconds", 30.0),
        ({"WORKBENCH_RECONCILE_SECONDS": "2"}, "GPUSpawnerMixin.reconcile_seconds", 2.0),
        ({"WORKBENCH_RECONCILE_SECONDS": "0"}, "GPUSpawnerMixin.reconcile_seconds", 0.0),
        ({}, "GPUSpawnerMixin.max_waiting_spawns", 1000),
        ({"WORKBENCH_MAX_WAITING": "500"}, "GPUSpawnerMixin.max_waiting_spawns", 500),
        ({}, "GPUSpawnerMixin.max_starting_servers", 0),
        ({"WORKBENCH_MAX_STARTING": "6"}, "GPUSpawnerMixin.max_starting_servers", 6),
        ({}, "GPUSpawnerMixin.servers_per_gpu", 1),
        ({"WORKBENCH_SERVERS_PER_GPU": "4"}, "GPUSpawnerMixin.servers_per_gpu", 4),
        ({"WORKBENCH_SERVERS_PER_GPU": "0"}, "GPUSpawnerMixin.servers_per_gpu", 1),
        ({}, "GPUSpawnerMixin.default_max_gpus", 1),
        ({"WORKBENCH_DEFAULT_MAX_GPUS": "0"}, "GPUSpawnerMixin.default_max_gpus", 0),
        ({}, "GPUSpawnerMixin.cpu_servers_allowed", True),
        ({"WORKBENCH_CPU_SERVERS": "0"}, "GPUSpawnerMixin.cpu_servers_allowed", False),
        ({"WORKBENCH_CPU_SERVERS": "No"}, "GPUSpawnerMixin.cpu_servers_allowed", False),
        ({"WORKBENCH_CPU_SERVERS": "yes"}, "GPUSpawnerMixin.cpu_servers_allowed", True),
        ({"WORKBENCH_QUOTA_CONTACT": "gpu-help@example.edu"}, "GPUSpawnerMixin.quota_contact", "gpu-help@example.edu"),
    ],
)
def test_environment_becomes_config(env, trait, expected):
    assert get(build(env), trait) == expected


def test_profiles_arrive_as_entries_that_were_checked():
    profiles = build({"WORKBENCH_PROFILES": "small:1:2G,large*:4:16G"}).GPUSpawnerMixin.resource_profiles
    assert [(p["slug"], bool(p.get("default"))) for p in profiles] == [("small", False), ("large", True)]


@pytest.mark.parametrize(
    ("env", "unset"),
    [
        ({}, "GPUSpawnerMixin.simulated_gpus"),  # empty: the trait's own default (NVML)
        ({}, "GPUSpawnerMixin.quota_contact"),
        ({}, "GPUSpawnerMixin.resource_profiles"),
        ({}, "JupyterHub.hub_connect_ip"),
        ({}, "DockerGPUSpawner.image"),
        ({}, "JupyterHub.allow_named_servers"),  # off by default: JupyterHub's own default
        ({"WORKBENCH_NAMED_SERVERS": "0"}, "JupyterHub.allow_named_servers"),
    ],
)
def test_unset_variables_leave_the_traits_defaults(env, unset):
    c = build(env)
    section, _, name = unset.rpartition(".")
    assert name not in c[section]


# -- the docker backend ------------------------------------------------------------------

DOCKER = {"WORKBENCH_BACKEND": "docker", "WORKBENCH_IMAGE": "gpu-workbench/singleuser:latest"}


@pytest.mark.parametrize(
    ("env", "trait", "expected"),
    [
        (DOCKER, "JupyterHub.spawner_class", "gpu-docker"),
        ({"WORKBENCH_BACKEND": "docker", "WORKBENCH_IMAGE": "x"}, "JupyterHub.spawner_class", "gpu-docker"),
        (DOCKER, "DockerGPUSpawner.image", "gpu-workbench/singleuser:latest"),
        ({**DOCKER, "WORKBENCH_IMAGES": "a:1, b:2,"}, "DockerGPUSpawner.offered_images", ["a:1", "b:2"]),
        (DOCKER, "DockerGPUSpawner.datasets_volume", "workbench-datasets"),
        ({**DOCKER, "WORKBENCH_DATASETS_VOLUME": "corpora"}, "DockerGPUSpawner.datasets_volume", "corpora"),
        ({**DOCKER, "WORKBENCH_MEM_LIMIT": "32G"}, "DockerGPUSpawner.mem_limit", "32G"),
        ({**DOCKER, "WORKBENCH_CPU_LIMIT": "8"}, "DockerGPUSpawner.cpu_limit", 8.0),
        # the hub on the host: containers reach it on the default bridge's gateway
        (DOCKER, "JupyterHub.hub_ip", "172.17.0.1"),
        (DOCKER, "JupyterHub.hub_connect_ip", "172.17.0.1"),
        ({**DOCKER, "WORKBENCH_HUB_IP": "0.0.0.0"}, "JupyterHub.hub_ip", "0.0.0.0"),
        ({**DOCKER, "WORKBENCH_HUB_IP": "0.0.0.0"}, "JupyterHub.hub_connect_ip", "172.17.0.1"),
        # the hub in compose: it joins a network per user, as the container it runs in
        ({**DOCKER, "WORKBENCH_DOCKER_NETWORK": "wb"}, "DockerGPUSpawner.hub_container", socket.gethostname()),
        (
            {**DOCKER, "WORKBENCH_DOCKER_NETWORK": "wb", "WORKBENCH_HUB_CONTAINER": "wb-hub-1"},
            "DockerGPUSpawner.hub_container",
            "wb-hub-1",
        ),
        ({**DOCKER}, "DockerGPUSpawner.egress", "internet"),
        ({**DOCKER, "WORKBENCH_USER_EGRESS": "none"}, "DockerGPUSpawner.egress", "none"),
        ({**DOCKER, "WORKBENCH_USER_SUBNETS": "10.50.0.0/20"}, "DockerGPUSpawner.user_subnets", "10.50.0.0/20"),
        ({**DOCKER, "WORKBENCH_DOCKER_NETWORK": "wb"}, "JupyterHub.hub_ip", "0.0.0.0"),
        ({**DOCKER, "WORKBENCH_DOCKER_NETWORK": "wb"}, "JupyterHub.hub_connect_ip", "hub"),
        (
            {**DOCKER, "WORKBENCH_DOCKER_NETWORK": "wb", "WORKBENCH_HUB_CONNECT_IP": "hub.wb"},
            "JupyterHub.hub_connect_ip",
            "hub.wb",
        ),
    ],
)
def test_docker_backend(env, trait, expected):
    assert get(build(env), trait) == expected


@pytest.mark.parametrize(
    "env",
    [
        {**DOCKER, "WORKBENCH_DOCKER_NETWORK": "wb"},
        {**DOCKER, "WORKBENCH_HUB_IP": "10.1.1.1", "WORKBENCH_HUB_CONNECT_IP": "10.1.1.1"},
        {},  # local backend
    ],
)
def test_the_docker_engine_is_asked_only_when_its_bridge_is_needed(env):
    build(env, docker_bridge=no_bridge)


def test_a_docker_engine_that_cannot_be_reached_stops_the_hub():
    def unreachable() -> str:
        raise ConfigError("the docker backend cannot reach the Docker engine (refused); is dockerd running?")

    with pytest.raises(ConfigError, match="is dockerd running"):
        build(DOCKER, docker_bridge=unreachable)


# -- bad values: one sentence each -----------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"WORKBENCH_PORT": "http"}, "WORKBENCH_PORT must be a port number, not 'http'"),
        ({"WORKBENCH_PORT": "0"}, "WORKBENCH_PORT must be a port number, not '0'"),
        ({"WORKBENCH_PORT": "70000"}, "WORKBENCH_PORT must be a port number, not '70000'"),
        ({"WORKBENCH_PORT": ""}, "WORKBENCH_PORT must be a port number, not ''"),
        ({"WORKBENCH_HUB_API_PORT": "x"}, "WORKBENCH_HUB_API_PORT must be a port number, not 'x'"),
        ({"WORKBENCH_PROXY_API_PORT": "-1"}, "WORKBENCH_PROXY_API_PORT must be a port number, not '-1'"),
        (
            {"WORKBENCH_BACKEND": "nomad"},
            "WORKBENCH_BACKEND='nomad' is not an installed backend; use one of: docker, kubernetes, local, slurm",
        ),
        ({"WORKBENCH_BACKEND": "docker"}, "the docker backend needs WORKBENCH_IMAGE, the single-user image"),
        ({"WORKBENCH_BACKEND": "docker", "WORKBENCH_IMAGE": " "}, "the docker backend needs WORKBENCH_IMAGE"),
        (
            {"WORKBENCH_ADMIN_TOKEN": "short"},
            "WORKBENCH_ADMIN_TOKEN must be at least 16 characters (try: openssl rand -hex 32)",
        ),
        ({"WORKBENCH_METRICS_TOKEN": "abc"}, "WORKBENCH_METRICS_TOKEN must be at least 16 characters"),
        (
            {"WORKBENCH_CULL_IDLE_SECONDS": "1h"},
            "WORKBENCH_CULL_IDLE_SECONDS must be a non-negative whole number, not '1h'",
        ),
        (
            {"WORKBENCH_CULL_IDLE_SECONDS": "-5"},
            "WORKBENCH_CULL_IDLE_SECONDS must be a non-negative whole number, not '-5'",
        ),
        ({"WORKBENCH_SERVICE_PORT": "port"}, "WORKBENCH_SERVICE_PORT must be a non-negative whole number, not 'port'"),
        (
            {"WORKBENCH_SESSION_CHECK_SECONDS": "often"},
            "WORKBENCH_SESSION_CHECK_SECONDS must be a non-negative number, not 'often'",
        ),
        ({"WORKBENCH_QUEUE_TIMEOUT": "-1"}, "WORKBENCH_QUEUE_TIMEOUT must be a non-negative number, not '-1'"),
        ({"WORKBENCH_MAX_WAITING": "0"}, "WORKBENCH_MAX_WAITING must be at least 1: it is how many spawns may wait"),
        ({"WORKBENCH_MAX_WAITING": "lots"}, "WORKBENCH_MAX_WAITING must be a non-negative whole number, not 'lots'"),
        ({"WORKBENCH_MAX_STARTING": "-2"}, "WORKBENCH_MAX_STARTING must be a non-negative whole number, not '-2'"),
        ({"WORKBENCH_NAMED_SERVERS": "two"}, "WORKBENCH_NAMED_SERVERS must be a non-negative whole number, not 'two'"),
        (
            {"WORKBENCH_INVENTORY_REFRESH_SECONDS": "soon"},
            "WORKBENCH_INVENTORY_REFRESH_SECONDS must be a non-negative number, not 'soon'",
        ),
        (
            {"WORKBENCH_SERVERS_PER_GPU": "1.5"},
            "WORKBENCH_SERVERS_PER_GPU must be a non-negative whole number, not '1.5'",
        ),
        (
            {"WORKBENCH_DEFAULT_MAX_GPUS": "two"},
            "WORKBENCH_DEFAULT_MAX_GPUS must be a non-negative whole number, not 'two'",
        ),
        (
            {**DOCKER, "WORKBENCH_USER_EGRESS": "off"},
            "WORKBENCH_USER_EGRESS is 'off'; it takes internet (the default) or none",
        ),
        ({**DOCKER, "WORKBENCH_USER_SUBNETS": "lan"}, "WORKBENCH_USER_SUBNETS is 'lan' is not an IPv4 range"),
        ({**DOCKER, "WORKBENCH_USER_SUBNETS": "8.8.0.0/16"}, "is not a private IPv4 range of /28 or larger"),
        ({**DOCKER, "WORKBENCH_USER_SUBNETS": "10.1.2.0/29"}, "is not a private IPv4 range of /28 or larger"),
        ({**DOCKER, "WORKBENCH_CPU_LIMIT": "many"}, "WORKBENCH_CPU_LIMIT must be a non-negative number, not 'many'"),
        (
            {"WORKBENCH_PROFILES": "small:1:2G,big:lots:16G"},
            "WORKBENCH_PROFILES: resource profile 'big': cpu_limit must be a number of cores",
        ),
        ({"WORKBENCH_AUTHENTICATOR": "saml"}, "WORKBENCH_AUTHENTICATOR='saml' is not available; use 'native'"),
        ({"WORKBENCH_AUTHENTICATOR": "pam"}, "WORKBENCH_AUTHENTICATOR=pam needs WORKBENCH_ADMIN_USERS set"),
        ({"WORKBENCH_PAM_GROUPS": "staff"}, "WORKBENCH_PAM_GROUPS is set but WORKBENCH_AUTHENTICATOR is not 'pam'"),
    ],
)
def test_bad_values_raise_one_config_error_with_a_sentence(env, message):
    with pytest.raises(ConfigError) as caught:
        build(env)
    assert message in str(caught.value)


# -- a class start: JupyterHub's spawn limit above the line ---------------------------------------


def test_jupyterhubs_spawn_limit_is_set_above_the_line_unless_a_local_config_sets_it():
    from workbench_spawner.policy.spawn_limits import derive_spawn_limits

    limits = derive_spawn_limits(8, 2)  # 1000 waiting, 4 starting
    c = Config()
    assert class_start.update_spawn_limits(c, Config(), limits) == ""
    assert c.JupyterHub.concurrent_spawn_limit == 1008
    # A local config's own value is kept; one that would refuse students before the line is full is named.
    local = Config()
    local.JupyterHub.concurrent_spawn_limit = 100
    c = Config()
    warning = class_start.update_spawn_limits(c, local, limits)
    assert "concurrent_spawn_limit" not in c.JupyterHub
    assert "concurrent_spawn_limit = 100 is set in the config: past 100 pending spawns" in warning
    local.JupyterHub.concurrent_spawn_limit = 0  # JupyterHub's "no limit"
    assert class_start.update_spawn_limits(Config(), local, limits) == ""
    local.JupyterHub.concurrent_spawn_limit = 5000
    assert class_start.update_spawn_limits(Config(), local, limits) == ""


# -- services --------------------------------------------------------------------------------


def test_the_workbench_service_gets_no_policy_environment_and_runs_behind_the_guard():
    c = Config()
    env = {
        "WORKBENCH_SERVICE_PORT": "10222",
        "WORKBENCH_SESSION_CHECK_SECONDS": "5",
        "WORKBENCH_SIMULATED_GPUS": "2",
        "WORKBENCH_DB_URL": "sqlite:////x.sqlite",
    }
    configurer.update_auth(c, env)
    configurer.update_services(c, env, hub_pid=4242)
    workbench = service(c, "workbench")
    assert workbench["url"] == "http://127.0.0.1:10222"
    # No policy settings: only that the hub's accounts are sign-ups (a course roster's one-time links).
    assert workbench["environment"] == {"WORKBENCH_SIGN_UPS": "1"}
    assert workbench["command"] == [
        sys.executable,
        "-m",
        "workbench_hub.parent_guard",
        "--parent-pid=4242",
        "--",
        sys.executable,
        "-m",
        "workbench_hub.service",
        "--port=10222",
        "--session-check-seconds=5.0",
        "--idle-check-seconds=30.0",
        "--reservation-check-seconds=15.0",
        "--save-wait-seconds=20.0",
        "--proxy-url=http://127.0.0.1:8000",
    ]
    configurer.point_service_at_settings(c, "sqlite:////data/workbench.sqlite")
    # The URL (a PostgreSQL one carries a password) goes in the environment, never on the command line.
    assert workbench["command"][-6:] == [
        "--port=10222",
        "--session-check-seconds=5.0",
        "--idle-check-seconds=30.0",
        "--reservation-check-seconds=15.0",
        "--save-wait-seconds=20.0",
        "--proxy-url=http://127.0.0.1:8000",
    ]
    assert workbench["environment"]["WORKBENCH_DB_URL"] == "sqlite:////data/workbench.sqlite"
    # Publishing again (a config file calling it twice) replaces.
    configurer.point_service_at_settings(c, "sqlite:////other.sqlite")
    assert workbench["environment"]["WORKBENCH_DB_URL"] == "sqlite:////other.sqlite"
    assert not [a for a in workbench["command"] if "sqlite" in a]


@pytest.mark.parametrize(
    ("env", "services", "roles"),
    [
        ({}, ["idle-culler", "workbench"], ["idle-culler", "user", "workbench-service", "workbench-admins"]),
        ({"WORKBENCH_CULL_IDLE_SECONDS": "0"}, ["workbench"], ["user", "workbench-service", "workbench-admins"]),
        (
            {"WORKBENCH_ADMIN_TOKEN": "a" * 32, "WORKBENCH_CULL_IDLE_SECONDS": "0"},
            ["workbench-admin", "workbench"],
            ["workbench-automation", "user", "workbench-service", "workbench-admins"],
        ),
        (
            {"WORKBENCH_METRICS_TOKEN": "m" * 32, "WORKBENCH_CULL_IDLE_SECONDS": "0"},
            ["workbench", "workbench-metrics"],
            ["user", "workbench-service", "workbench-admins", "workbench-metrics"],
        ),
    ],
)
def test_services_and_roles(env, services, roles):
    c = build(env)
    assert [s["name"] for s in c.JupyterHub.services] == services
    assert [r["name"] for r in c.JupyterHub.load_roles] == roles


def test_tokens_and_admin_roles():
    c = build(
        {"WORKBENCH_ADMIN_TOKEN": "a" * 32, "WORKBENCH_METRICS_TOKEN": "m" * 32, "WORKBENCH_ADMIN_USERS": "zoe,ada"}
    )
    assert service(c, "workbench-admin") == {"name": "workbench-admin", "api_token": "a" * 32}
    assert service(c, "workbench-metrics") == {"name": "workbench-metrics", "api_token": "m" * 32}
    assert "admin:users" in role(c, "workbench-automation")["scopes"]
    assert role(c, "workbench-automation")["services"] == ["workbench-admin"]
    admins = role(c, "workbench-admins")
    assert admins["users"] == ["ada", "zoe"]
    assert admins["services"] == ["workbench-admin"]
    assert role(c, "workbench-metrics")["scopes"] == ["custom:workbench:read", "access:services!service=workbench"]
    assert set(c.JupyterHub.custom_scopes) == {
        "custom:workbench:admin",
        "custom:workbench:read",
        "custom:workbench:self",
    }
    assert role(build({}), "workbench-admins")["services"] == []


def test_every_user_may_open_the_service_and_read_their_own_gpus():
    """The hub's default user role, redefined: JupyterHub's own scope (self) plus the workbench's self scope and
    the right to open the service, which the service's OAuth client may then grant a student's browser."""
    c = build({})
    assert role(c, "user")["scopes"] == ["self", "custom:workbench:self", "access:services!service=workbench"]
    assert "users" not in role(c, "user"), "the role of every user: JupyterHub gives it to each"
    assert c.JupyterHub.custom_scopes["custom:workbench:self"]["description"] == (
        "See your own GPU quota, GPU-hours, servers and past stops on the workbench service"
    )
    assert service(c, "workbench")["oauth_client_allowed_scopes"] == [
        "custom:workbench:admin",
        "custom:workbench:read",
        "custom:workbench:self",
    ]


def test_the_idle_culler_runs_behind_the_guard_with_the_timeout():
    culler = service(build({"WORKBENCH_CULL_IDLE_SECONDS": "600"}), "idle-culler")
    assert culler["command"] == [
        sys.executable,
        "-m",
        "workbench_hub.parent_guard",
        "--",
        sys.executable,
        "-m",
        "jupyterhub_idle_culler",
        "--timeout=600",
    ]


def test_the_proxy_from_the_checkout_is_used_when_it_is_installed(tmp_path):
    assert build({}, repo=tmp_path).ConfigurableHTTPProxy.command == [
        *proxy_env.LAUNCHER,
        "--",
        "configurable-http-proxy",
    ]
    chp = tmp_path / "node_modules" / ".bin" / "configurable-http-proxy"
    chp.parent.mkdir(parents=True)
    chp.touch()
    assert build({}, repo=tmp_path).ConfigurableHTTPProxy.command == [*proxy_env.LAUNCHER, "--", str(chp)]


def test_configurer_never_reads_the_process_environment(monkeypatch):
    monkeypatch.setenv("WORKBENCH_BACKEND", "docker")
    monkeypatch.setenv("WORKBENCH_PORT", "not a port")
    assert build({}).JupyterHub.spawner_class == "gpu-local"


# -- HTTPS -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """A test CA's certificate for workbench.test (valid), an expired one, and a key of neither."""
    import datetime as dt

    from tests.https.certs import CA, NOW

    directory = tmp_path_factory.mktemp("certs")
    ca = CA.make()
    good = ca.write(directory, "good", "workbench.test", "127.0.0.1")
    expired = ca.write(
        directory,
        "expired",
        "workbench.test",
        not_before=NOW - dt.timedelta(days=90),
        not_after=NOW - dt.timedelta(days=2),
    )
    other = ca.write(directory, "other", "elsewhere.test")
    return {
        "cert": str(good[0]),
        "key": str(good[1]),
        "expired": str(expired[0]),
        "expired_key": str(expired[1]),
        "other_key": str(other[1]),
    }


HSTS = {"headers": {"Strict-Transport-Security": "max-age=31536000"}}
CHP = "configurable-http-proxy"
# the proxy on PATH, behind the launcher that gives it an allow-listed environment (proxy_env.py)
PROXY = [*proxy_env.LAUNCHER, "--", CHP]


@pytest.mark.parametrize(
    ("env", "trait", "expected"),
    [
        # the operator's certificate: the proxy serves HTTPS, the hub pages carry HSTS
        ({"TLS": 1}, "JupyterHub.bind_url", "https://127.0.0.1:8000"),
        ({"TLS": 1, "WORKBENCH_IP": "0.0.0.0", "WORKBENCH_PORT": "443"}, "JupyterHub.bind_url", "https://0.0.0.0:443"),
        ({"TLS": 1}, "JupyterHub.ssl_cert", "<cert>"),
        ({"TLS": 1}, "JupyterHub.ssl_key", "<key>"),
        ({"TLS": 1}, "JupyterHub.tornado_settings", HSTS),
        (
            {"TLS": 1, "WORKBENCH_HSTS_SECONDS": "600"},
            "JupyterHub.tornado_settings",
            {"headers": {"Strict-Transport-Security": "max-age=600"}},
        ),
        # our proxy keeps adding X-Forwarded-Proto: https for the hub
        ({"TLS": 1}, "ConfigurableHTTPProxy.command", PROXY),
        # a TLS-terminating proxy in front: its X-Forwarded-Proto reaches the hub untouched
        ({"WORKBENCH_ALLOW_HTTP": "1"}, "ConfigurableHTTPProxy.command", [*PROXY, "--no-x-forward"]),
        ({"WORKBENCH_ALLOW_HTTP": "1"}, "JupyterHub.tornado_settings", HSTS),
        ({"WORKBENCH_ALLOW_HTTP": "1"}, "JupyterHub.bind_url", "http://127.0.0.1:8000"),
        ({"WORKBENCH_ALLOW_HTTP": "1"}, "JupyterHub.public_url", None),
        ({"WORKBENCH_DOMAIN": "GPU.example.org"}, "JupyterHub.public_url", "https://gpu.example.org/"),
        ({"WORKBENCH_DOMAIN": "gpu.example.org"}, "ConfigurableHTTPProxy.command", [*PROXY, "--no-x-forward"]),
        ({"WORKBENCH_ALLOW_HTTP": "1", "WORKBENCH_HSTS_SECONDS": "0"}, "JupyterHub.tornado_settings", None),
        # the certificate wins over a proxy in front: our proxy serves TLS itself
        ({"TLS": 1, "WORKBENCH_ALLOW_HTTP": "1"}, "ConfigurableHTTPProxy.command", PROXY),
        # plain HTTP (loopback): nothing changes
        ({}, "JupyterHub.bind_url", "http://127.0.0.1:8000"),
        ({}, "JupyterHub.ssl_cert", None),
        ({}, "JupyterHub.tornado_settings", None),
        ({}, "ConfigurableHTTPProxy.command", PROXY),
        ({"WORKBENCH_ALLOW_HTTP": "0"}, "ConfigurableHTTPProxy.command", PROXY),
    ],
)
def test_https_settings_become_config(certs, env, trait, expected):
    env = dict(env)
    if env.pop("TLS", None):
        env |= {"WORKBENCH_SSL_CERT": certs["cert"], "WORKBENCH_SSL_KEY": certs["key"]}
    c = build(env, repo=Path("/nonexistent"))  # no proxy in a checkout: the one on PATH
    section, _, name = trait.rpartition(".")
    if expected is None:
        assert name not in c[section], (trait, c[section])
        return
    expected = (
        {"<cert>": certs["cert"], "<key>": certs["key"]}.get(expected, expected)
        if isinstance(expected, str)
        else expected
    )
    assert get(c, trait) == expected


def test_the_checkouts_proxy_gets_no_x_forward_behind_a_tls_proxy(tmp_path):
    chp = tmp_path / "node_modules" / ".bin" / "configurable-http-proxy"
    chp.parent.mkdir(parents=True)
    chp.touch()
    c = build({"WORKBENCH_ALLOW_HTTP": "yes"}, repo=tmp_path)
    assert c.ConfigurableHTTPProxy.command == [*proxy_env.LAUNCHER, "--", str(chp), "--no-x-forward"]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"WORKBENCH_SSL_CERT": "/etc/ssl/hub.pem"},
            "WORKBENCH_SSL_KEY is not set: set both WORKBENCH_SSL_CERT and WORKBENCH_SSL_KEY, or neither",
        ),
        (
            {"WORKBENCH_SSL_KEY": "/etc/ssl/hub.key"},
            "WORKBENCH_SSL_CERT is not set: set both WORKBENCH_SSL_CERT and WORKBENCH_SSL_KEY, or neither",
        ),
        (
            {"WORKBENCH_DOMAIN": "https://gpu.example.org/"},
            "WORKBENCH_DOMAIN must be a host name such as gpu.example.org, not 'https://gpu.example.org/'",
        ),
        ({"WORKBENCH_DOMAIN": "gpu.example.org:443"}, "WORKBENCH_DOMAIN must be a host name"),
        (
            {"WORKBENCH_HSTS_SECONDS": "a year"},
            "WORKBENCH_HSTS_SECONDS must be a non-negative whole number, not 'a year'",
        ),
        ({"WORKBENCH_ALLOW_HTTP": "on-the-lan"}, "WORKBENCH_ALLOW_HTTP must be 1 or 0, not 'on-the-lan'"),
    ],
)
def test_bad_https_settings_raise_one_sentence(env, message):
    with pytest.raises(ConfigError) as raised:
        build(env)
    assert str(raised.value) == message or str(raised.value).startswith(message)


REFUSAL = (
    "serves other machines over plain HTTP, so passwords and tokens would cross the network in clear: "
    "set WORKBENCH_SSL_CERT and WORKBENCH_SSL_KEY (PEM files) to serve HTTPS, or set WORKBENCH_ALLOW_HTTP=1 "
    "if a TLS-terminating proxy in front forwards X-Forwarded-Proto (README: Serving other machines)"
)


def _local_bind_all(c):
    c.JupyterHub.bind_url = "http://:8000"


def _local_ip(c):
    c.JupyterHub.ip = "10.1.2.3"


def _local_loopback(c):
    c.JupyterHub.bind_url = "http://[::1]:8000"


@pytest.mark.parametrize(
    ("env", "local", "outcome"),
    [
        ({}, None, "http"),  # make run
        ({"WORKBENCH_IP": "127.0.0.2"}, None, "http"),
        ({"WORKBENCH_IP": "localhost"}, None, "http"),
        ({"WORKBENCH_IP": "::1"}, None, "http"),
        ({"WORKBENCH_IP": "0.0.0.0"}, None, "the proxy's address 0.0.0.0 " + REFUSAL),
        ({"WORKBENCH_IP": "192.168.1.20"}, None, "the proxy's address 192.168.1.20 " + REFUSAL),
        ({"WORKBENCH_IP": "gpu.example.org"}, None, "the proxy's address gpu.example.org " + REFUSAL),
        ({"WORKBENCH_IP": "0.0.0.0", "WORKBENCH_ALLOW_HTTP": "1"}, None, "behind-proxy"),
        ({"WORKBENCH_IP": "0.0.0.0", "WORKBENCH_ALLOW_HTTP": "true"}, None, "behind-proxy"),
        # an empty value (`WORKBENCH_ALLOW_HTTP=` in .env) lowers no safeguard
        ({"WORKBENCH_IP": "0.0.0.0", "WORKBENCH_ALLOW_HTTP": ""}, None, "the proxy's address 0.0.0.0 " + REFUSAL),
        ({"WORKBENCH_IP": "0.0.0.0", "WORKBENCH_ALLOW_HTTP": "0"}, None, "the proxy's address 0.0.0.0 " + REFUSAL),
        (
            {"WORKBENCH_IP": "0.0.0.0", "WORKBENCH_DOMAIN": "gpu.example.org"},
            None,
            "the proxy's address 0.0.0.0 " + REFUSAL,
        ),  # a domain alone is no proof of a TLS proxy
        ({"WORKBENCH_IP": "0.0.0.0", "TLS": 1}, None, "https"),
        ({"WORKBENCH_IP": "0.0.0.0", "TLS": "expired"}, None, "the certificate in WORKBENCH_SSL_CERT="),
        ({"WORKBENCH_IP": "0.0.0.0", "TLS": "mismatch"}, None, "WORKBENCH_SSL_KEY="),
        # docker compose: inside the container 0.0.0.0; what counts is where the host publishes the port
        ({"WORKBENCH_IP": "0.0.0.0", "WORKBENCH_PUBLISH_IP": "127.0.0.1"}, None, "http"),
        (
            {"WORKBENCH_IP": "0.0.0.0", "WORKBENCH_PUBLISH_IP": "0.0.0.0"},
            None,
            "WORKBENCH_PUBLISH_IP=0.0.0.0 " + REFUSAL,
        ),
        ({"WORKBENCH_PUBLISH_IP": "127.0.0.1", "WORKBENCH_DOMAIN": "gpu.example.org"}, None, "behind-proxy"),
        ({"WORKBENCH_IP": "0.0.0.0", "WORKBENCH_PUBLISH_IP": "0.0.0.0", "TLS": 1}, None, "https"),
        # the local config file and the command line are checked too (the final config)
        ({}, _local_bind_all, "the proxy's address (every address) " + REFUSAL),
        ({}, _local_ip, "the proxy's address 10.1.2.3 " + REFUSAL),
        ({"WORKBENCH_IP": "0.0.0.0"}, _local_loopback, "http"),
    ],
)
def test_plain_http_is_served_on_loopback_only(certs, env, local, outcome):
    env = dict(env)
    tls_case = env.pop("TLS", None)
    if tls_case == 1:
        env |= {"WORKBENCH_SSL_CERT": certs["cert"], "WORKBENCH_SSL_KEY": certs["key"]}
    elif tls_case == "expired":
        env |= {"WORKBENCH_SSL_CERT": certs["expired"], "WORKBENCH_SSL_KEY": certs["expired_key"]}
    elif tls_case == "mismatch":
        env |= {"WORKBENCH_SSL_CERT": certs["cert"], "WORKBENCH_SSL_KEY": certs["other_key"]}
    c = build(env)
    if local:
        local(c)
    if outcome in ("http", "https", "behind-proxy"):
        assert transport.check_transport(c, env).mode == outcome
    else:
        with pytest.raises(ConfigError) as raised:
            transport.check_transport(c, env)
        assert str(raised.value).startswith(outcome), str(raised.value)


def test_a_certificate_set_only_in_the_local_config_is_checked_and_named_so(certs):
    c = build({})
    c.JupyterHub.ssl_cert = certs["cert"]
    c.JupyterHub.ssl_key = certs["other_key"]
    with pytest.raises(
        ConfigError, match=r"^c.JupyterHub.ssl_key=.* is not the key of the certificate in c.JupyterHub.ssl_cert="
    ):
        transport.check_transport(c, {})
    c.JupyterHub.ssl_key = certs["key"]
    assert transport.check_transport(c, {}).certificate.names == ("workbench.test", "127.0.0.1")


@pytest.mark.parametrize(
    ("env", "lines"),
    [
        (
            {"TLS": 1, "WORKBENCH_IP": "0.0.0.0", "WORKBENCH_PORT": "8443"},
            [
                "GPU Workbench (local backend) at https://workbench.test:8443/",
                "First admin: open https://workbench.test:8443/hub/signup and sign up as admin;",
            ],
        ),
        (
            {"WORKBENCH_DOMAIN": "gpu.example.org", "WORKBENCH_PUBLISH_IP": "127.0.0.1", "WORKBENCH_IP": "0.0.0.0"},
            [
                "GPU Workbench (local backend) at https://gpu.example.org/",
                "HTTPS: terminated by the proxy in front (it must forward X-Forwarded-Proto)",
            ],
        ),
        ({}, ["GPU Workbench (local backend) at http://127.0.0.1:8000/"]),
    ],
)
def test_banner_says_where_https_is_served(certs, env, lines):
    env = dict(env)
    if env.pop("TLS", None):
        env |= {"WORKBENCH_SSL_CERT": certs["cert"], "WORKBENCH_SSL_KEY": certs["key"]}
    c = build(env)
    text = banner.banner(c, "local", DATA, DeviceInventory("none", [], "no driver"), transport.check_transport(c, env))
    for line in lines:
        assert any(row.startswith(line) for row in text.splitlines()), text
    if "TLS" in str(env) or env.get("WORKBENCH_SSL_CERT"):
        assert "HTTPS: certificate for workbench.test, 127.0.0.1, valid until " in text


# -- the banner --------------------------------------------------------------------------------


def device(i: int, model: str, source: str = "simulated") -> GPUDevice:
    return GPUDevice(
        uuid=f"GPU-{i}",
        index=i,
        name=f"NVIDIA {model}",
        memory_total_bytes=0,
        model=model,
        simulated=source == "simulated",
    )


@pytest.mark.parametrize(
    ("inventory", "line"),
    [
        (
            DeviceInventory("simulated", [device(0, "H100-80GB"), device(1, "H100-80GB"), device(2, "A100-40GB")]),
            "GPUs: 3 SIMULATED (2xH100-80GB,1xA100-40GB); no real hardware is used",
        ),
        (
            DeviceInventory("nvml", [device(0, "H200", "nvml"), device(1, "H200", "nvml")]),
            "GPUs: 2 found by NVML: NVIDIA H200",
        ),
        (DeviceInventory("static", [device(0, "A100-40GB", "static")]), "GPUs: 1 found by static: NVIDIA A100-40GB"),
        (DeviceInventory("none", [], "no NVIDIA driver"), "GPUs: none, servers will be CPU only (no NVIDIA driver)"),
    ],
)
def test_banner_names_the_gpus(inventory, line):
    env = {"WORKBENCH_PORT": "8123", "WORKBENCH_IP": "0.0.0.0", "WORKBENCH_ADMIN_USERS": "ada"}
    c = build(env)
    text = banner.banner(c, "local", DATA, inventory)
    assert line in text.splitlines()
    assert "GPU Workbench (local backend) at http://127.0.0.1:8123/" in text
    assert f"Data: {DATA}" in text
    assert "open http://127.0.0.1:8123/hub/signup and sign up as ada;" in text


# -- the parent guard ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "parsed"),
    [
        (["--", "sleep", "1"], (None, ["sleep", "1"])),
        (["--parent-pid=12", "--", "a", "--b"], (12, ["a", "--b"])),
        (["--", "a", "--", "b"], (None, ["a", "--", "b"])),
    ],
)
def test_parent_guard_arguments(argv, parsed):
    assert parent_guard.parse(argv) == parsed


@pytest.mark.parametrize("argv", [[], ["sleep"], ["--"], ["--what", "--", "x"], ["--parent-pid=me", "--", "x"]])
def test_parent_guard_refuses_bad_arguments(argv):
    with pytest.raises(SystemExit):
        parent_guard.parse(argv)


def alive(pid: int) -> bool:
    """Running (a zombie is dead, only not yet reaped by its new parent)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_parent_guard_ends_the_command_when_its_parent_is_killed(tmp_path):
    """A middle process starts `parent_guard -- sleep`; killing the middle one ends the sleep."""
    pid_file = tmp_path / "child.pid"
    middle = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            f"p = subprocess.Popen([sys.executable, '-m', 'workbench_hub.parent_guard', '--', "
            f"'sh', '-c', 'echo $$ > {pid_file}; exec sleep 300'])\n"
            "time.sleep(300)\n",
        ],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(pid_file.read_text())
        assert alive(child)
        os.kill(middle.pid, signal.SIGKILL)
        middle.wait(10)
        deadline = time.monotonic() + 10
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child), "the command outlived its killed parent"
    finally:
        if middle.poll() is None:
            os.killpg(middle.pid, signal.SIGKILL)
            middle.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(middle.pid, signal.SIGKILL)  # the sleep is in the middle's session


def test_parent_guard_does_not_start_when_the_parent_is_already_gone():
    r = subprocess.run(
        [sys.executable, "-m", "workbench_hub.parent_guard", "--parent-pid=1", "--", "true"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode != 0
    assert "parent process 1 is gone; not starting true" in r.stderr
