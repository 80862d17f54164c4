"""The university's login against real servers: OpenLDAP's slapd and LemonLDAP::NG (OpenID Connect).

Each test starts a private directory (and provider) from tests/identity and a
real hub with ``WORKBENCH_AUTHENTICATOR=ldap`` or ``oidc``, logs people in as
a browser does (the hub's form; the provider's login page for single
sign-on) and reads the hub's groups and the GPU quota they give back
through the REST APIs. The browser version (Chromium on the provider's
page, the quota on the spawn form) is tests/browser/test_university_login_browser.py.
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.conftest import hub_form, wait_until
from tests.identity.fixtures import directory, sso_provider  # noqa: F401 - fixtures
from tests.identity.servers import sign_in
from workbench_hub.ldap_login import DIRECTORY_DOWN
from workbench_hub.oidc_login import PROVIDER_DOWN

pytestmark = pytest.mark.integration


def ldap_env(slapd, **extra: str) -> dict[str, str]:
    """A hub on the test directory: StartTLS with its CA, the service account finds people, groups under
    ou=groups; tina (staff) is the admin."""
    return {
        "WORKBENCH_AUTHENTICATOR": "ldap",
        "WORKBENCH_ADMIN_USERS": "tina",
        "WORKBENCH_LDAP_URL": slapd.url,
        "WORKBENCH_LDAP_CA_FILE": str(slapd.ca_file),
        "WORKBENCH_LDAP_USER_BASE": slapd.people_dn,
        "WORKBENCH_LDAP_BIND_DN": slapd.reader_dn,
        "WORKBENCH_LDAP_BIND_PASSWORD": slapd.reader_password,
        "WORKBENCH_LDAP_GROUP_BASE": slapd.groups_dn,
        "WORKBENCH_SIMULATED_GPUS": "4",
        **extra,
    }


def oidc_env(provider, **extra: str) -> dict[str, str]:
    return {
        "WORKBENCH_AUTHENTICATOR": "oidc",
        "WORKBENCH_ADMIN_GROUPS": "staff",
        "WORKBENCH_OIDC_ISSUER": provider.issuer,
        "WORKBENCH_OIDC_CLIENT_ID": provider.client_id,
        "WORKBENCH_OIDC_CLIENT_SECRET": provider.client_secret,
        "WORKBENCH_SIMULATED_GPUS": "4",
        **extra,
    }


def ldap_login(hub, name: str, password: str) -> requests.Response:
    """The hub's login form, as a browser sends it; the answer (302 when logged in)."""
    return hub_form(requests.Session(), hub.url, "/hub/login", {"username": name, "password": password})


def login_error(page: str) -> str:
    found = re.search(r'(?s)<p class="login_error[^"]*"[^>]*>\s*(.*?)\s*</p>', page)
    return html.unescape(found.group(1)) if found else ""


def hub_groups(hub, name: str) -> list[str]:
    return sorted(hub.api("GET", f"/users/{name}").json()["groups"])


def effective(hub, name: str) -> dict:
    r = hub.service("GET", f"api/quotas/users/{name}")
    assert r.status_code == 200, r.text
    return r.json()["effective"]


def set_group_quota(hub, group: str, max_gpus: int) -> dict:
    r = hub.service("PUT", f"api/quotas/groups/{group}", json={"max_gpus": max_gpus})
    assert r.status_code in (200, 201), r.text
    return r.json()


def oidc_login(hub, provider, name: str, password: str) -> requests.Session:
    """Through the provider's login page: the hub's oauth_login, the provider's form, back to the callback."""
    session = requests.Session()
    page = session.get(f"{hub.url}/hub/oauth_login", timeout=30)
    assert page.url.startswith(provider.issuer), page.url
    back = sign_in(session, page, name, password)
    assert back.status_code == 302, back.text[-800:]
    assert back.headers["Location"].startswith(f"{hub.url}/hub/oauth_callback"), back.headers["Location"]
    landed = session.get(back.headers["Location"], timeout=30)
    assert landed.status_code == 200, landed.text[-800:]
    assert landed.url.startswith(f"{hub.url}/hub/"), landed.url
    return session


# -- LDAP -----------------------------------------------------------------------------------------------------


def test_the_directorys_groups_decide_the_quota_at_each_login(directory, running_hub):  # noqa: F811
    hub = running_hub(ldap_env(directory))
    # Before term: the course is not on the hub yet, its quota is kept for its members' first logins.
    assert set_group_quota(hub, "ml-course", 2)["note"].startswith("No member of ml-course has logged in yet")
    assert ldap_login(hub, "bob", directory.password("bob")).status_code == 302
    assert hub_groups(hub, "bob") == ["ml-course", "stats-course"]
    assert effective(hub, "bob")["max_gpus"] == 2
    # A name as the student types it: the hub's user is the directory's lowercase uid.
    assert ldap_login(hub, "Alice", directory.password("alice")).status_code == 302
    assert hub_groups(hub, "alice") == ["hpc-lab", "ml-course"]  # a posixGroup (memberUid) counts too
    # In no group: logs in, no groups, the default quota.
    assert ldap_login(hub, "dave", directory.password("dave")).status_code == 302
    assert hub_groups(hub, "dave") == []
    assert effective(hub, "dave")["max_gpus"] == 1

    # Removed from the course in the directory: still in it on the hub until the next login, then not.
    directory.remove_member("ml-course", "bob")
    assert hub_groups(hub, "bob") == ["ml-course", "stats-course"]
    assert ldap_login(hub, "bob", directory.password("bob")).status_code == 302
    assert hub_groups(hub, "bob") == ["stats-course"]
    assert effective(hub, "bob")["max_gpus"] == 1
    # Added: the course's quota at the next login.
    directory.add_member("ml-course", "dave")
    assert ldap_login(hub, "dave", directory.password("dave")).status_code == 302
    assert hub_groups(hub, "dave") == ["ml-course"]
    assert effective(hub, "dave")["max_gpus"] == 2

    # A hand edit in JupyterHub's group API lasts until that member's next login.
    assert hub.api("POST", "/groups/stats-course/users", json={"users": ["dave"]}).status_code == 200
    assert hub_groups(hub, "dave") == ["ml-course", "stats-course"]
    assert ldap_login(hub, "dave", directory.password("dave")).status_code == 302
    assert hub_groups(hub, "dave") == ["ml-course"]
    # JupyterHub's admin page says so where the admin looks.
    admin = requests.Session()
    assert (
        hub_form(admin, hub.url, "/hub/login", {"username": "tina", "password": directory.password("tina")}).status_code
        == 302
    )
    page = admin.get(f"{hub.url}/hub/admin", timeout=30).text
    assert "Groups come from the university directory (LDAP)." in page
    assert "lasts only until that person's next login" in page


def test_login_groups_admin_groups_and_passwords_refused_and_counted(directory, running_hub):  # noqa: F811
    hub = running_hub(
        ldap_env(
            directory,
            WORKBENCH_LOGIN_ATTEMPTS="3",
            WORKBENCH_LOGIN_LOCKOUT_SECONDS="300",
            WORKBENCH_LOGIN_GROUPS="ml-course,stats-course",
            WORKBENCH_ADMIN_USERS="",
            WORKBENCH_ADMIN_GROUPS="staff",
        )
    )
    # In no course: the right password, and a sentence that says what is missing.
    outside = ldap_login(hub, "dave", directory.password("dave"))
    assert outside.status_code == 403
    assert login_error(outside.text) == (
        "dave, your account is not in a group that may use this hub (ml-course, stats-course). Ask your course's "
        "staff to add you to the course's group in the university directory."
    )
    # Staff are admins by their directory group, and may log in without a course.
    assert ldap_login(hub, "tina", directory.password("tina")).status_code == 302
    assert hub.api("GET", "/users/tina").json()["admin"] is True
    locked = ldap_login(hub, "mallory", directory.password("mallory"))
    assert locked.status_code == 403
    assert login_error(locked.text) == "Invalid username or password."
    for _ in range(2):
        wrong = ldap_login(hub, "carol", "not-her-password")
        assert wrong.status_code == 403
        assert login_error(wrong.text) == "Invalid username or password."
    # The third wrong password locks the name; the right one then waits for the lock-out, unchecked.
    third = ldap_login(hub, "carol", "not-her-password")
    assert login_error(third.text).startswith("Too many failed logins for carol: you may try again in 5 minutes")
    refused = ldap_login(hub, "carol", directory.password("carol"))
    assert refused.status_code == 403
    assert login_error(refused.text).startswith("Too many failed logins for carol: you may try again in ")
    assert "Login refused for carol without asking the directory" in hub.log()
    # Others are not held up.
    assert ldap_login(hub, "bob", directory.password("bob")).status_code == 302


def test_the_directory_down_is_said_and_running_servers_are_not_touched(directory, running_hub):  # noqa: F811
    hub = running_hub(ldap_env(directory))
    assert ldap_login(hub, "bob", directory.password("bob")).status_code == 302
    assert hub.spawn("bob", gpus=1).status_code in (201, 202)
    server = hub.wait_ready("bob")
    directory.stop()
    down = ldap_login(hub, "carol", directory.password("carol"))
    assert down.status_code == 503
    assert login_error(down.text) == DIRECTORY_DOWN
    assert hub.server("bob") == server  # same server, still ready
    assert hub.leases() == {"bob": hub.leases()["bob"]}
    assert len(hub.leases()["bob"]) == 1
    directory.start()
    wait_until(lambda: ldap_login(hub, "carol", directory.password("carol")).status_code == 302, 30, "carol's login")
    assert hub_groups(hub, "carol") == ["stats-course"]


@pytest.mark.parametrize(
    ("change", "sentence"),
    [
        (
            lambda d: {"WORKBENCH_LDAP_URL": "ldap://127.0.0.1:9"},
            "cannot reach the directory at ldap://127.0.0.1:9 (connection refused)",
        ),
        (lambda d: {"WORKBENCH_LDAP_CA_FILE": ""}, "has a certificate this hub does not trust"),
        (
            lambda d: {"WORKBENCH_LDAP_BIND_PASSWORD": "wrong-password"},
            "refused the service account cn=hub-reader,ou=services,dc=workbench,dc=test (invalid credentials)",
        ),
        (
            lambda d: {"WORKBENCH_LDAP_USER_BASE": f"ou=nobody,{d.base_dn}"},
            "WORKBENCH_LDAP_USER_BASE=ou=nobody,dc=workbench,dc=test does not exist",
        ),
    ],
    ids=["unreachable", "untrusted-certificate", "bad-bind", "no-such-base"],
)
def test_a_bad_directory_setting_stops_the_hub_with_one_sentence(directory, running_hub, change, sentence):  # noqa: F811
    with pytest.raises(RuntimeError) as stopped:
        running_hub(ldap_env(directory, **change(directory)))
    assert "the hub exited with 2:\n\nGPU Workbench: " in str(stopped.value)
    assert sentence in str(stopped.value)


# -- OpenID Connect ---------------------------------------------------------------------------------------------


def test_single_sign_on_gives_the_claims_groups_and_logout_ends_both_sessions(sso_provider, running_hub):  # noqa: F811
    hub = running_hub(oidc_env(sso_provider), prepare_one=lambda hub: sso_provider.allow_hub(hub.url))
    set_group_quota(hub, "ml-course", 2)
    bob = oidc_login(hub, sso_provider, "bob", sso_provider.directory.password("bob"))
    assert hub_groups(hub, "bob") == ["ml-course", "stats-course"]
    assert effective(hub, "bob")["max_gpus"] == 2
    tina = oidc_login(hub, sso_provider, "tina", sso_provider.directory.password("tina"))
    assert hub.api("GET", "/users/tina").json()["admin"] is True  # WORKBENCH_ADMIN_GROUPS=staff
    admin_page = html.unescape(tina.get(f"{hub.url}/hub/admin", timeout=30).text)
    assert "Groups come from the university's single sign-on (OpenID Connect)." in admin_page
    oidc_login(hub, sso_provider, "dave", sso_provider.directory.password("dave"))  # no groups claim at all
    assert hub_groups(hub, "dave") == []

    sso_provider.directory.remove_member("ml-course", "bob")
    oidc_login(hub, sso_provider, "bob", sso_provider.directory.password("bob"))
    assert hub_groups(hub, "bob") == ["stats-course"]

    # Logout: the hub's session ends and the browser goes to the provider's end-session endpoint.
    out = bob.get(f"{hub.url}/hub/logout", allow_redirects=False, timeout=30)
    assert out.status_code == 302
    assert out.headers["Location"].startswith(sso_provider.discovery()["end_session_endpoint"])
    assert "post_logout_redirect_uri=" in out.headers["Location"]
    home = bob.get(f"{hub.url}/hub/home", allow_redirects=False, timeout=30)
    assert home.status_code == 302
    assert "/hub/login" in home.headers["Location"]


def test_the_provider_down_is_said_on_the_login_page(sso_provider, running_hub):  # noqa: F811
    hub = running_hub(
        oidc_env(sso_provider, WORKBENCH_OIDC_LOGIN_SERVICE="Campus SSO"),
        prepare_one=lambda hub: sso_provider.allow_hub(hub.url),
    )
    oidc_login(hub, sso_provider, "bob", sso_provider.directory.password("bob"))
    assert hub.spawn("bob", gpus=1).status_code in (201, 202)
    server = hub.wait_ready("bob")
    page = requests.get(f"{hub.url}/hub/login", timeout=30)
    assert page.status_code == 200
    assert "Sign in with Campus SSO" in page.text
    sso_provider.stop()
    wait_until(lambda: requests.get(f"{hub.url}/hub/login", timeout=30).status_code == 503, 20, "the login page's 503")
    down = requests.get(f"{hub.url}/hub/login", timeout=30)
    assert login_error(down.text) == PROVIDER_DOWN
    # The button's own address sends the browser back to that sentence, not to a page that cannot load.
    redirect = requests.get(f"{hub.url}/hub/oauth_login", allow_redirects=False, timeout=30)
    assert redirect.status_code == 302
    assert redirect.headers["Location"].startswith("/hub/login")
    assert hub.server("bob") == server
    sso_provider.start()
    wait_until(lambda: requests.get(f"{hub.url}/hub/login", timeout=30).status_code == 200, 20, "the login page")


@pytest.mark.parametrize(
    ("change", "sentence"),
    [
        (lambda p: {"WORKBENCH_OIDC_ISSUER": p.issuer + "/"}, "but the provider calls itself"),
        (
            lambda p: {"WORKBENCH_OIDC_CLIENT_SECRET": "not-the-secret"},
            "the login provider refused the client workbench-hub (invalid_client)",
        ),
        (
            lambda p: {"WORKBENCH_OIDC_ISSUER": "http://127.0.0.1:9"},
            "cannot reach the login provider at http://127.0.0.1:9/.well-known/openid-configuration",
        ),
    ],
    ids=["wrong-issuer", "bad-client-secret", "unreachable"],
)
def test_a_bad_provider_setting_stops_the_hub_with_one_sentence(sso_provider, running_hub, change, sentence):  # noqa: F811
    with pytest.raises(RuntimeError) as stopped:
        running_hub(oidc_env(sso_provider, **change(sso_provider)))
    assert "the hub exited with 2:\n\nGPU Workbench: " in str(stopped.value)
    assert sentence in str(stopped.value)


# -- workbench check-login ---------------------------------------------------------------------------------------


def check_login(env: dict[str, str], *args: str, password: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).parent / "workbench"), "check-login", *args],
        env={**os.environ, **env},
        input=password,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_check_login_asks_the_directory_and_the_provider_what_the_hub_will_ask(directory, sso_provider):  # noqa: F811
    found = check_login(ldap_env(directory), "Bob")
    assert found.returncode == 0, found.stderr
    assert f"ok: the directory answers at {directory.url} (StartTLS)" in found.stdout
    assert "ok: bob is uid=bob,ou=people,dc=workbench,dc=test" in found.stdout
    assert "ok: bob's groups (they become the hub groups at each login): ml-course, stats-course" in found.stdout
    refused = check_login(ldap_env(directory, WORKBENCH_LOGIN_GROUPS="ml-course"), "carol")
    assert refused.returncode == 1
    assert "carol is in none of WORKBENCH_LOGIN_GROUPS (ml-course) and not an admin" in refused.stderr
    bad = check_login(ldap_env(directory, WORKBENCH_LDAP_BIND_PASSWORD="wrong"))
    assert bad.returncode == 1
    assert bad.stderr.startswith("workbench: check-login: the directory at ")
    # Without a service account: the user's own password binds, as at login.
    template = {
        **{
            k: v
            for k, v in ldap_env(directory).items()
            if not k.startswith(("WORKBENCH_LDAP_BIND", "WORKBENCH_LDAP_USER"))
        },
        "WORKBENCH_LDAP_BIND_TEMPLATE": "uid={username},ou=people,dc=workbench,dc=test",
    }
    own = check_login(template, "alice", "--password-stdin", password=directory.password("alice") + "\n")
    assert own.returncode == 0, own.stderr
    assert "alice's groups (they become the hub groups at each login): hpc-lab, ml-course" in own.stdout

    oidc = check_login(oidc_env(sso_provider))
    assert oidc.returncode == 0, oidc.stderr
    assert f"ok: the provider knows the client {sso_provider.client_id} and its secret" in oidc.stdout
    assert f"token_url: {sso_provider.issuer}/oauth2/token" in oidc.stdout
    wrong = check_login(oidc_env(sso_provider, WORKBENCH_OIDC_CLIENT_SECRET="nope"))
    assert wrong.returncode == 1
    assert "the login provider refused the client workbench-hub (invalid_client)" in wrong.stderr
    settings = check_login({"WORKBENCH_AUTHENTICATOR": "ldap", "WORKBENCH_ADMIN_USERS": "tina"})
    assert settings.returncode == 2
    assert "WORKBENCH_AUTHENTICATOR=ldap needs WORKBENCH_LDAP_URL" in settings.stderr
