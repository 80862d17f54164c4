"""A person in Chromium sees the idle-GPU warning coming: a JupyterLab notification and a status-bar
countdown, then the server is stopped and the spawn page says why."""

from __future__ import annotations

import re
import time

import pytest

from tests.browser.test_login_to_lab import _artifact, log_in, sign_up
from tests.conftest import write_utilization
from tests.lab_browser import wait_for_lab

pytestmark = [pytest.mark.browser, pytest.mark.integration]

IDLE_MINUTES = 0.75  # 45 s: warned after 22.5 idle seconds, stopped 22.5 s later


def countdown_seconds(text: str) -> int:
    m, s = re.search(r"stops in (\d+):(\d\d)", text).groups()
    return int(m) * 60 + int(s)


def test_the_idle_warning_counts_down_in_jupyterlab_and_the_spawn_page_says_why(
    running_hub, chromium_browser, tmp_path
):
    utilization = tmp_path / "utilization.json"
    write_utilization(utilization, {"*": 80})
    local = tmp_path / "local_config.py"
    local.write_text("c.Spawner.http_timeout = 180\n")  # a busy 2-core host may take over 30 s to start one
    hub = running_hub(
        {
            "WORKBENCH_LOCAL_CONFIG": str(local),
            "WORKBENCH_SIMULATED_GPUS": "1",
            "WORKBENCH_ADMIN_USERS": "admin",
            "WORKBENCH_SIMULATED_UTILIZATION": str(utilization),
            "WORKBENCH_GPU_IDLE_MINUTES": str(IDLE_MINUTES),
            "WORKBENCH_GPU_IDLE_CHECK_SECONDS": "1",
        }
    )
    page = chromium_browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(60_000)
    assert "The signup was successful!" in sign_up(page, hub.url, "admin")
    log_in(page, hub.url, "admin")
    page.wait_for_url("**/hub/spawn**")
    assert page.locator(".workbench-stopped").count() == 0, "nothing to explain before any stop"
    page.locator("#workbench-gpus").fill("1")
    page.click("form#spawn_form [type=submit]")
    wait_for_lab(page, hub.url, "admin", log=hub.log)
    assert page.locator(".jp-WorkbenchGPU-notice").is_hidden(), "a busy GPU gets no warning"

    write_utilization(utilization, {"*": 0})  # the kernel goes quiet: the GPU is idle from now on
    status = page.locator(".jp-WorkbenchGPU-notice")
    status.wait_for(state="visible", timeout=60_000)
    first = status.inner_text()
    assert first.startswith("GPU idle: stops in "), first
    toast = page.get_by_text(re.compile(r"Your server will be stopped at \d\d:\d\d"))
    toast.first.wait_for(state="visible", timeout=20_000)
    page.screenshot(path=str(_artifact("idle-warning.png")))
    time.sleep(2.5)
    second = status.inner_text()
    assert countdown_seconds(second) < countdown_seconds(first) <= IDLE_MINUTES * 60 / 2 + 1, (first, second)
    # The details say how to keep the GPU, and that CPU work belongs on a CPU-only server.
    page.get_by_role("button", name="How to keep it").first.click()
    dialog = page.locator(".jp-WorkbenchGPU-noticeDialog")
    dialog.wait_for(state="visible")
    assert "CPU-only server" in dialog.inner_text()
    assert "use the GPU" in dialog.inner_text()
    page.keyboard.press("Escape")

    hub_stopped = time.monotonic() + 60
    while time.monotonic() < hub_stopped and hub.server("admin") is not None:
        time.sleep(0.5)
    assert hub.server("admin") is None, hub.log()[-3000:]
    page.goto(f"{hub.url}/hub/spawn")
    box = page.locator(".workbench-stopped")
    box.wait_for(state="visible")
    said = box.inner_text()
    assert "idle GPU reclaimed after 45 seconds below 5 % use" in said
    assert "files are kept" in said
    page.screenshot(path=str(_artifact("idle-stopped-spawn-page.png")), full_page=True)
