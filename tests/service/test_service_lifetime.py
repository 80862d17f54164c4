"""How the workbench service process starts and ends, without a hub: a busy port is one sentence
and exit 1; SIGINT and SIGTERM are one log line and exit 0, no traceback; it ends when the
process that started it dies; a hub it cannot reach is a 503, not a 500."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.conftest import REPO, free_port, wait_until


def service_env(hub_api_port: int) -> dict[str, str]:
    return {
        **os.environ,
        "JUPYTERHUB_API_TOKEN": "not-a-real-token",
        "JUPYTERHUB_API_URL": f"http://127.0.0.1:{hub_api_port}/hub/api",
        "JUPYTERHUB_CLIENT_ID": "service-workbench",
        "JUPYTERHUB_SERVICE_PREFIX": "/services/workbench/",
        "PYTHONUNBUFFERED": "1",
    }


def command(port: int, db: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "workbench_hub.service",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--db-url=sqlite:///{db}",
        "--session-check-seconds=0",
    ]


def wait_listening(port: int, proc: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError("the service did not listen")


def test_a_busy_port_is_one_sentence_and_exit_1(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        r = subprocess.run(
            command(port, tmp_path / "wb.sqlite"),
            env=service_env(free_port()),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert r.returncode == 1, r.stderr
    assert (
        f"port {port} on 127.0.0.1 is in use, probably by a workbench service left from a hub that was "
        f"killed; stop it (`fuser -k {port}/tcp`) or set WORKBENCH_SERVICE_PORT"
    ) in r.stderr
    assert "Traceback" not in r.stderr


def assert_stopped_quietly(proc: subprocess.Popen, stderr: str, signal_name: str) -> None:
    """Exit 0, one log line naming the signal, no traceback."""
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr, stderr
    assert "KeyboardInterrupt" not in stderr, stderr
    assert f"Workbench service stopping: {signal_name}" in stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_it_quietly_with_exit_0(tmp_path, sig):
    port = free_port()
    proc = subprocess.Popen(
        command(port, tmp_path / "wb.sqlite"),
        env=service_env(free_port()),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_listening(port, proc)
        # No hub to check the token with: a 503 with a sentence, never a 500.
        r = requests.get(
            f"http://127.0.0.1:{port}/services/workbench/api/gpus", headers={"Authorization": "token abc"}, timeout=30
        )
        assert r.status_code == 503, r.text
        assert "hub's API did not answer" in r.json()["message"], r.text
        assert (
            requests.get(f"http://127.0.0.1:{port}/services/workbench/api/openapi.json", timeout=30)
            .json()["openapi"]
            .startswith("3.1")
        )
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert_stopped_quietly(proc, stderr, sig.name)
    assert "waiting for the hub to publish its GPU settings" in stderr


def _catches(pid: int, sig: signal.Signals) -> bool:
    """``sig`` is in the process's caught-signals mask (``SigCgt`` in /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(mask & (1 << (sig - 1)))


def test_a_signal_while_it_still_starts_stops_it_quietly(tmp_path):
    """The hub stops its services with SIGINT however soon after starting them: a signal that comes
    while the service still imports (long before it listens) is kept, not lost or a traceback."""
    port = free_port()
    proc = subprocess.Popen(
        command(port, tmp_path / "wb.sqlite"),
        env=service_env(free_port()),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Python catches SIGINT from its start; SIGTERM is caught once __main__ set its handlers (both at once).
        wait_until(lambda: _catches(proc.pid, signal.SIGTERM), 30, "the service to catch SIGTERM", every=0.005)
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, "already listening: the test came too late"
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert_stopped_quietly(proc, stderr, "SIGINT")


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in state  # exited, not yet reaped by whoever adopted it


def test_it_ends_when_the_process_that_started_it_dies(tmp_path):
    port = free_port()
    log = tmp_path / "service.log"
    starter = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen({command(port, tmp_path / 'wb.sqlite')!r}, stderr=open({str(log)!r}, 'w'))\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", starter], env=service_env(free_port()), cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    pid = int(parent.stdout.readline())
    try:
        wait_listening(port, parent)
        parent.kill()  # SIGKILL: nothing of the parent runs any more
        parent.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not _gone(pid):
            time.sleep(0.2)
        assert _gone(pid), "the service outlived the process that started it"
    finally:
        if not _gone(pid):
            os.kill(pid, signal.SIGKILL)
    text = log.read_text()
    assert f"Workbench service stopping: its hub (pid {parent.pid}) is gone" in text, text
    assert "Traceback" not in text
