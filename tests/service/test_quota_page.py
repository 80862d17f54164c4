"""In Chromium: an admin sets a student's GPU quota to 0 on the workbench page,
the student's next GPU spawn is refused with the quota message; the admin
raises it and the spawn succeeds."""

from __future__ import annotations

import pytest

from tests.service.conftest import ARTIFACTS, browser_flow, shut_down, start_workbench_hub

pytestmark = [pytest.mark.browser, pytest.mark.integration]


@pytest.fixture
def hub(tmp_path):
    hub = start_workbench_hub(tmp_path / "hub", {"WORKBENCH_SIMULATED_GPUS": "4", "WORKBENCH_ADMIN_USERS": "admin"})
    yield hub
    shut_down(hub)


def set_quota(page, name: str, max_gpus: int) -> None:
    page.select_option("#quota-kind", "user")
    page.fill("#quota-name", name)
    page.fill("#quota-max-gpus", str(max_gpus))
    page.click("#quota-save")
    page.wait_for_selector("#quota-status.alert-success")
    page.wait_for_load_state()
    page.wait_for_selector(f'tr[data-user="{name}"] .wb-max:text-is("{max_gpus}")')


def test_admin_sets_a_quota_on_the_page_and_the_next_spawn_follows_it(hub, chromium_browser):
    flow = browser_flow()
    admin = chromium_browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
    student = chromium_browser.new_context(viewport={"width": 1200, "height": 900}).new_page()
    for page in (admin, student):
        page.set_default_timeout(60_000)

    assert "The signup was successful!" in flow.sign_up(admin, hub.url, "admin")
    flow.log_in(admin, hub.url, "admin")
    admin.wait_for_url("**/hub/spawn**")
    assert "sent to the admin" in flow.sign_up(student, hub.url, "student")
    # The Authorize button on the authorization page (a POST with the page's _xsrf).
    admin.goto(f"{hub.url}/hub/authorize")
    admin.click('tr[id="student"] button:text-is("Authorize")')
    admin.wait_for_selector('tr[id="student"].success')

    # The student opens the spawn form while the default quota (1) holds.
    flow.log_in(student, hub.url, "student")
    student.wait_for_url("**/hub/spawn**")
    assert student.inner_text("#workbench-quota") == "1"
    assert "4 of 4 GPUs free" in student.inner_text("#workbench-free")

    # The admin opens the workbench page (OAuth through the hub) and sets the quota to 0.
    admin.goto(f"{hub.url}/services/workbench/")
    admin.wait_for_selector("#workbench-user-table")
    assert "Simulated GPUs" in admin.inner_text("#workbench-simulated-note")
    assert admin.locator("#workbench-gpu-table tbody tr").count() == 4
    set_quota(admin, "student", 0)
    assert admin.inner_text('tr[data-user="student"] .wb-origin') == "own quota"
    # A cookie request without the XSRF token changes nothing.
    status = admin.evaluate(
        """() => fetch("api/quotas/users/student", {method: "PUT", credentials: "same-origin",
              headers: {"Content-Type": "application/json"}, body: JSON.stringify({max_gpus: 4})})
              .then(r => r.status)"""
    )
    assert status == 403
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    admin.screenshot(path=str(ARTIFACTS / "workbench-admin.png"), full_page=True)

    # The student's next GPU spawn is refused with the quota message.
    student.fill("#workbench-gpus", "1")
    student.click("form#spawn_form [type=submit]")
    student.wait_for_selector("text=your own GPU quota allows 0 at once")
    assert "ask a hub admin" in student.inner_text("body")
    student.screenshot(path=str(ARTIFACTS / "workbench-quota-refused.png"), full_page=True)
    assert hub.leases().get("student") is None

    # The admin raises it; the spawn succeeds.
    set_quota(admin, "student", 1)
    student.goto(f"{hub.url}/hub/spawn")
    student.wait_for_selector("#workbench-gpus")
    assert student.inner_text("#workbench-quota") == "1"
    student.fill("#workbench-gpus", "1")
    student.click("form#spawn_form [type=submit]")
    student.wait_for_url("**/user/student/**", timeout=120_000)
    hub.wait_ready("student")
    assert len(hub.leases()["student"]) == 1
    admin.reload()
    admin.wait_for_selector('#workbench-gpu-table .wb-holder:text-is("student")')
