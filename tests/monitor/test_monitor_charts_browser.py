"""The panel's charts in Debian's Chromium, after a minute of samples: axes, units, backfill, torch memory.

The server samples once a second (the default) and the browser opens only
once the server holds a minute of history, so the charts can only show that
minute if the panel backfills it from ``api/gpu/metrics?history=1`` (a tab
opened late); a tab hidden for longer than the gap rule must come back with
no gap.  A stand-in ``torch`` module in the notebook's kernel (no CUDA on the
test machines) reports 4 GiB reserved / 2.5 GiB allocated over the kernel's
control channel, as real torch would, so the memory chart shows the
caching allocator beside the device total.  Also checks that JupyterLab's
"get notified about official Jupyter news?" prompt is off in this
environment's settings (``share/jupyter/lab/settings/overrides.json``,
written by ``make install``).

The screenshot goes to tests/artifacts/gpu-monitor-charts.png.
"""

from __future__ import annotations

import re
import time

import pytest

from tests.monitor.monitor_support import requests, start_server, stop_server

pytestmark = pytest.mark.browser

HELD = "GPU-sim-02-h100-80gb"
HISTORY_SECONDS = 60
GIB = 1 << 30

FAKE_TORCH = f"""
import sys, types
class _Props:
    uuid = {HELD!r}
_cuda = types.SimpleNamespace(
    is_available=lambda: True, is_initialized=lambda: True, device_count=lambda: 1,
    memory_allocated=lambda i: {int(2.5 * GIB)}, memory_reserved=lambda i: {4 * GIB},
    get_device_properties=lambda i: _Props())
sys.modules["torch"] = types.SimpleNamespace(__version__="0.0+stand-in", cuda=_cuda)
"""

NOTEBOOK = {
    "cells": [{"cell_type": "code", "source": "x = 1", "metadata": {}, "outputs": [], "execution_count": None}],
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    "nbformat": 4,
    "nbformat_minor": 5,
}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    server = start_server(
        tmp_path_factory.mktemp("charts"),
        {"WORKBENCH_SIMULATED_GPUS": "4", "WORKBENCH_GPUS": HELD},
        app="lab",
        interval=1.0,
    )
    yield server
    stop_server(server)


def _auth(server):
    return {"Authorization": f"token {server.token}"}


def _history_span(server) -> float:
    ts = server.get("api/gpu/metrics?history=1").json()["history"][HELD]["timestamp"]
    return ts[-1] - ts[0] if ts else 0.0


def _first_x(d: str) -> float:
    return float(re.match(r"M([0-9.]+),", d).group(1))


def test_news_prompt_is_off_in_the_lab_settings(lab):
    r = requests.get(
        f"{lab.url}lab/api/settings/@jupyterlab/apputils-extension:notification", headers=_auth(lab), timeout=10
    )
    r.raise_for_status()
    # jupyterlab_server applies overrides.json to the schema's defaults; no user setting is stored.
    data = r.json()
    defaults = {k: v.get("default") for k, v in data["schema"]["properties"].items()}
    assert defaults["fetchNews"] == "false", defaults
    assert defaults["checkForUpdates"] is False, defaults
    assert "fetchNews" not in data["settings"], data["settings"]


def test_panel_charts_after_a_minute(chromium_browser, labextension_built, lab, artifacts_dir):
    from jupyter_client import BlockingKernelClient
    from playwright.sync_api import expect

    requests.put(
        f"{lab.url}api/contents/train.ipynb",
        json={"type": "notebook", "content": NOTEBOOK},
        headers=_auth(lab),
        timeout=10,
    ).raise_for_status()
    # No tab is open while the server collects its first minute.
    deadline = time.time() + HISTORY_SECONDS + 30
    while _history_span(lab) < HISTORY_SECONDS and time.time() < deadline:
        time.sleep(1)
    assert _history_span(lab) >= HISTORY_SECONDS

    page = chromium_browser.new_page(viewport={"width": 1500, "height": 1300})
    console_errors = []
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    page.goto(f"{lab.url}lab/tree/train.ipynb?token={lab.token}", wait_until="domcontentloaded")
    expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")).to_have_count(1, timeout=90_000)

    # The kernel's torch (a stand-in) holds 4 GiB on this GPU; the panel asks over the control channel.
    kernel_id = None
    for _ in range(60):
        sessions = requests.get(f"{lab.url}api/sessions", headers=_auth(lab), timeout=10).json()
        kernel_id = next((s["kernel"]["id"] for s in sessions if s["path"].endswith("train.ipynb")), None)
        if kernel_id:
            break
        page.wait_for_timeout(500)
    assert kernel_id, "the notebook's kernel did not start"
    kc = BlockingKernelClient(connection_file=str(lab.runtime_dir / f"kernel-{kernel_id}.json"))
    kc.load_connection_file()
    kc.start_channels()
    try:
        for code in (FAKE_TORCH, "%load_ext workbench_gpu_monitor"):
            assert kc.execute(code, reply=True, timeout=30)["content"]["status"] == "ok"
    finally:
        kc.stop_channels()

    page.locator(".jp-WorkbenchGPU-status").click()
    panel = page.locator("#workbench-gpu-monitor-panel")
    expect(panel).to_be_visible(timeout=10_000)
    card = panel.locator(f'.jp-WorkbenchGPU-card[data-uuid="{HELD}"]')
    expect(card).to_contain_text("simulated")

    def chart(metric):
        return card.locator(f'.jp-WorkbenchGPU-chart[data-metric="{metric}"]')

    # y-axes: fixed scales with units; time axis over ten minutes; current value with its unit
    expected_y = {
        "util": ["0%", "50%", "100%"],
        "mem": ["0 GiB", "40 GiB", "80 GiB"],
        "temp": ["0 °C", "50 °C", "100 °C"],
        "power": ["0 W", "350 W", "700 W"],
    }
    units = {"util": r"\d+ %", "mem": r"\d+\.\d GiB", "temp": r"\d+ °C", "power": r"\d+ W"}
    for metric, labels in expected_y.items():
        expect(chart(metric).locator(".jp-WorkbenchGPU-yTick")).to_have_text(labels)
        expect(chart(metric).locator(".jp-WorkbenchGPU-xTick")).to_have_text(["−10 min", "−5 min", "now"])
        expect(chart(metric).locator(".jp-WorkbenchGPU-value")).to_have_text(re.compile(f"^{units[metric]}$"))
    expect(chart("mem")).to_contain_text("of 80.0 GiB")
    expect(chart("power")).to_contain_text("of 700 W limit")

    # the server's minute is on the chart although no tab watched it: the line starts
    # at least ~55 s before "now" on the 600-unit-wide ten-minute plot
    d = chart("util").locator("path.jp-WorkbenchGPU-line").get_attribute("d")
    assert _first_x(d) <= 600 * (1 - 55 / 600), d

    # torch's reservation beside the device total: legend, dashed level, bar segment
    legend = chart("mem").locator(".jp-WorkbenchGPU-legend")
    expect(legend).to_contain_text("train.ipynb: torch reserved 4.0 GiB (allocated 2.5 GiB)", timeout=20_000)
    expect(legend).to_contain_text("device used (NVML)")
    level = chart("mem").locator("path.jp-WorkbenchGPU-reserved").get_attribute("d")
    assert level == "M0,95.0H600", level  # 4 GiB of 80 GiB
    assert chart("mem").locator('.jp-WorkbenchGPU-seg[data-kind="torch"]').count() == 1

    page.wait_for_timeout(1500)
    page.screenshot(path=str(artifacts_dir / "gpu-monitor-charts.png"))
    panel.screenshot(path=str(artifacts_dir / "gpu-monitor-charts-panel.png"))

    # Charts are updated in place: the same path element gets a new `d` on the next sample.
    handle = chart("util").locator("path.jp-WorkbenchGPU-line").element_handle()
    before = handle.get_attribute("d")
    page.wait_for_timeout(2500)
    assert handle.evaluate("n => n.isConnected"), "the chart was rebuilt instead of updated"
    assert handle.get_attribute("d") != before

    # A tab hidden for longer than the gap rule (5 samples) backfills when shown again: no gap.
    set_hidden = """(hidden) => {
        Object.defineProperty(document, 'hidden', {value: hidden, configurable: true});
        document.dispatchEvent(new Event('visibilitychange'));
    }"""
    page.evaluate(set_hidden, True)
    page.wait_for_timeout(8000)
    page.evaluate(set_hidden, False)
    page.wait_for_timeout(3000)
    d = chart("util").locator("path.jp-WorkbenchGPU-line").get_attribute("d")
    assert d.count("M") == 1, "a gap where the tab was hidden"

    # JupyterLab's news prompt never showed (fetchNews is "false" in overrides.json).
    assert page.get_by_text("official Jupyter news").count() == 0
    assert not [e for e in console_errors if "gpu" in e.lower()], console_errors
