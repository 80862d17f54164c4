"""``on_stop`` in a kernel: called once per announced stop from the notices file, on SIGTERM in the main thread
(real subprocesses, real signals), chained to an earlier handler, and cheap to import."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

# The extension's source, ahead of the wheel installed in the venv.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "extensions" / "gpu-monitor"))

from workbench_gpu_monitor.stop_notice import is_due, on_stop

EXTENSION_DIR = Path(__file__).resolve().parents[2] / "extensions" / "gpu-monitor"


def write(path: Path, *notices: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"written": datetime.now(UTC).isoformat(), "notices": list(notices)}))
    os.replace(tmp, path)


def notice(id_="7", minutes=10.0, stopping=False) -> dict:
    stop_at = (datetime.now(UTC) + timedelta(minutes=minutes)).isoformat()
    return {"id": id_, "kind": "idle", "message": "Stopping soon.", "stop_at": stop_at, "stopping": stopping}


def off_main_thread(callback, lead, path):
    """Register from another thread, as pytest's main thread must keep its own SIGTERM handling."""
    out = []
    t = threading.Thread(target=lambda: out.append(on_stop(callback, lead, path=str(path))))
    t.start()
    t.join()
    return out[0]


def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_is_due_table():
    now = datetime.now(UTC)
    assert is_due(notice(minutes=1), 120, now)
    assert not is_due(notice(minutes=3), 120, now)
    assert is_due(notice(minutes=3, stopping=True), 120, now)
    assert is_due(notice(minutes=-5), 0, now)
    assert not is_due({"id": "1", "stop_at": None}, 120, now)
    assert not is_due({"id": "1", "stop_at": "garbage"}, 120, now)


def test_called_once_per_stop_when_the_stop_comes_within_lead(tmp_path):
    path = tmp_path / "workbench-notices.json"
    calls = []
    handle = off_main_thread(calls.append, 120, path)
    try:
        write(path, notice("7", minutes=10))
        time.sleep(2.5)
        assert calls == []
        assert not handle.requested.is_set()
        write(path, notice("7", minutes=1.5))
        assert wait_for(lambda: len(calls) == 1)
        assert handle.requested.is_set()
        assert calls[0]["id"] == "7"
        assert calls[0]["kind"] == "idle"
        assert calls[0]["stopping"] is False
        assert 60 < calls[0]["seconds_left"] <= 90
        assert handle.notice == calls[0]
        write(path, notice("7", minutes=0, stopping=True))  # the same stop, now "stopping"
        time.sleep(2.5)
        assert len(calls) == 1
        write(path, notice("8", minutes=5, stopping=True))  # another stop
        assert wait_for(lambda: len(calls) == 2)
        assert calls[1]["id"] == "8"
        assert calls[1]["stopping"] is True
    finally:
        handle.cancel()


def test_a_failing_callback_is_printed_and_watching_goes_on(tmp_path, capfd):
    path = tmp_path / "workbench-notices.json"
    seen = []

    def broken(n):
        seen.append(n["id"])
        raise RuntimeError("disk full")

    handle = off_main_thread(broken, 120, path)
    try:
        write(path, notice("1", stopping=True))
        assert wait_for(lambda: seen == ["1"])
        write(path, notice("1", stopping=True), notice("2", stopping=True))
        assert wait_for(lambda: seen == ["1", "2"])
    finally:
        handle.cancel()
    err = capfd.readouterr().err
    assert "on_stop: the callback 'broken' failed" in err
    assert "RuntimeError: disk full" in err


def test_cancel_stops_the_calls_and_bad_arguments_are_refused(tmp_path):
    path = tmp_path / "workbench-notices.json"
    calls = []
    handle = off_main_thread(calls.append, 120, path)
    handle.cancel()
    write(path, notice("3", stopping=True))
    time.sleep(2.5)
    assert calls == []
    assert "cancelled" in repr(handle)
    with pytest.raises(TypeError, match="a function"):
        on_stop("save", path=str(path))
    with pytest.raises(ValueError, match="seconds"):
        on_stop(print, lead=-1, path=str(path))


KERNEL = """
import json, os, signal, sys, time
sys.path.insert(0, {ext!r})
from workbench_gpu_monitor import on_stop
CALLS = {calls!r}
{before}
def save(notice):
    time.sleep(0.5)  # a save that takes a while
    with open(CALLS, "a") as fh:
        fh.write(json.dumps({{"notice": notice, "main": __import__("threading").current_thread().name}}) + "\\n")
handle = on_stop(save, path={path!r})
print("ready", flush=True)
while True:
    time.sleep(0.01)  # a training loop
"""


def start_kernel_like(tmp_path: Path, before: str = "") -> tuple[subprocess.Popen, Path, Path]:
    calls, path = tmp_path / "calls.jsonl", tmp_path / "workbench-notices.json"
    code = KERNEL.format(ext=str(EXTENSION_DIR), calls=str(calls), path=str(path), before=before)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    return proc, calls, path


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_sigterm_runs_the_callback_in_the_main_thread_then_ends_as_sigterm_does(tmp_path):
    proc, calls, _ = start_kernel_like(tmp_path)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == -signal.SIGTERM
    [call] = lines(calls)
    assert call["main"] == "MainThread"
    assert call["notice"]["kind"] == "sigterm"
    assert call["notice"]["stopping"] is True


def test_sigterm_after_an_announced_stop_does_not_call_again_and_waits_for_the_running_save(tmp_path):
    proc, calls, path = start_kernel_like(tmp_path)
    write(path, notice("9", minutes=0, stopping=True))
    time.sleep(1.2)  # the watcher has seen it (1 s poll) and is inside the 0.5 s save, or done
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == -signal.SIGTERM
    [call] = lines(calls)  # one stop, one call, finished before the process ended
    assert call["notice"]["id"] == "9"
    assert call["main"] == "workbench-on-stop"


def test_an_earlier_sigterm_handler_is_chained(tmp_path):
    before = textwrap.dedent(
        """
        def earlier(signum, frame):
            open(CALLS + ".earlier", "w").write("ran")
            os._exit(3)
        signal.signal(signal.SIGTERM, earlier)
        """
    )
    proc, calls, _ = start_kernel_like(tmp_path, before)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 3
    assert len(lines(calls)) == 1
    assert Path(str(calls) + ".earlier").read_text() == "ran"


def test_importing_the_package_in_a_kernel_stays_cheap():
    code = (
        f"import sys; sys.path.insert(0, {str(EXTENSION_DIR)!r}); import workbench_gpu_monitor as m; "
        "print(callable(m.on_stop), sorted(k for k in ('jupyter_server', 'tornado', 'ipywidgets', 'traitlets') "
        "if k in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "True []"


@pytest.mark.parametrize(
    ("server_name", "file_name"),
    [
        ("", "workbench-notices.json"),
        ("gpu-big_2", "workbench-notices-gpu-big_2.json"),
        ("../etc", None),  # not a plain name: a hash of it, never a path
    ],
)
def test_each_named_server_of_a_user_has_its_own_notices_file(monkeypatch, tmp_path, server_name, file_name):
    from workbench_gpu_monitor.stop_notice import notices_path

    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("JUPYTERHUB_SERVER_NAME", server_name)
    path = Path(notices_path())
    assert path.parent == tmp_path
    if file_name:
        assert path.name == file_name
    else:
        assert path.name.startswith("workbench-notices-")
        assert ".." not in path.name
        assert "/" not in path.name
