"""The hub's secrets stay in the hub: its proxy and its managed services get only what they need.

A real hub with its real proxy (configurable-http-proxy) and both managed
services (the workbench service, the idle culler); what each process was
given is read back from ``/proc/<pid>/environ`` and ``/proc/<pid>/cmdline``.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from tests.conftest import process_env, wait_until
from tests.integration.test_hub_killed import service_processes
from workbench_hub import proxy_env

pytestmark = pytest.mark.integration

# What JupyterHub's service spawner passes on from the hub's environment (LocalProcessSpawner's env_keep).
SERVICE_ENV_KEEP = {
    "CONDA_DEFAULT_ENV",
    "CONDA_ROOT",
    "JUPYTERHUB_SINGLEUSER_APP",
    "LANG",
    "LC_ALL",
    "LD_LIBRARY_PATH",
    "PATH",
    "PYTHONPATH",
    "VIRTUAL_ENV",
}


def given(pid: int) -> bytes:
    """Everything a process was started with: its environment and its command line."""
    return Path(f"/proc/{pid}/environ").read_bytes() + b"\0" + Path(f"/proc/{pid}/cmdline").read_bytes()


def test_the_proxy_and_the_services_get_none_of_the_hubs_secrets(running_hub):
    metrics_token = secrets.token_hex(16)
    cookie_secret = secrets.token_hex(32)
    admin_password = "first-admin-" + secrets.token_hex(8)
    hub = running_hub(
        {
            "WORKBENCH_SIMULATED_GPUS": "1",
            "WORKBENCH_CULL_IDLE_SECONDS": "3600",  # the culler runs (it never culls here)
            "WORKBENCH_METRICS_TOKEN": metrics_token,
            "JPY_COOKIE_SECRET": cookie_secret,
            "WORKBENCH_ADMIN_PASSWORD": admin_password,
            # an operator's variable for the proxy, passed through by name
            "WORKBENCH_PROXY_ENV_KEEP": "NO_PROXY",
            "NO_PROXY": "internal.example",
        }
    )
    hub_secrets = {
        "WORKBENCH_ADMIN_TOKEN": hub.token,
        "WORKBENCH_METRICS_TOKEN": metrics_token,
        "JPY_COOKIE_SECRET": cookie_secret,
        "WORKBENCH_ADMIN_PASSWORD": admin_password,
    }
    # The premise: the hub itself holds them (so a process started with its environment would too).
    hub_env = process_env(hub.proc.pid)
    assert {name: hub_env.get(name) for name in hub_secrets} == hub_secrets

    # The proxy: the launcher exec'd it (the pid file names node running the proxy), with the allow-list.
    proxy_pid = int((hub.data_dir / "jupyterhub-proxy.pid").read_text())
    proxy = process_env(proxy_pid)
    command = Path(f"/proc/{proxy_pid}/cmdline").read_bytes().split(b"\0")
    assert any(part.endswith(b"configurable-http-proxy") for part in command), command
    assert b"workbench_hub.proxy_env" not in command
    assert proxy.get("CONFIGPROXY_AUTH_TOKEN"), "the proxy lost its own token"
    assert proxy["NO_PROXY"] == "internal.example"
    assert proxy["PATH"] == hub_env["PATH"]
    assert sorted(name for name in proxy if not proxy_env.kept(name, frozenset({"NO_PROXY"}))) == []
    for name, value in hub_secrets.items():
        assert value.encode() not in given(proxy_pid), f"the proxy was given {name}"

    # The managed services: JupyterHub's env_keep, their own JUPYTERHUB_* settings, nothing of the hub's.
    services = wait_until(
        lambda: (lambda found: found if len(found) == 2 else None)(service_processes(hub)),
        30,
        "both managed services running",
        hub.log,
    )
    assert sorted(services.values()) == ["idle-culler", "workbench"]
    for pid, name in services.items():
        env = process_env(pid)
        # Where its database is, and whether the hub's accounts are sign-ups (a roster's links): no secret.
        own = {"WORKBENCH_DB_URL", "WORKBENCH_SIGN_UPS"} if name == "workbench" else set()
        foreign = sorted(key for key in env if key not in SERVICE_ENV_KEEP | own and not key.startswith("JUPYTERHUB_"))
        # JPY_API_TOKEN: JupyterHub's old name for the service's own JUPYTERHUB_API_TOKEN
        assert foreign in ([], ["JPY_API_TOKEN"]), f"{name} was given {foreign}"
        assert env.get("JPY_API_TOKEN", env["JUPYTERHUB_API_TOKEN"]) == env["JUPYTERHUB_API_TOKEN"]
        assert env["JUPYTERHUB_API_TOKEN"] != hub.token
        for secret_name, value in {**hub_secrets, "CONFIGPROXY_AUTH_TOKEN": proxy["CONFIGPROXY_AUTH_TOKEN"]}.items():
            assert value.encode() not in given(pid), f"{name} was given {secret_name}"
        # The GPU database's URL (a PostgreSQL one carries a password): in the workbench service's
        # environment, which only its own account reads, never on a command line, which every account reads.
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert b"workbench.sqlite" not in cmdline, f"{name} has the database URL on its command line"
        assert ("WORKBENCH_DB_URL" in env) == (name == "workbench"), name
