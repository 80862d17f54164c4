"""A person in Chromium: sign up as admin, log in, pick a GPU, land in JupyterLab."""

from __future__ import annotations

import pytest

from tests.conftest import ARTIFACTS, process_env
from tests.lab_browser import wait_for_lab

pytestmark = [pytest.mark.browser, pytest.mark.integration]

PASSWORD = "correct-horse-battery"


def sign_up(page, hub_url: str, username: str) -> str:
    page.goto(f"{hub_url}/hub/signup")
    page.fill("#username_input", username)
    page.fill("#password_input", PASSWORD)
    page.fill("#password_confirmation_input", PASSWORD)
    page.click("#signup_submit")
    page.wait_for_load_state()
    return page.inner_text("body")


def log_in(page, hub_url: str, username: str) -> None:
    page.goto(f"{hub_url}/hub/login")
    page.fill("#username_input", username)
    page.fill("#password_input", PASSWORD)
    page.click("#login_submit")


def test_admin_signs_up_picks_one_gpu_and_reaches_jupyterlab(running_hub, chromium_browser):
    hub = running_hub({"WORKBENCH_SIMULATED_GPUS": "4", "WORKBENCH_ADMIN_USERS": "admin"})
    page = chromium_browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(60_000)

    assert "The signup was successful!" in sign_up(page, hub.url, "admin")
    # Someone who is not an admin waits for authorization and cannot get in.
    assert "sent to the admin" in sign_up(page, hub.url, "mallory")
    log_in(page, hub.url, "mallory")
    page.wait_for_load_state()
    assert "has not been authorized by an administrator yet" in page.inner_text("body")
    assert "/hub/spawn" not in page.url
    assert "/user/" not in page.url

    log_in(page, hub.url, "admin")
    page.wait_for_url("**/hub/spawn**")
    form = page.locator("#workbench-gpus")
    assert form.get_attribute("max") == "1"
    assert form.input_value() == "1"
    assert "4 of 4 GPUs free" in page.inner_text("#workbench-free")
    assert "Simulated GPUs" in page.inner_text("#workbench-simulated-note")
    page.screenshot(path=str(_artifact("spawn-form.png")), full_page=True)

    form.fill("1")
    page.click("form#spawn_form [type=submit]")
    wait_for_lab(page, hub.url, "admin", log=hub.log)
    page.wait_for_selector(".jp-Launcher, .jp-DirListing-item", timeout=60_000)
    page.screenshot(path=str(_artifact("jupyterlab.png")))

    server = hub.server("admin")
    assert server
    assert server["ready"]
    env = process_env(int(server["state"]["pid"]))
    assert env["WORKBENCH_GPUS"] == "GPU-sim-00-h100-80gb" == env["CUDA_VISIBLE_DEVICES"]
    assert hub.leases() == {"admin": ["GPU-sim-00-h100-80gb"]}
    # The starter notebooks were copied into the home on first start.
    page.wait_for_selector(".jp-DirListing-item[title*='notebooks'], .jp-DirListing-item:has-text('notebooks')")


def _artifact(name: str):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS / name
