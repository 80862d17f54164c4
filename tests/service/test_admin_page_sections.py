"""In Chromium, the admin page's reservation and idle-exemption sections: what an admin types
there reaches the API (and only valid input does), and deleting from the page asks first, then removes it.

Both sections and the quota editor share one API client (static/api_client.js), so this
also shows that the sections still talk to the service after that was folded into one."""

from __future__ import annotations

import pytest

from tests.service.conftest import ARTIFACTS, browser_flow, shut_down, start_workbench_hub

pytestmark = [pytest.mark.browser, pytest.mark.integration]


@pytest.fixture
def hub(tmp_path):
    hub = start_workbench_hub(
        tmp_path / "hub",
        {"WORKBENCH_SIMULATED_GPUS": "4", "WORKBENCH_ADMIN_USERS": "admin", "WORKBENCH_TIME_ZONE": "UTC"},
    )
    yield hub
    shut_down(hub)


def listed(hub, path: str, key: str) -> list[dict]:
    r = hub.service("GET", path)
    assert r.status_code == 200, r.text
    return r.json()[key]


def reserve(page, group: str, gpus: int, window: str) -> str:
    page.fill("#reservation-group", group)
    page.fill("#reservation-gpus", str(gpus))
    page.fill("#reservation-window", window)
    # Forget the previous answer first, so the wait below is for this one.
    page.evaluate("document.getElementById('reservation-status').className = ''")
    page.click("#reservation-save")
    # (A selector, not wait_for_function: the service's CSP runs no script Playwright would evaluate as a string.)
    page.wait_for_selector("#reservation-status[class*='alert-']")
    return page.inner_text("#reservation-status")


def test_admin_reserves_exempts_and_deletes_on_the_page(hub, chromium_browser):
    flow = browser_flow()
    hub.create_users("stud")
    assert hub.api("POST", "/groups/ml-course").status_code in (201, 409)
    assert hub.api("POST", "/groups/ml-course/users", json={"users": ["stud"]}).status_code == 200
    page = chromium_browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
    page.set_default_timeout(60_000)
    assert "The signup was successful!" in flow.sign_up(page, hub.url, "admin")
    flow.log_in(page, hub.url, "admin")
    page.wait_for_url("**/hub/spawn**")

    page.goto(f"{hub.url}/services/workbench/")
    page.wait_for_selector('#reservation-rows td:text-is("none")')
    assert page.inner_text("#reservation-zone") == "(times in UTC)"

    # Refused input shows the service's sentence and stores nothing.
    said = reserve(page, "ml-course", 2, "Tue 25:00-12:00")
    assert page.locator("#reservation-status.alert-danger").count() == 1
    assert said.startswith("Not reserved: "), said
    assert "25:00" in said, said
    said = reserve(page, "no-such-group", 2, "Tue 10:00-12:00")
    assert "no group named" in said, said
    said = reserve(page, "ml-course", 5, "Tue 10:00-12:00")
    assert page.locator("#reservation-status.alert-danger").count() == 1, said
    assert listed(hub, "api/reservations", "reservations") == []

    # A valid one is stored as typed and listed.
    said = reserve(page, "ml-course", 2, "Tue 10:00-12:00")
    assert page.locator("#reservation-status.alert-success").count() == 1, said
    [stored] = listed(hub, "api/reservations", "reservations")
    assert (stored["group"], stored["gpus"], stored["window"], stored["weekly"]) == (
        "ml-course",
        2,
        "Tue 10:00-12:00",
        True,
    )
    row = page.locator(f'#reservation-rows tr[data-id="{stored["id"]}"]')
    row.wait_for()
    assert "weekly Tue 10:00-12:00" in row.inner_text()
    assert "ml-course" in row.inner_text()

    # The idle section: exempt the group, then see it listed by the API and on the page.
    page.fill("#idle-exempt-group", "ml-course")
    page.fill("#idle-exempt-reason", "long CPU preprocessing")
    page.click("#idle-exempt-save")
    page.wait_for_selector('#idle-exempt-table td:text-is("ml-course")')
    assert [e["group"] for e in listed(hub, "api/idle/exemptions", "exempt_groups")] == ["ml-course"]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "workbench-reservations.png"), full_page=True)

    # Deleting from the page asks first, saying what happens; then it is gone from the API too.
    asked: list[str] = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept()))
    row.locator("button:text-is('Delete')").click()
    page.wait_for_selector('#reservation-rows td:text-is("none")')
    assert asked == [
        f"Delete reservation #{stored['id']} (ml-course: 2 GPUs, weekly Tue 10:00-12:00)? Its GPUs go back to "
        "everyone; servers running now are not stopped."
    ]
    assert "Deleted reservation" in page.inner_text("#reservation-status")
    assert listed(hub, "api/reservations", "reservations") == []

    # Ending an exemption asks too; a No keeps it.
    end = page.locator('#idle-exempt-table tr[data-group="ml-course"] .idle-unexempt')
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.dismiss()))
    end.click()
    page.wait_for_selector('#idle-status:has-text("Not changed: group ml-course stays exempt.")')
    assert asked[1] == (
        "End the idle exemption of group ml-course? From the next check, its members' servers whose GPUs stay "
        "idle are warned and stopped again."
    )
    assert [e["group"] for e in listed(hub, "api/idle/exemptions", "exempt_groups")] == ["ml-course"]
    page.once("dialog", lambda dialog: dialog.accept())
    end.click()
    page.wait_for_selector('#idle-exempt-table td:text-is("No group is exempt.")')
    assert listed(hub, "api/idle/exemptions", "exempt_groups") == []
