"""Students as a class gets them on the native authenticator: a sign-up, the admin's authorization, a login.

The security tests need real accounts with real passwords (a pending sign-up an attacker would
authorize, an authorized student one would de-authorize, logins whose passwords must never reach a
log). ``authorize`` is a step of their set-up, not what they test: it presses the Authorize button of
the hub's authorization page (``tests.conftest.sign_up_decision``: a POST with ``_xsrf``).
"""

from __future__ import annotations

import requests

from tests.conftest import hub_form, native_sign_up, sign_up_decision
from tests.service.conftest import WorkbenchHub

PASSWORD = "table-passphrase-for-students-42"


def sign_up(hub: WorkbenchHub, name: str, password: str = PASSWORD) -> str:
    """NativeAuthenticator's sign-up form; the page it answers (its sentence says whether it waits for an admin)."""
    return native_sign_up(requests.Session(), hub.url, name, password)


def log_in(hub: WorkbenchHub, name: str, password: str = PASSWORD) -> requests.Session:
    """A browser-like session logged in with the hub's login form (302 to the next page)."""
    session = requests.Session()
    r = hub_form(session, hub.url, "/hub/login", {"username": name, "password": password})
    assert r.status_code == 302, f"{name} could not log in: {r.status_code} {r.text[-1000:]}"
    return session


def admin_session(hub: WorkbenchHub, password: str = PASSWORD) -> requests.Session:
    """The hub's admin (``admin``, authorized at sign-up) signed up and logged in."""
    assert "The signup was successful" in sign_up(hub, "admin", password)
    return log_in(hub, "admin", password)


def authorize(admin: requests.Session, hub: WorkbenchHub, name: str) -> None:
    """The admin authorizes ``name``'s pending sign-up (a hub user from then on)."""
    r = sign_up_decision(admin, hub.url, name, "authorize")
    assert r.status_code in (200, 302, 303), f"authorizing {name}: {r.status_code} {r.text[-1000:]}"
    assert hub.api("GET", f"/users/{name}").status_code == 200, f"{name} is not a hub user after authorization"


def authorized_student(admin: requests.Session, hub: WorkbenchHub, name: str, password: str = PASSWORD) -> None:
    """``name`` signed up and authorized by the admin."""
    assert "sent to the admin" in sign_up(hub, name, password)
    authorize(admin, hub, name)


def browser_log_in(page, hub: WorkbenchHub, name: str, password: str = PASSWORD) -> None:
    """The hub's login form in Chromium (Playwright's ``page``), until the spawn page: an authorized student."""
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", name)
    page.fill("#password_input", password)
    page.click("#login_submit")
    page.wait_for_url("**/hub/spawn**")
