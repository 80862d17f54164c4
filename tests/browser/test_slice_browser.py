"""A student in Chromium picks a MIG slice on the spawn form and sees it, and its GPU, in the lab's panel."""

from __future__ import annotations

import pytest

from tests.browser.test_login_to_lab import _artifact, log_in, sign_up
from tests.conftest import process_env
from tests.lab_browser import wait_for_lab

pytestmark = [pytest.mark.browser, pytest.mark.integration]


def test_the_form_offers_slices_and_the_panel_names_the_slice_and_its_gpu(running_hub, chromium_browser):
    from playwright.sync_api import expect

    hub = running_hub(
        {"WORKBENCH_SIMULATED_GPUS": "1xH200-141GB:mig=7x1g.18gb,2xH100-80GB"},
        ["--GPUSpawnerMixin.default_max_gpus=2"],
    )
    page = chromium_browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(60_000)
    assert "The signup was successful!" in sign_up(page, hub.url, "admin")
    log_in(page, hub.url, "admin")
    page.wait_for_url("**/hub/spawn**")

    kind = page.locator("#workbench-gpu-kind")
    options = [o.strip() for o in kind.locator("option").all_inner_texts()]
    assert options == ["Whole GPUs: 2 of 2 free", "1 \u00d7 1g.18gb slice of an H200-141GB, 18 GB: 7 of 7 free"]
    # One slice per server: picking a slice caps the number at 1 (and lowers a 2 to it); whole GPUs lift the cap.
    gpus = page.locator("#workbench-gpus")
    expect(gpus).to_have_attribute("max", "2")
    gpus.fill("2")
    kind.select_option("1g.18gb")
    expect(gpus).to_have_attribute("max", "1")
    expect(gpus).to_have_value("1")
    kind.select_option("")
    expect(gpus).to_have_attribute("max", "2")
    kind.select_option("1g.18gb")
    page.screenshot(path=str(_artifact("spawn-form-slices.png")), full_page=True)
    page.click("form#spawn_form [type=submit]")
    wait_for_lab(page, hub.url, "admin", log=hub.log)

    (leased,) = hub.leases()["admin"]
    assert leased.startswith("MIG-sim-00-h200-141gb-")
    assert leased.endswith("-1g.18gb")
    env = process_env(int(hub.server("admin")["state"]["pid"]))
    assert env["WORKBENCH_GPUS"] == env["CUDA_VISIBLE_DEVICES"] == leased

    # The status bar says plainly that a slice has no utilization reading; the panel names slice and GPU.
    status = page.locator(".jp-WorkbenchGPU-status")
    expect(status.locator(".jp-WorkbenchGPU-gpu")).to_contain_text("n/a (MIG)", timeout=90_000)
    status.click()
    card = page.locator(f'#workbench-gpu-monitor-panel .jp-WorkbenchGPU-card[data-uuid="{leased}"]')
    expect(card.locator(".jp-WorkbenchGPU-slice")).to_have_text(
        "MIG slice 1g.18gb of GPU 0 (GPU-sim-00-h200-141gb): NVML has no utilization counter for a MIG slice, "
        "only its memory",
        timeout=30_000,
    )
    page.screenshot(path=str(_artifact("lab-slice-panel.png")))
