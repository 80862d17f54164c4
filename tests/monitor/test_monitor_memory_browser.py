"""JupyterLab in Debian's Chromium says why a notebook ran out of memory.

A kernel killed by the server's memory limit: the server reads a fake memory cgroup
(``WORKBENCH_MEMORY_CGROUP``) whose ``oom_kill`` count the test raises as it kills the kernel's
process, as the kernel's OOM killer would; the lab shows "Your kernel was stopped because this
server reached its memory limit (16 GiB) ...". A kernel that dies for another reason says nothing
of memory. A CUDA out-of-memory error (an exception; the kernel lives on): the GPU panel shows the
GPU's memory at that moment.

Needs /usr/bin/chromium (or WORKBENCH_CHROMIUM) and the built labextension;
skips with the reason otherwise, fails instead when WORKBENCH_STRICT_TESTS=1.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
import requests

from tests.lab_browser import explained
from tests.monitor.monitor_support import kernel_ready, start_server, stop_server

pytestmark = pytest.mark.browser

GIB = 1024**3
OOM_TEXT = (
    "Your kernel was stopped because this server reached its memory limit (16 GiB): "
    "use a larger profile, or load less at once"
)


def write_events(cgroup: Path, oom_kills: int) -> None:
    tmp = cgroup / "memory.events.tmp"
    tmp.write_text(f"low 0\nhigh 0\nmax {oom_kills}\noom {oom_kills}\noom_kill {oom_kills}\n")
    tmp.replace(cgroup / "memory.events")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("memory")
    cgroup = tmp / "cgroup"
    cgroup.mkdir()
    write_events(cgroup, 0)
    (cgroup / "memory.max").write_text(f"{16 * GIB}\n")
    (cgroup / "memory.current").write_text(f"{3 * GIB}\n")
    server_dir = tmp / "server"
    server_dir.mkdir()
    server = start_server(
        server_dir,
        {"WORKBENCH_SIMULATED_GPUS": "1", "WORKBENCH_MEMORY_CGROUP": str(cgroup)},
        app="lab",
        interval=1.0,
    )
    server.root = server_dir / "root"
    server.cgroup = cgroup
    yield server
    stop_server(server)


def write_notebook(server, name: str, source: str) -> None:
    cell = {"cell_type": "code", "source": source, "metadata": {}, "outputs": [], "execution_count": None}
    nb = {
        "cells": [cell],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (server.root / name).write_text(json.dumps(nb))


def open_notebook(page, server, name: str) -> None:
    from playwright.sync_api import expect

    page.goto(f"{server.url}lab/tree/{name}?reset&token={server.token}", wait_until="domcontentloaded")
    expect(page.locator(".jp-Notebook .jp-Cell")).to_have_count(1, timeout=90_000)
    kernel_ready(server, name)


def api(server, path: str):
    response = requests.get(server.url + path, headers={"Authorization": f"token {server.token}"}, timeout=10)
    response.raise_for_status()
    return response.json()


def kernel_pid(server, name: str) -> int:
    """The notebook's kernel process: the one started with its connection file."""
    deadline = time.time() + 30
    while time.time() < deadline:
        kernel_id = next((s["kernel"]["id"] for s in api(server, "api/sessions") if s["path"].endswith(name)), None)
        if kernel_id:
            marker = f"kernel-{kernel_id}.json".encode()
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit():
                    try:
                        if marker in (entry / "cmdline").read_bytes():
                            return int(entry.name)
                    except OSError:
                        continue
        time.sleep(0.5)
    raise AssertionError(f"no kernel process for {name}")


def wait_for(predicate, seconds: float, what: str):
    deadline = time.time() + seconds
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"not within {seconds} s: {what}")


def test_a_kernel_killed_for_memory_says_so_and_another_death_does_not(chromium_browser, labextension_built, lab):
    from playwright.sync_api import expect

    write_notebook(lab, "load.ipynb", "data = list(range(10))")
    page = chromium_browser.new_page(viewport={"width": 1400, "height": 900})
    with explained(page, "monitor-kernel-oom", lab.log_text):
        open_notebook(page, lab, "load.ipynb")
        memory = api(lab, "api/gpu/memory")
        assert memory["limit_bytes"] == 16 * GIB, memory
        assert memory["oom_kills"] == 0, memory

        # A kernel that dies without an OOM kill: JupyterLab restarts it, and nothing speaks of memory.
        first = kernel_pid(lab, "load.ipynb")
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: kernel_pid(lab, "load.ipynb") != first, 60, "the kernel restarted")
        kernel_ready(lab, "load.ipynb")
        page.wait_for_timeout(6_000)  # the lab asked api/gpu/memory, twice
        assert page.get_by_text("reached its memory limit").count() == 0

        # The OOM killer: the cgroup counts the kill as the kernel's process dies.
        pid = kernel_pid(lab, "load.ipynb")
        write_events(lab.cgroup, 1)
        wait_for(lambda: api(lab, "api/gpu/memory")["oom_kills"] == 1, 10, "the server saw the OOM kill")
        os.kill(pid, signal.SIGKILL)
        expect(page.get_by_text(OOM_TEXT).first).to_be_visible(timeout=30_000)
    page.close()


def test_a_cuda_out_of_memory_error_shows_the_gpu_memory_in_the_panel(chromium_browser, labextension_built, lab):
    from playwright.sync_api import expect

    # torch.cuda.OutOfMemoryError's name and message, without torch or a GPU
    raise_oom = (
        'raise type("OutOfMemoryError", (RuntimeError,), {})("CUDA out of memory. Tried to allocate 20.00 GiB. '
        'GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is free.")'
    )
    write_notebook(lab, "train.ipynb", raise_oom)
    page = chromium_browser.new_page(viewport={"width": 1400, "height": 900})
    with explained(page, "monitor-cuda-oom", lab.log_text):
        open_notebook(page, lab, "train.ipynb")
        expect(page.locator(".jp-WorkbenchGPU-status .jp-WorkbenchGPU-gpu")).to_have_count(1, timeout=30_000)
        page.locator(".jp-Notebook .jp-Cell .jp-InputArea-prompt").first.click()
        page.keyboard.press("Control+Enter")
        expect(page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")).to_contain_text(
            "OutOfMemoryError", timeout=30_000
        )
        page.locator(".jp-WorkbenchGPU-status").click()
        line = page.locator("#workbench-gpu-monitor-panel .jp-WorkbenchGPU-oom li").first
        expect(line).to_be_visible(timeout=10_000)
        text = line.inner_text()
        assert re.fullmatch(
            r"CUDA out of memory at \d\d:\d\d:\d\d: GPU 0 had \d+\.\d of 80\.0 GiB in use \(simulated\)", text
        ), text
        assert "train.ipynb" in (line.get_attribute("title") or "")
    page.close()
