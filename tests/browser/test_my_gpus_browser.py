"""In Chromium: a student logs in and opens My GPUs from the hub's home page; the admin's fleet page cannot be
shown in a frame of another page of the same site, and its Drain button asks before it drains."""

from __future__ import annotations

import pytest

from tests.browser.other_site import other_site
from tests.conftest import wait_until
from tests.integration.sign_ups import admin_session, authorized_student
from tests.integration.sign_ups import browser_log_in as log_in
from tests.service.conftest import shut_down, start_workbench_hub

pytestmark = [pytest.mark.browser, pytest.mark.integration]

HELD = "GPU-sim-00-h100-80gb"


@pytest.fixture
def hub(tmp_path):
    hub = start_workbench_hub(tmp_path / "hub", {"WORKBENCH_SIMULATED_GPUS": "2", "WORKBENCH_ADMIN_USERS": "admin"})
    yield hub
    shut_down(hub)


def test_a_student_opens_my_gpus_from_the_hub_home_page(hub, chromium_browser):
    authorized_student(admin_session(hub), hub, "student")
    page = chromium_browser.new_page(viewport={"width": 1300, "height": 900})
    page.set_default_timeout(60_000)
    log_in(page, hub, "student")

    page.goto(f"{hub.url}/hub/home")
    page.click("#workbench-my-gpus-link")  # through the hub's OAuth to the service, as a browser does
    page.wait_for_url(f"{hub.url}/services/workbench/me")
    page.wait_for_selector("#my-quota")
    assert page.inner_text("#my-name") == "student"
    assert page.inner_text("#my-max-gpus") == "1"
    assert page.inner_text("#my-quota-origin") == "(default)"
    assert page.inner_text("#my-gpu-hours") == "0.00 GPU-hours used; no weekly limit."
    assert "No server running." in page.inner_text("#my-server-table")
    assert "None of your servers has ended yet." in page.inner_text("#my-stops-table")
    assert "Simulated GPUs." in page.inner_text("#my-simulated-note")
    assert page.locator("#nav-fleet").count() == 0, "no link to a page she may not read"

    # The service's front page is her My GPUs too, not a refusal; the fleet stays the readers'.
    page.goto(f"{hub.url}/services/workbench/")
    page.wait_for_selector("#my-quota")
    assert page.locator("#workbench-gpu-table").count() == 0
    answer = page.evaluate("() => fetch('api/gpus', {credentials: 'same-origin'}).then(r => r.status)")
    assert answer == 403


def test_the_fleet_page_cannot_be_framed_and_its_drain_button_asks_first(hub, chromium_browser, tmp_path):
    admin_session(hub)
    hub.create_users("student")
    assert hub.spawn("student", gpus=1).status_code in (201, 202)
    hub.wait_ready("student")
    assert hub.leases() == {"student": [HELD]}
    context = chromium_browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(60_000)
    log_in(page, hub, "admin")
    page.goto(f"{hub.url}/services/workbench/")
    page.wait_for_selector("#workbench-gpu-table")

    # Another page of the same site frames the fleet page, and a page of its own as the control.
    fleet = f"{hub.url}/services/workbench/"
    said: list[str] = []
    page.on("console", lambda message: said.append(message.text))
    failed: list[str] = []
    page.on("requestfailed", lambda request: failed.append(request.failure or "") if request.url == fleet else None)
    (tmp_path / "control.html").write_text('<p id="inside">a page that may be framed</p>')
    with other_site(tmp_path) as site:
        (tmp_path / "attack.html").write_text(
            f'<iframe src="{fleet}"></iframe><iframe src="{site}/control.html"></iframe>'
        )
        with page.expect_response(fleet) as framed:
            page.goto(f"{site}/attack.html")
        wait_until(
            lambda: any(f.url == f"{site}/control.html" and f.query_selector("#inside") for f in page.frames),
            30,
            "the control frame",
        )
        page.wait_for_timeout(1000)
        # The service answered the frame's request with the admin's fleet page (200: their cookies went with
        # it; without them, a 302 to the login); the browser refused to show it there, for its frame-ancestors.
        assert framed.value.status == 200
        assert framed.value.headers["content-type"].startswith("text/html")
        assert failed == ["net::ERR_BLOCKED_BY_RESPONSE"]
        assert any("frame-ancestors 'none'" in text and "blocked" in text for text in said), said
        assert not [f.url for f in page.frames if f.query_selector("#workbench-gpu-table")], "the fleet page was framed"

    # Drain asks first, saying what will happen; a No changes nothing.
    page.goto(f"{hub.url}/services/workbench/")
    button = page.locator(f'tr[data-uuid="{HELD}"] .wb-drain-button')
    asked: list[str] = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.dismiss()))
    button.click()
    page.wait_for_selector('#drain-status:has-text("Not drained: nothing was changed.")')
    assert asked == [
        "Drain GPU 0 (H100-80GB)? No new server will get it. Its server (student) keeps running until it stops."
    ]
    assert hub.service("GET", "api/drains").json()["drains"] == []
    # With a countdown the sentence says when its server stops; a Yes drains.
    page.fill("#drain-stop-minutes", "15")
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept()))
    button.click()
    page.wait_for_selector("#drain-status.alert-success")
    assert asked[1] == (
        "Drain GPU 0 (H100-80GB)? No new server will get it. Its server (student) will be stopped in 15 minutes, "
        "warned now; open notebooks are saved first."
    )
    assert [d["gpu_uuid"] for d in hub.service("GET", "api/drains").json()["drains"]] == [HELD]
    context.close()
