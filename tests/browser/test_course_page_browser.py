"""In Chromium: an instructor runs their course from its page without being an admin, and a student sees the
course's quota on the spawn form.

prof is on the staff of ml-101 (named by the admin), whose ceiling is 1 GPU and 10 GPU-hours a week per
student; ann and ben are its students, and nlp is another course. prof opens the course from the Courses
page, sets ben's quota within the ceiling and is refused above it with the API's sentence, books a weekly lab
and exempts the course from idle reclaim for the session, stops ann's
running server after a confirmation (ann is told who stopped it), and is refused on nlp's page. ben's spawn
form then names the course his quota comes from and the GPU-hours he has left.
"""

from __future__ import annotations

import pytest

from tests.conftest import wait_until
from tests.integration.sign_ups import admin_session, authorized_student
from tests.integration.sign_ups import browser_log_in as log_in
from tests.service.conftest import shut_down, start_workbench_hub

pytestmark = [pytest.mark.browser, pytest.mark.integration]

ML = {
    "title": "Machine learning 101",
    "ceiling": {"max_gpus": 1, "gpu_hours_per_week": 10},
    "staff": ["prof"],
    "reservation_gpus": 1,
}


@pytest.fixture
def hub(tmp_path):
    hub = start_workbench_hub(tmp_path / "hub", {"WORKBENCH_SIMULATED_GPUS": "2", "WORKBENCH_ADMIN_USERS": "admin"})
    admin = admin_session(hub)
    for name in ("prof", "ann", "ben"):
        authorized_student(admin, hub, name)
    assert hub.api("POST", "/groups/ml-101", json={"users": ["ann", "ben"]}).status_code == 201
    assert hub.service("PUT", "api/courses/ml-101", json=ML).status_code == 200
    assert hub.service("PUT", "api/courses/nlp", json={"title": "NLP", "ceiling": {"max_gpus": 2}}).status_code == 200
    yield hub
    shut_down(hub)


def test_an_instructor_runs_the_course_from_its_page_and_a_student_sees_its_quota(hub, chromium_browser):
    assert hub.spawn("ann", gpus=1).status_code in (201, 202)
    hub.wait_ready("ann")
    page = chromium_browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(60_000)
    log_in(page, hub, "prof")
    page.goto(f"{hub.url}/services/workbench/courses")  # through the hub's OAuth, as the nav link does
    page.click('#course-list a:has-text("ml-101")')
    page.wait_for_selector("#course-students")
    assert page.inner_text("#course-phase") == "running"
    assert "1 GPU(s) at once, 10 GPU-hours a week" in page.inner_text("#course-ceiling")
    assert page.inner_text('tr[data-student="ann"] .course-held') == "1"
    assert page.locator("tr[data-student]").count() == 2  # ann and ben; prof is staff, not a student

    # A quota within the ceiling; then one above it, refused with the API's sentence, nothing changed.
    ben = page.locator('tr[data-student="ben"]')
    ben.locator('input[name="max_gpus"]').fill("1")
    ben.locator('input[name="gpu_hours_per_week"]').fill("4")
    ben.locator('button[type="submit"]').click()
    page.wait_for_selector("#course-status.alert-success")
    assert "Set ben's quota: 1 GPU(s), 4 GPU-hours a week" in page.inner_text("#course-status")
    page.wait_for_selector('tr[data-student="ben"] .course-quota:has-text("4 h/week")')  # the page reloaded
    ben = page.locator('tr[data-student="ben"]')
    ben.locator('input[name="max_gpus"]').fill("3")
    ben.locator('button[type="submit"]').click()
    page.wait_for_selector("#course-status.alert-danger")
    assert page.inner_text("#course-status") == (
        "Not changed: the course ml-101 may give a student at most 1 GPU at once, not 3; ask a hub admin to raise "
        "the course's ceiling"
    )
    assert hub.service("GET", "api/quotas/users/ben").json()["quota"]["max_gpus"] == 1

    # A weekly lab booked within the allowance, and the course exempt from idle reclaim for the session.
    page.fill('#course-reserve-form input[name="window"]', "Thu 14:00-16:00")
    page.click('#course-reserve-form button[type="submit"]')
    page.wait_for_selector('#course-reservations li:has-text("1 GPU for ml-101, weekly Thu 14:00-16:00")')
    page.fill('#course-exempt-form input[name="hours"]', "2")
    page.fill('#course-exempt-form input[name="reason"]', "Thursday lab")
    page.click('#course-exempt-form button[type="submit"]')
    page.wait_for_selector('#course-exemption:has-text("Exempt from idle reclaim until")')
    assert "Thursday lab" in page.inner_text("#course-exemption")

    # Stop asks first; a Yes stops ann's server, saved first, and she is told who stopped it.
    asked: list[str] = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept()))
    page.locator('tr[data-student="ann"] .course-stop').click()
    page.wait_for_selector("#course-status.alert-success", timeout=90_000)
    assert asked == [
        "Stop the default server of ann? Open notebooks are saved first; ann is told an instructor stopped it. "
        "Their files are kept."
    ]
    hub.wait_stopped("ann")
    assert "stopped by an instructor (prof) of ml-101" in (hub.stop_box("ann") or "")

    # Another course's page is refused, saying why.
    page.goto(f"{hub.url}/services/workbench/courses/nlp")
    assert "only the staff of nlp (its instructors and TAs) or a hub admin may see this course" in page.inner_text(
        "#workbench-refusal"
    )

    # ben's spawn form names his course's quota and what is left of his week.
    student = chromium_browser.new_page(viewport={"width": 1300, "height": 900})
    student.set_default_timeout(60_000)
    log_in(student, hub, "ben")
    wait_until(lambda: student.locator("#workbench-quota").count() == 1, 30, "ben's spawn form")
    said = student.inner_text("#workbench-gpus-help")
    assert "your GPU quota for the course Machine learning 101 (ml-101), set by its staff" in said, said
    assert student.inner_text("#workbench-hours") == "GPU-hours in the last 7 days: 0.0 of 4 (4.0 left)."
