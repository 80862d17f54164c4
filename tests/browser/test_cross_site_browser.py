"""Cross-site request forgery against the admin's Chromium (issue 46, item 1).

While the admin is logged in to the hub (http://127.0.0.1:PORT), a page served from another site
(http://127.0.0.2:OTHER, a different host: cross-site for the browser) tries what it can without knowing
the admin's ``_xsrf``: top-level navigations to the old GET links (which authorized, de-authorized and
discarded before), and a form that POSTs to them. None changes a sign-up. The buttons on the hub's own
authorization page do. The hub's cookies in the browser say SameSite=Lax.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import requests

from tests.browser.other_site import other_site
from tests.browser.test_login_to_lab import PASSWORD, log_in, sign_up
from tests.conftest import native_sign_up, sign_up_decision

pytestmark = [pytest.mark.browser, pytest.mark.integration]

STUDENT_PASSWORD = "student-pass-5678"
ATTACKER_HOST = "127.0.0.2"  # loopback, but another host than the hub's 127.0.0.1: another site


def sign_ups(hub) -> dict[str, bool]:
    with sqlite3.connect(hub.data_dir / "jupyterhub.sqlite") as db:
        return {name: bool(ok) for name, ok in db.execute("SELECT username, is_authorized FROM users_info")}


def forged_pages(directory: Path, hub_url: str) -> None:
    """What another site can do without the admin's _xsrf: navigate to a link, or post a form."""
    for name, target in [
        ("authorize-eve", "/hub/authorize/eve"),
        ("unauthorize-bob", "/hub/authorize/bob"),
        ("discard-mallory", "/hub/discard/mallory"),
    ]:
        (directory / f"{name}.html").write_text(
            f"<!doctype html><title>cute cats</title><script>location.href = {hub_url + target!r};</script>"
        )
    (directory / "post-authorize-eve.html").write_text(
        "<!doctype html><title>cute cats</title>"
        f'<form id="f" method="post" action="{hub_url}/hub/authorize/eve">'
        '<input type="hidden" name="action" value="authorize"></form>'
        "<script>document.getElementById('f').submit();</script>"
    )


def test_another_site_cannot_authorize_unauthorize_or_discard_and_the_buttons_can(
    running_hub, chromium_browser, tmp_path
):
    hub = running_hub({"WORKBENCH_SIMULATED_GPUS": "1"})
    context = chromium_browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(60_000)
    assert "The signup was successful!" in sign_up(page, hub.url, "admin")
    log_in(page, hub.url, "admin")
    page.wait_for_url("**/hub/spawn**")
    # eve and mallory wait for authorization; bob is an authorized student
    for name in ("eve", "mallory", "bob"):
        native_sign_up(requests.Session(), hub.url, name, STUDENT_PASSWORD)
    admin = requests.Session()
    log_in_form = {"username": "admin", "password": PASSWORD}
    admin.get(f"{hub.url}/hub/login", timeout=30)
    admin.post(f"{hub.url}/hub/login", data={**log_in_form, "_xsrf": admin.cookies.get("_xsrf")}, timeout=30)
    assert sign_up_decision(admin, hub.url, "bob", "authorize").status_code == 302
    before = {"admin": True, "eve": False, "mallory": False, "bob": True}
    assert sign_ups(hub) == before

    # The hub's cookies in the admin's browser: SameSite=Lax. (Playwright shows Lax for a cookie that says
    # nothing too; the forged POST below is what tells them apart: Chromium sends a cookie without SameSite
    # on another site's top-level POST for its first two minutes, and this one was set seconds ago.)
    cookies = {c["name"]: c for c in context.cookies()}
    for name in ("jupyterhub-session-id", "jupyterhub-hub-login", "_xsrf"):
        assert cookies[name]["sameSite"] == "Lax", cookies.get(name)

    site = tmp_path / "attacker"
    site.mkdir()
    forged_pages(site, hub.url)
    with other_site(site, ATTACKER_HOST) as attacker:
        # Top-level navigations: the login cookies go along (Lax), and the hub answers 405, changing nothing.
        for forged in ("authorize-eve", "unauthorize-bob", "discard-mallory"):
            with page.expect_response(lambda r: r.url.startswith(hub.url + "/hub/")) as answer:
                page.goto(f"{attacker}/{forged}.html")
            assert answer.value.status == 405, (forged, answer.value.status)
            # SameSite=Lax lets the login cookie through on a top-level GET: the 405 is what protects here.
            assert "jupyterhub-hub-login=" in answer.value.request.all_headers().get("cookie", ""), forged
            page.wait_for_load_state()
            assert "A link cannot" in page.inner_text("body"), forged
            assert sign_ups(hub) == before, forged
        # A form another site submits: no _xsrf it could know, and no login cookie either (Lax).
        with page.expect_response(lambda r: r.url == f"{hub.url}/hub/authorize/eve") as answer:
            page.goto(f"{attacker}/post-authorize-eve.html")
        assert answer.value.status == 403, answer.value.status
        assert "jupyterhub-hub-login=" not in answer.value.request.all_headers().get("cookie", "")
        assert sign_ups(hub) == before
    assert hub.api("GET", "/users/eve").status_code == 404

    # The authorization page's own buttons act.
    page.goto(f"{hub.url}/hub/authorize")
    page.click('tr[id="eve"] button:text-is("Authorize")')
    page.wait_for_selector('tr[id="eve"].success')
    page.click('tr[id="bob"] button:text-is("Unauthorize")')
    page.wait_for_selector('tr[id="bob"]:not(.success)')
    page.click('tr[id="mallory"] button:text-is("Discard")')
    page.wait_for_selector('tr[id="eve"]')
    assert page.locator('tr[id="mallory"]').count() == 0
    assert sign_ups(hub) == {"admin": True, "eve": True, "bob": False}
    assert hub.api("GET", "/users/eve").status_code == 200  # authorizing made her hub user
    context.close()
