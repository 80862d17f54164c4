"""A real ``jupyter server`` with the image's server config: on SIGTERM a busy kernel gets SIGTERM and the grace
(WORKBENCH_KERNEL_GRACE) before SIGKILL, so its ``on_stop`` callback writes its checkpoint; a stop the hub
announced reaches the kernel through the notices file before the server stops."""

from __future__ import annotations

import json
import os
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import requests

from tests.monitor.monitor_support import REPO, start_server, stop_server

jupyter_client = pytest.importorskip("jupyter_client")

SERVER_CONFIG = REPO / "images" / "singleuser" / "jupyter_server_config.py"

# A training loop whose checkpoint takes 3 s: longer than jupyter_client's own 2.5 s before SIGTERM and
# 2.5 s more before SIGKILL, and it would never start under the stock shutdown, whose first act is SIGINT
# (KeyboardInterrupt in the loop).
TRAINING = """
import json, os, threading, time
from workbench_gpu_monitor import on_stop
def checkpoint(notice):
    started = time.time()
    time.sleep(3)
    with open({ckpt!r}, "a") as fh:
        fh.write(json.dumps({{"notice": notice, "thread": threading.current_thread().name,
                             "started": started, "done": time.time()}}) + "\\n")
stop = on_stop(checkpoint)
open({ready!r}, "w").write(str(os.getpid()))
step = 0
while True:
    step += 1
    time.sleep(0.01)
"""


def start(tmp_path: Path, grace: str):
    (tmp_path / "config").mkdir(parents=True)
    shutil.copy(SERVER_CONFIG, tmp_path / "config" / "jupyter_server_config.py")
    return start_server(tmp_path, {"WORKBENCH_SIMULATED_GPUS": "1", "WORKBENCH_KERNEL_GRACE": grace})


def run_training(server, tmp_path: Path) -> tuple[int, Path]:
    """Start a kernel through the server's REST API and run the loop in it; return (kernel pid, checkpoint)."""
    r = requests.post(server.url + "api/kernels", json={}, headers={"Authorization": f"token {server.token}"})
    assert r.status_code == 201, r.text
    kc = jupyter_client.BlockingKernelClient(connection_file=str(server.runtime_dir / f"kernel-{r.json()['id']}.json"))
    kc.load_connection_file()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    ckpt, ready = tmp_path / "checkpoint.jsonl", tmp_path / "ready"
    kc.execute(TRAINING.format(ckpt=str(ckpt), ready=str(ready)))
    deadline = time.time() + 30
    while not ready.exists() and time.time() < deadline:
        time.sleep(0.1)
    assert ready.exists(), server.log_text()
    kc.stop_channels()
    return int(ready.read_text()), ckpt


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_server_sigterm_gives_a_busy_kernel_sigterm_and_the_grace_to_checkpoint(tmp_path):
    server = start(tmp_path, "20")
    try:
        pid, ckpt = run_training(server, tmp_path)
        assert server.get("api/kernels").json()[0]["execution_state"] == "busy"
        sent = time.time()
        server.proc.terminate()  # what docker stop, a pod deletion or scancel does to the server
        assert server.proc.wait(40) == 0
    finally:
        stop_server(server)
    log = server.log_text()
    [record] = records(ckpt)
    assert record["notice"]["kind"] == "sigterm"
    assert record["thread"] == "MainThread"
    assert record["started"] >= sent - 1
    assert record["done"] - record["started"] >= 3
    assert "1 kernel(s) got SIGTERM and up to 20 s to save" in log
    assert "Every kernel stopped" in log
    assert "killing them" not in log
    assert not alive(pid)


def test_an_announced_stop_reaches_the_kernel_once_and_a_bad_grace_is_logged(tmp_path):
    server = start(tmp_path, "soon")
    try:
        pid, ckpt = run_training(server, tmp_path)
        far = {"id": 5, "kind": "idle", "message": "Stops in an hour.", "stop_at": "2099-01-01T00:00:00+00:00"}
        h = {"Authorization": f"token {server.token}"}
        assert requests.put(server.url + "api/gpu/notices", json={"notices": [far]}, headers=h).status_code == 200
        time.sleep(2.5)
        assert records(ckpt) == []  # not within the 120 s lead
        now = {**far, "stop_at": datetime.now(UTC).isoformat(), "stopping": True}
        assert requests.put(server.url + "api/gpu/notices", json={"notices": [now]}, headers=h).status_code == 200
        deadline = time.time() + 10
        while not records(ckpt) and time.time() < deadline:
            time.sleep(0.2)
        [record] = records(ckpt)
        assert record["notice"]["id"] == "5"
        assert record["notice"]["stopping"] is True
        assert record["thread"] == "workbench-on-stop"
        server.proc.terminate()
        assert server.proc.wait(40) == 0
    finally:
        stop_server(server)
    assert len(records(ckpt)) == 1  # the SIGTERM belongs to the same stop: no second checkpoint
    log = server.log_text()
    assert "WORKBENCH_KERNEL_GRACE='soon' is not a number of seconds" in log
    assert "up to 30 s to save" in log
    assert not alive(pid)
