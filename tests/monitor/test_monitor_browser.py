"""JupyterLab in Debian's Chromium: the status bar shows the simulated GPU and the panel draws charts.

Needs /usr/bin/chromium (or WORKBENCH_CHROMIUM) and the built labextension;
skips with the reason otherwise, fails instead when WORKBENCH_STRICT_TESTS=1.
"""

from __future__ import annotations

import re
import time

import pytest

from tests.monitor.monitor_support import start_server, stop_server

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lab")
    server = start_server(
        tmp,
        {"WORKBENCH_SIMULATED_GPUS": "4", "WORKBENCH_GPUS": "GPU-sim-02-h100-80gb"},
        app="lab",
        interval=1.0,
    )
    yield server
    stop_server(server)


def test_status_bar_and_panel(chromium_browser, labextension_built, lab_server, artifacts_dir):
    from playwright.sync_api import expect

    page = chromium_browser.new_page(viewport={"width": 1400, "height": 900})
    console_errors = []
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    page.goto(f"{lab_server.url}lab?token={lab_server.token}", wait_until="domcontentloaded")

    status = page.locator(".jp-WorkbenchGPU-status")
    gpu = status.locator(".jp-WorkbenchGPU-gpu")
    expect(gpu).to_have_count(1, timeout=90_000)
    expect(status).to_contain_text("simulated")
    pattern = re.compile(r"^GPU0 \d+% \d+\.\d/80\.0 GiB$")
    first = gpu.inner_text().strip()
    assert pattern.match(first), first

    # numbers move: the simulated source changes every second
    seen = {first}
    deadline = time.time() + 15
    while len(seen) < 3 and time.time() < deadline:
        page.wait_for_timeout(1000)
        seen.add(gpu.inner_text().strip())
    assert len(seen) >= 3, seen
    assert all(pattern.match(s) for s in seen), seen

    # the panel opens from the status bar and draws a chart per metric
    status.click()
    panel = page.locator("#workbench-gpu-monitor-panel")
    expect(panel).to_be_visible(timeout=10_000)
    expect(panel).to_contain_text("simulated GPUs")
    cards = panel.locator(".jp-WorkbenchGPU-card")
    expect(cards).to_have_count(1)
    assert cards.get_attribute("data-uuid") == "GPU-sim-02-h100-80gb"
    assert "GPU-sim-00" not in panel.inner_text()
    page.wait_for_timeout(3000)  # a few samples so every line has segments
    for metric in ("util", "mem", "temp", "power"):
        path = panel.locator(f'.jp-WorkbenchGPU-chart[data-metric="{metric}"] path.jp-WorkbenchGPU-line')
        d = path.get_attribute("d") or ""
        assert d.startswith("M"), (metric, d)
        assert "L" in d, (metric, d)
    # drawn, not just present: the line has a real extent on screen
    # (one evaluate, because the line is redrawn every second)
    width = page.evaluate(
        """() => document.querySelector(
            '#workbench-gpu-monitor-panel .jp-WorkbenchGPU-chart[data-metric="util"] path.jp-WorkbenchGPU-line'
        ).getBoundingClientRect().height"""
    )
    assert width > 0
    expect(panel.locator(".jp-WorkbenchGPU-procs")).to_contain_text("python (simulated)")
    page.screenshot(path=str(artifacts_dir / "gpu-monitor-lab.png"))

    # A hidden tab stops streaming; showing it again reconnects.
    def stream_clients():
        return lab_server.get("api/gpu/metrics").json()["monitor"]["clients"]

    def wait_clients(expected):
        deadline = time.time() + 15
        while time.time() < deadline and stream_clients() != expected:
            page.wait_for_timeout(300)
        return stream_clients()

    assert wait_clients(1) == 1
    set_hidden = """(hidden) => {
        Object.defineProperty(document, 'hidden', {value: hidden, configurable: true});
        document.dispatchEvent(new Event('visibilitychange'));
    }"""
    page.evaluate(set_hidden, True)
    assert wait_clients(0) == 0
    page.evaluate(set_hidden, False)
    assert wait_clients(1) == 1

    # PyTorch memory per notebook: the panel asks the kernel on its control channel
    nb = {
        "type": "notebook",
        "content": {
            "cells": [
                {
                    "cell_type": "code",
                    "source": "%load_ext workbench_gpu_monitor",
                    "metadata": {},
                    "outputs": [],
                    "execution_count": None,
                }
            ],
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            "nbformat": 4,
            "nbformat_minor": 5,
        },
    }
    import requests

    requests.put(
        f"{lab_server.url}api/contents/train.ipynb",
        json=nb,
        headers={"Authorization": f"token {lab_server.token}"},
        timeout=10,
    ).raise_for_status()
    page.goto(f"{lab_server.url}lab/tree/train.ipynb?token={lab_server.token}", wait_until="domcontentloaded")
    expect(page.locator(".jp-Notebook .jp-Cell")).to_have_count(1, timeout=60_000)
    expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")).to_have_count(1, timeout=60_000)
    # Load the kernel side through the kernel's own connection file, as a
    # notebook cell would (driving the editor is not what this test is about).
    from jupyter_client import BlockingKernelClient

    kernel_id = None
    for _ in range(60):
        sessions = requests.get(
            f"{lab_server.url}api/sessions", headers={"Authorization": f"token {lab_server.token}"}, timeout=10
        ).json()
        kernel_id = next((s["kernel"]["id"] for s in sessions if s["path"].endswith("train.ipynb")), None)
        if kernel_id:
            break
        page.wait_for_timeout(500)
    if not kernel_id:
        page.screenshot(path=str(artifacts_dir / "gpu-monitor-no-kernel.png"))
    assert kernel_id, "the notebook's kernel did not start"
    kc = BlockingKernelClient(connection_file=str(lab_server.runtime_dir / f"kernel-{kernel_id}.json"))
    kc.load_connection_file()
    kc.start_channels()
    try:
        reply = kc.execute("%load_ext workbench_gpu_monitor", reply=True, timeout=30)
        assert reply["content"]["status"] == "ok"
    finally:
        kc.stop_channels()
    page.locator(".jp-WorkbenchGPU-status").click()
    panel = page.locator("#workbench-gpu-monitor-panel")
    expect(panel.locator(".jp-WorkbenchGPU-torch")).to_contain_text("train.ipynb: torch not imported", timeout=20_000)
    page.screenshot(path=str(artifacts_dir / "gpu-monitor-notebook.png"))
    assert not [e for e in console_errors if "gpu" in e.lower()], console_errors


def test_cpu_only_server_says_no_gpu_assigned(chromium_browser, labextension_built, tmp_path):
    from playwright.sync_api import expect

    server = start_server(tmp_path, {"WORKBENCH_SIMULATED_GPUS": "4", "WORKBENCH_GPUS": ""}, app="lab")
    try:
        page = chromium_browser.new_page()
        page.goto(f"{server.url}lab?token={server.token}", wait_until="domcontentloaded")
        expect(page.locator(".jp-WorkbenchGPU-status")).to_contain_text("no GPU assigned", timeout=90_000)
    finally:
        stop_server(server)
