"""A sign-up an admin authorized gets a GPU quota before its first login (real hub, no browser):
authorized at /hub/authorize, authorized before hub users were made at authorization (carried
over when the hub starts), and the 404 for an unknown name says how to add them."""

from __future__ import annotations

import sqlite3

import pytest
import requests

from tests.conftest import hub_form, native_sign_up, sign_up_decision
from tests.service.conftest import shut_down, start_workbench_hub

pytestmark = pytest.mark.integration
PASSWORD = "a-long-enough-passphrase-42"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    hub = start_workbench_hub(tmp_path_factory.mktemp("hub") / "hub", {"WORKBENCH_ADMIN_USERS": "admin"})
    yield hub
    shut_down(hub)


def sign_up(hub, name: str) -> str:
    return native_sign_up(requests.Session(), hub.url, name, PASSWORD)


def admin_session(hub) -> requests.Session:
    """The admin signs up (authorized at once) and logs in, as on the sign-up page."""
    assert "The signup was successful" in sign_up(hub, "admin")
    session = requests.Session()
    r = hub_form(session, hub.url, "/hub/login", {"username": "admin", "password": PASSWORD})
    assert r.status_code == 302, r.text
    return session


def hub_user(hub, name: str) -> int:
    return hub.api("GET", f"/users/{name}").status_code


def test_an_authorized_sign_up_gets_a_quota_before_the_first_login(hub):
    admin = admin_session(hub)
    assert "sent to the admin" in sign_up(hub, "newbie")
    r = hub.service("PUT", "api/quotas/users/newbie", json={"max_gpus": 2})
    assert r.status_code == 404
    assert r.json()["message"] == (
        'no user named "newbie" on this hub: they must sign up at /hub/signup and be authorized at '
        "/hub/authorize, or be created on the hub's admin page"
    )
    r = sign_up_decision(admin, hub.url, "newbie", "authorize")
    assert r.status_code == 302, r.text
    assert hub_user(hub, "newbie") == 200
    r = hub.service("PUT", "api/quotas/users/newbie", json={"max_gpus": 2})
    assert r.status_code == 200, r.text
    assert r.json()["effective"]["max_gpus"] == 2
    # Taking the authorization back keeps the hub user (and the quota); they cannot log in.
    assert sign_up_decision(admin, hub.url, "newbie", "unauthorize").status_code == 302
    assert hub_user(hub, "newbie") == 200
    # An unknown sign-up name is a 404, not a 500.
    assert sign_up_decision(admin, hub.url, "nobody-signed-up", "authorize").status_code == 404


def test_sign_ups_authorized_before_are_hub_users_after_a_restart(hub):
    assert "sent to the admin" in sign_up(hub, "oldtimer")
    assert hub_user(hub, "oldtimer") == 404
    hub.stop()
    # Authorized the old way: only NativeAuthenticator's table knows.
    with sqlite3.connect(hub.data_dir / "jupyterhub.sqlite") as db:
        db.execute("UPDATE users_info SET is_authorized = 1 WHERE username = 'oldtimer'")
    hub.start()
    hub.wait_service()
    assert hub_user(hub, "oldtimer") == 200
    r = hub.service("PUT", "api/quotas/users/oldtimer", json={"max_gpus": 0})
    assert r.status_code == 200, r.text
