"""A student on a time-sliced GPU sees in JupyterLab's status bar whether, and with how many, others share it:
the spawn form, the workbench service's push to the server's monitor and the lab's status bar, end to end."""

from __future__ import annotations

import pytest

from tests.browser.test_login_to_lab import _artifact, log_in, sign_up
from tests.lab_browser import wait_for_lab

pytestmark = [pytest.mark.browser, pytest.mark.integration]

T4 = "GPU-sim-00-t4-16gb"


def test_the_status_bar_says_who_shares_the_gpu(running_hub, chromium_browser):
    from playwright.sync_api import expect

    hub = running_hub(
        {
            "WORKBENCH_SIMULATED_GPUS": "1xT4-16GB",
            "WORKBENCH_SERVERS_PER_GPU": "1,T4-16GB=2",
            "WORKBENCH_GPU_IDLE_CHECK_SECONDS": "1",  # the service's pass that delivers notices and sharing
        }
    )
    page = chromium_browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(60_000)
    assert "The signup was successful!" in sign_up(page, hub.url, "admin")
    log_in(page, hub.url, "admin")
    page.wait_for_url("**/hub/spawn**")
    expect(page.locator("#workbench-gpu-table")).to_contain_text("free (time-sliced: up to 2 servers)")
    page.click("form#spawn_form [type=submit]")
    wait_for_lab(page, hub.url, "admin", log=hub.log)
    assert hub.leases()["admin"] == [T4]

    # Alone on it: said so (the lab polls every 10 s; the service pushes every second).
    status = page.locator(".jp-WorkbenchGPU-notice")
    expect(status).to_have_text("GPU time-sliced: yours alone now", timeout=60_000)
    assert status.get_attribute("data-kind") == "shared"

    # A second student starts on the same GPU: the first one's status bar counts them.
    hub.create_users("bob")
    assert hub.spawn("bob", gpus=1).status_code in (201, 202)
    hub.wait_ready("bob", timeout=180)
    assert hub.leases()["bob"] == [T4]
    expect(status).to_have_text("GPU shared with 1 other", timeout=60_000)
    assert f"{T4}: time-sliced, up to 2 servers; 1 other server on it now" in status.get_attribute("title")
    page.screenshot(path=str(_artifact("lab-shared-gpu-status.png")))

    # And forgets them when they leave.
    assert hub.api("DELETE", "/users/bob/server").status_code in (202, 204)
    hub.wait_stopped("bob", timeout=120)
    expect(status).to_have_text("GPU time-sliced: yours alone now", timeout=60_000)
