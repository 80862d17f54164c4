"""WORKBENCH_AUTHENTICATOR=pam through the real hub: the host's Unix accounts log in with their own
password (what a Slurm head node needs, since jobs run as the user's account), WORKBENCH_PAM_GROUPS
keeps out accounts outside those groups, and a wrong password is refused."""

from __future__ import annotations

import os
import secrets
import subprocess

import pytest
import requests

from tests.conftest import hub_form, missing

pytestmark = pytest.mark.integration

GROUP = "wbpamusers"
# MEMBER administers the hub (pam needs explicit admins, and the hub makes them at start); STUDENT is
# a plain member, a hub user only once they log in.
MEMBER, STUDENT, OUTSIDER = "wbpammember", "wbpamstudent", "wbpamoutsider"


@pytest.fixture(scope="module")
def accounts():
    if os.geteuid() != 0:
        missing("making Unix accounts with passwords for the PAM login test needs root")
    subprocess.run(["groupadd", "-f", GROUP], check=True)
    passwords = {}
    for name in (MEMBER, STUDENT, OUTSIDER):
        if subprocess.run(["id", name], capture_output=True).returncode != 0:
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True)
        passwords[name] = secrets.token_urlsafe(12)
        subprocess.run(["chpasswd"], input=f"{name}:{passwords[name]}\n", text=True, check=True)
    for name in (MEMBER, STUDENT):
        subprocess.run(["usermod", "-a", "-G", GROUP, name], check=True)
    return passwords


def log_in(hub, user: str, password: str) -> requests.Response:
    return hub_form(requests.Session(), hub.url, "/hub/login", {"username": user, "password": password})


def test_unix_accounts_in_the_allowed_group_log_in_with_their_password(running_hub, accounts):
    hub = running_hub(
        {
            "WORKBENCH_AUTHENTICATOR": "pam",
            "WORKBENCH_PAM_GROUPS": GROUP,
            "WORKBENCH_ADMIN_USERS": MEMBER,
            "WORKBENCH_SIMULATED_GPUS": "1",
        }
    )
    ok = log_in(hub, MEMBER, accounts[MEMBER])
    assert ok.status_code == 302, ok.text[:300]
    assert "/hub/" in ok.headers["Location"], ok.text[:300]
    assert hub.api("GET", f"/users/{STUDENT}").status_code == 404
    ok = log_in(hub, STUDENT, accounts[STUDENT])
    assert ok.status_code == 302, ok.text[:300]
    assert "/hub/" in ok.headers["Location"], ok.text[:300]
    assert hub.api("GET", f"/users/{STUDENT}").status_code == 200  # a hub user now, by the account's name
    wrong = log_in(hub, MEMBER, accounts[MEMBER] + "x")
    assert wrong.status_code == 403
    assert "Invalid username or password" in wrong.text
    outside = log_in(hub, OUTSIDER, accounts[OUTSIDER])  # right password, not in the group
    assert outside.status_code == 403
    assert "Invalid username or password" in outside.text
    assert hub.api("GET", f"/users/{OUTSIDER}").status_code == 404
