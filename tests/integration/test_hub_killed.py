"""A hub that is killed (kill -9, the OOM killer) or stopped with Ctrl-C leaves nothing behind.

The hub's managed services (the workbench service, the idle culler) run
behind workbench_hub.parent_guard, which asks the kernel to end them when
the hub process dies. User servers outlive the hub on purpose, and the
restarted hub re-attaches to them; the proxy outlives it too (JupyterHub's
design) and the restarted hub replaces it and re-adds every route.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest
import requests

from tests.conftest import free_port, process_env, wait_until

pytestmark = pytest.mark.integration

SIM = [f"GPU-sim-{i:02d}-h100-80gb" for i in range(2)]


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def alive(pid: int) -> bool:
    """Running; a zombie is dead, only not yet reaped by whoever adopted it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def service_processes(hub) -> dict[int, str]:
    """This hub's managed services, found by what they were given: the service port, the hub's API port."""
    found = {}
    service_port = f"--port={hub.env['WORKBENCH_SERVICE_PORT']}"
    hub_api = f":{hub.env['WORKBENCH_HUB_API_PORT']}/"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not alive(int(entry.name)):
            continue
        pid, args = int(entry.name), cmdline(int(entry.name))
        if "workbench_hub.service" in args and service_port in args:
            found[pid] = "workbench"
        elif "jupyterhub_idle_culler" in args:
            try:
                if hub_api in process_env(pid).get("JUPYTERHUB_API_URL", ""):
                    found[pid] = "idle-culler"
            except OSError:
                continue
    return found


def kill_pids(pids) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def env_for_services() -> dict[str, str]:
    return {
        "WORKBENCH_SIMULATED_GPUS": "2",
        "WORKBENCH_QUEUE_TIMEOUT": "300",
        # The culler runs (and must die with the hub) but never culls here.
        "WORKBENCH_CULL_IDLE_SECONDS": "3600",
        "WORKBENCH_SERVICE_PORT": str(free_port()),
    }


def test_a_killed_hub_takes_its_services_along_and_a_restart_picks_up(running_hub):
    hub = running_hub(env_for_services(), ["--GPUSpawnerMixin.gpu_queue_recheck_interval=0.5"])
    old_services: dict[int, str] = {}
    try:
        hub.create_users("u1", "u2", "waiting")
        for user in ("u1", "u2"):
            assert hub.spawn(user, gpus=1).status_code in (201, 202)
        servers = {user: int(hub.wait_ready(user)["state"]["pid"]) for user in ("u1", "u2")}
        held = hub.leases()
        assert sorted(held) == ["u1", "u2"]
        assert sorted(held["u1"] + held["u2"]) == SIM
        # Both GPUs are held: the third spawn waits in line.
        assert hub.spawn("waiting", gpus=1).status_code == 202
        assert "you are next in line" in hub.progress_messages("waiting", until="next in line")[-1]

        old_services = wait_until(
            lambda: service_processes(hub) if len(service_processes(hub)) == 2 else None,
            30,
            "both managed services running",
        )
        assert sorted(old_services.values()) == ["idle-culler", "workbench"]
        assert all(
            int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) == hub.proc.pid
            for pid in old_services
        ), "the services are not the hub's own children (exec'd by the guard)"
        proxy_pid = int((hub.data_dir / "jupyterhub-proxy.pid").read_text())

        # What the OOM killer does: SIGKILL to the hub process only.
        killed_at = time.monotonic()
        os.kill(hub.proc.pid, signal.SIGKILL)
        hub.proc.wait(10)
        hub.proc = None
        wait_until(
            lambda: not any(alive(pid) for pid in old_services) and not service_processes(hub),
            5,
            f"the old hub's services {old_services} end",
        )
        print(f"services gone {time.monotonic() - killed_at:.2f} s after the kill")
        # User servers outlive the hub on purpose; so does the proxy (JupyterHub re-uses or replaces it).
        assert all(alive(pid) for pid in servers.values())
        assert alive(proxy_pid)

        # The same ports and data dir again.
        restarted_at = time.monotonic()
        hub.start()
        print(f"hub answered {time.monotonic() - restarted_at:.2f} s after the restart")
        assert not alive(proxy_pid), "the restarted hub kept the old proxy"
        assert int((hub.data_dir / "jupyterhub-proxy.pid").read_text()) != proxy_pid
        # The proxy routes /services/workbench/ to the new service (the old one is dead: no one else could answer).
        r = wait_until(
            lambda: (lambda r: r if r.status_code == 200 else None)(
                requests.get(f"{hub.url}/services/workbench/api/openapi.json", timeout=10)
            ),
            30,
            "the new workbench service answers through the proxy",
        )
        assert r.json()["openapi"]
        new_services = service_processes(hub)
        assert sorted(new_services.values()) == ["idle-culler", "workbench"]
        assert not set(new_services) & set(old_services)

        # The running servers kept their GPUs; the half-started spawn holds nothing and is gone.
        for user, pid in servers.items():
            assert int(hub.wait_ready(user)["state"]["pid"]) == pid, f"{user}'s server was restarted"
        assert hub.leases() == held
        assert hub.server("waiting") is None

        # A stopped server's GPU goes to the next spawn.
        assert hub.api("DELETE", "/users/u1/server").status_code in (202, 204)
        hub.wait_stopped("u1")
        assert hub.spawn("waiting", gpus=1).status_code in (201, 202)
        hub.wait_ready("waiting")
        assert hub.leases() == {"u2": held["u2"], "waiting": held["u1"]}
    finally:
        kill_pids(old_services)


@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_ctrl_c_stops_the_hub_and_its_services_without_a_traceback(running_hub, inherited):
    """``inherited``: SIGINT as a terminal gives it, or ignored, as a hub started by a script in the
    background gets it (POSIX shells ignore SIGINT for `cmd &`); services must not inherit that, or the
    hub waits 30 s for each at every stop."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN) if inherited == "ignored" else None
    try:
        hub = running_hub(env_for_services())
    finally:
        if before is not None:
            signal.signal(signal.SIGINT, before)
    services = wait_until(
        lambda: service_processes(hub) if len(service_processes(hub)) == 2 else None,
        30,
        "both managed services running",
    )
    # Ctrl-C of a hub that is up: both services past their start (a signal during the workbench
    # service's start is test_service_lifetime's; the culler's own start is not ours to test).
    wait_until(
        lambda: requests.get(f"{hub.url}/services/workbench/api/openapi.json", timeout=10).status_code == 200,
        30,
        "the workbench service answers",
    )
    wait_until(lambda: "(idle-culler@" in hub.log(), 30, "the idle culler's first look at the hub")
    try:
        # A terminal's Ctrl-C: SIGINT to the foreground process group (the hub leads its own here).
        os.killpg(hub.proc.pid, signal.SIGINT)
        hub.proc.wait(30)
        hub.proc = None
        wait_until(lambda: not any(alive(pid) for pid in services), 10, "the services end")
        log = hub.log()
        assert "Received signal SIGINT" in log
        assert "Traceback" not in log, log[-4000:]
        assert "KeyboardInterrupt" not in log, log[-4000:]
    finally:
        kill_pids(services)
