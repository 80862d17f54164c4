"""In Chromium: a student logs in through the university's single sign-on page (LemonLDAP::NG, its people and
groups in a real slapd) and the spawn form shows her course's GPU quota; a change of her groups in the
directory reaches the form at her next login; logging out of the hub ends the provider's session too, so the
next login asks for the password again. The same flows without a browser, and the failures, are
tests/integration/test_university_login.py."""

from __future__ import annotations

import pytest

from tests.conftest import ARTIFACTS
from tests.identity.fixtures import directory, sso_provider  # noqa: F401 - fixtures
from tests.integration.test_university_login import oidc_env, set_group_quota

pytestmark = [pytest.mark.browser, pytest.mark.integration]


def open_the_provider_page(page, hub, provider) -> None:
    """The hub's login page and its "Sign in with" button: the provider's own form."""
    page.goto(f"{hub.url}/hub/login")
    page.click("text=Sign in with your university account")
    page.wait_for_url(f"{provider.issuer}/**")
    assert "Authentication portal" in page.title()


def type_the_password(page, name: str, password: str) -> None:
    """The provider's form; with the right password the browser lands on the hub, logged in."""
    page.fill("#userfield", name)
    page.fill("#passwordfield", password)
    page.click("button[type=submit]")


def spawn_form_quota(page, hub) -> tuple[str, str]:
    """The spawn form's GPU quota and the sentence around it (where the quota comes from)."""
    page.goto(f"{hub.url}/hub/spawn")
    page.wait_for_selector("#workbench-quota")
    return page.inner_text("#workbench-quota"), page.inner_text("#workbench-gpus-help")


def back_on_the_hub(page, hub) -> None:
    # Past the hub's OAuth callback (it sets the hub's cookie, then sends the browser on).
    page.wait_for_url(lambda url: url.startswith(f"{hub.url}/hub/") and "oauth_callback" not in url)


def test_a_student_signs_in_through_the_university_page_and_sees_her_courses_quota(
    sso_provider,  # noqa: F811
    running_hub,
    chromium_browser,
):
    hub = running_hub(oidc_env(sso_provider), prepare_one=lambda hub: sso_provider.allow_hub(hub.url))
    set_group_quota(hub, "ml-course", 2)
    password = sso_provider.directory.password("bob")
    page = chromium_browser.new_page(viewport={"width": 1300, "height": 900})
    page.set_default_timeout(60_000)

    # A wrong password is the provider's to refuse: the browser stays on its page, and tries again there.
    open_the_provider_page(page, hub, sso_provider)
    type_the_password(page, "bob", "not-his-password")
    page.wait_for_selector(".message-negative")
    assert "Wrong credentials" in page.inner_text(".message-negative")
    type_the_password(page, "bob", password)
    back_on_the_hub(page, hub)
    quota, said = spawn_form_quota(page, hub)
    assert quota == "2"
    assert "the GPU quota of group ml-course" in said
    page.screenshot(path=str(ARTIFACTS / "university-login-spawn-form.png"))

    # Out of the course in the directory: the form still says 2 until he logs in again.
    sso_provider.directory.remove_member("ml-course", "bob")
    assert spawn_form_quota(page, hub)[0] == "2"

    # Logging out ends the hub's session and the provider's: the next login asks for his password.
    page.goto(f"{hub.url}/hub/logout")
    # The hub sends the browser to the provider's end-session page, which asks to confirm (the hub keeps no
    # id_token to prove the logout is its own); accepting ends the provider's session and comes back.
    page.wait_for_url(f"{sso_provider.issuer}/oauth2/logout**")
    page.click("button.positive")
    page.wait_for_url(f"{hub.url}/hub/login**")
    page.goto(f"{hub.url}/hub/spawn")
    page.wait_for_url(f"{hub.url}/hub/login**")
    open_the_provider_page(page, hub, sso_provider)
    type_the_password(page, "bob", password)
    back_on_the_hub(page, hub)
    quota, said = spawn_form_quota(page, hub)
    assert quota == "1"
    assert "the default quota" in said
