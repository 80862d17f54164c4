"""A kernel's ``on_stop`` callback saves a checkpoint before the hub's stop ends it, through the real hub.

A student's training loop registers ``workbench_gpu_monitor.on_stop(save, lead=...)`` in a notebook kernel
(started here through the Jupyter server's REST API and websocket, through the hub's proxy, with the
student's token: ``tests/kernel_ws.py``), then loops. Two ways the hub stops the server:

* an admin's stop through the hub API with no notice at all: the server gives its kernels SIGTERM and a
  grace period (``WORKBENCH_KERNEL_GRACE``), and the kernel's SIGTERM handler runs the callback in the main
  thread before the kernel exits;
* the service's idle reclaim: the warning's ``stop_at`` comes within ``lead`` seconds and the callback runs
  in the kernel's background thread while the server still runs, once, not again at the SIGTERM.

Either way the checkpoint (``torch.save`` into the persistent home) is there after the server ended and
holds the loop's state at the stop. Without the grace (jupyter_client's interrupt-first shutdown) the loop
gets KeyboardInterrupt and no callback runs; without the notices file the second case writes only at the
SIGTERM, in the main thread: both fail here.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import requests

from tests.conftest import wait_until, write_utilization
from tests.kernel_ws import Kernel

pytestmark = pytest.mark.integration

USER = "ann"
IDLE_MINUTES = 1  # warned after 30 idle seconds, stopped 30 s later
LEAD = 10  # the callback of the reclaim case: 10 s before the announced stop, not at the warning

# The student's cell: a checkpoint of the loop's state to the home, and a line per call (to count them).
SETUP = """
import json, os, threading, time
import torch
from workbench_gpu_monitor import on_stop

home = os.path.expanduser("~")
os.makedirs(os.path.join(home, "checkpoints"), exist_ok=True)
checkpoint = os.path.join(home, "checkpoints", "model.pt")
calls = os.path.join(home, "checkpoints", "calls.jsonl")
state = {"step": 0, "weights": torch.zeros(4)}

def save(notice):
    step = state["step"]
    torch.save({"step": step, "weights": state["weights"].clone(), "notice": notice}, checkpoint)
    with open(calls, "a") as fh:
        fh.write(json.dumps({"step": step, "thread": threading.current_thread().name, "notice": notice}) + "\\n")

stop = on_stop(save, lead=%(lead)s)
print(json.dumps({"home": home, "checkpoint": checkpoint, "handle": repr(stop)}))
"""
LOOP = """
while True:
    state["step"] += 1
    state["weights"] = torch.full((4,), float(state["step"]))
    time.sleep(0.05)
"""


def local_config(tmp_path: Path) -> Path:
    local = tmp_path / "local_config.py"
    local.write_text("c.Spawner.http_timeout = 180\n")  # a busy 2-core host may take over 30 s to start one
    return local


def start_training(hub, lead: float) -> tuple[Kernel, Path, Path]:
    """Spawn the student's server, run SETUP and start LOOP in a kernel; (kernel, checkpoint, calls log)."""
    hub.create_users(USER)
    assert hub.spawn(USER, gpus=1).status_code in (201, 202)
    hub.wait_ready(USER, timeout=180)
    kernel = Kernel.start(hub.url, USER, hub.user_token(USER))
    result = kernel.execute(SETUP % {"lead": lead}, timeout=180)
    assert result.status == "ok", result.describe()
    assert not result.errors, result.describe()
    where = json.loads(result.stdout.strip().splitlines()[-1])
    home = hub.data_dir / "homes" / USER
    assert Path(where["home"]).resolve() == home.resolve(), (where, home)  # the persistent home
    kernel.submit(LOOP)  # runs until the stop
    return kernel, Path(where["checkpoint"]), Path(where["checkpoint"]).with_name("calls.jsonl")


def read_calls(calls: Path) -> list[dict]:
    return [json.loads(line) for line in calls.read_text().splitlines() if line.strip()] if calls.exists() else []


def load_checkpoint(path: Path) -> dict:
    import torch

    return torch.load(path, weights_only=True)


def server_processes_gone(hub) -> None:
    """Neither the server nor its kernel still runs (both run in the home under the data dir)."""
    wait_until(lambda: not hub.server_pids(), 60, "the server's and kernel's processes to end", hub.log)


def test_a_kernel_saves_its_checkpoint_at_sigterm_when_the_hub_stops_the_server(running_hub, tmp_path):
    hub = running_hub({"WORKBENCH_SIMULATED_GPUS": "1", "WORKBENCH_LOCAL_CONFIG": str(local_config(tmp_path))})
    kernel, checkpoint, calls = start_training(hub, lead=120)
    try:
        time.sleep(3)  # the loop trains a while
        assert hub.server(USER)["ready"]
        assert not checkpoint.exists(), "no stop announced yet: nothing saved"
        assert not read_calls(calls), "no stop announced yet: nothing saved"
        # The hub stops it with no notice (a script with the admin token): SIGTERM and the kernels' grace.
        assert hub.api("DELETE", f"/users/{USER}/server").status_code in (202, 204)
        hub.wait_stopped(USER, timeout=120)
        server_processes_gone(hub)
    finally:
        kernel.close()
    assert checkpoint.exists(), f"no checkpoint after the stop; hub log:\n{hub.log()[-5000:]}"
    saved = load_checkpoint(checkpoint)
    [call] = read_calls(calls)  # once
    assert saved["step"] == call["step"] >= 20, (saved["step"], call)  # the loop ran 3 s at 20 steps/s
    assert saved["weights"].tolist() == [float(saved["step"])] * 4, "the state at the stop, whole"
    notice = saved["notice"]
    assert notice["kind"] == "sigterm", notice
    assert notice["stopping"] is True, notice
    assert call["thread"] == "MainThread", call  # the SIGTERM handler, between two steps of the loop


def test_a_kernel_saves_its_checkpoint_when_the_reclaim_notice_comes_within_its_lead(running_hub, tmp_path):
    utilization = tmp_path / "utilization.json"
    write_utilization(utilization, {"*": 80})
    hub = running_hub(
        {
            "WORKBENCH_LOCAL_CONFIG": str(local_config(tmp_path)),
            "WORKBENCH_SIMULATED_GPUS": "1",
            "WORKBENCH_SIMULATED_UTILIZATION": str(utilization),
            "WORKBENCH_GPU_IDLE_MINUTES": str(IDLE_MINUTES),
            "WORKBENCH_GPU_IDLE_CHECK_SECONDS": "1",
        }
    )
    kernel, checkpoint, calls = start_training(hub, lead=LEAD)
    token = hub.user_token(USER)

    def notices() -> list[dict]:
        r = requests.get(
            f"{hub.url}/user/{USER}/api/gpu/notices", headers={"Authorization": f"token {token}"}, timeout=10
        )
        return r.json()["notices"] if r.status_code == 200 else []

    try:
        write_utilization(utilization, {"*": 0})  # the GPU goes quiet (the loop here runs on the CPU)
        [warning] = wait_until(notices, 60, "the idle warning in the student's server", hub.log)
        assert warning["kind"] == "idle", warning
        assert warning["seconds_left"] > LEAD + 5, warning
        time.sleep(2)  # the kernel has read the notices file by now: the stop is not within its lead yet
        assert not checkpoint.exists(), "called at the warning, not within its lead"
        assert not read_calls(calls), "called at the warning, not within its lead"

        def written_while_running():
            if read_calls(calls):
                return True
            assert hub.server(USER) is not None, "the server stopped before the callback ran"
            return False

        wait_until(written_while_running, IDLE_MINUTES * 60, "the on_stop callback before the stop", hub.log)
        assert hub.server(USER) is not None, "the callback ran while the server still ran"
        hub.wait_stopped(USER, timeout=120)
        server_processes_gone(hub)
    finally:
        kernel.close()
    [call] = read_calls(calls)  # once: the SIGTERM that followed did not call it again for the same stop
    notice = call["notice"]
    assert notice["kind"] == "idle", (notice, warning)
    assert str(notice["id"]) == str(warning["id"]), (notice, warning)
    assert notice["stopping"] is False, notice
    assert 0 <= notice["seconds_left"] <= LEAD + 1.5, notice
    assert call["thread"] != "MainThread", call  # the background watcher, while the loop went on
    saved = load_checkpoint(checkpoint)
    assert saved["step"] == call["step"] > 0
    assert saved["weights"].tolist() == [float(call["step"])] * 4
    assert saved["notice"] == notice
    assert ("ann", "reclaimed: GPU idle 1 min") in [
        (user, reason) for user, reasons in hub.usage_reasons().items() for reason in reasons
    ], hub.usage_reasons()
