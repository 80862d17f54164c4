"""The login settings' tables (issue 46), without starting a hub: the lock-out from the environment and the
sentence it shows, where others reach the hub, and the admins' accounts made at start.

The real hub is in tests/integration/test_login_hardening.py.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import bcrypt
import pytest
from nativeauthenticator.orm import UserInfo
from traitlets.config import Config

from tests.unit.test_configurer import build, get
from tests.unit.test_password_checks import FAST, authenticator, sign_up
from workbench_hub import banner, first_admin, lockout
from workbench_hub.configurer import ConfigError, update_auth

# -- the lock-out's settings -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "attempts", "seconds"),
    [
        ({}, 5, 300),  # on by default
        ({"WORKBENCH_LOGIN_ATTEMPTS": "10"}, 10, 300),
        ({"WORKBENCH_LOGIN_LOCKOUT_SECONDS": " 900 "}, 5, 900),
        ({"WORKBENCH_LOGIN_ATTEMPTS": "0"}, 0, 300),  # off
        ({"WORKBENCH_LOGIN_LOCKOUT_SECONDS": "0"}, 0, 0),  # no wait is no lock-out either
    ],
)
def test_the_lockout_settings(env, attempts, seconds):
    c = build(env)
    assert get(c, "NativeAuthenticator.allowed_failed_logins") == attempts
    assert get(c, "NativeAuthenticator.seconds_before_next_try") == seconds


@pytest.mark.parametrize(
    ("env", "sentence"),
    [
        (
            {"WORKBENCH_LOGIN_ATTEMPTS": "five"},
            "WORKBENCH_LOGIN_ATTEMPTS must be a non-negative whole number, not 'five'",
        ),
        ({"WORKBENCH_LOGIN_ATTEMPTS": "-1"}, "WORKBENCH_LOGIN_ATTEMPTS must be a non-negative whole number, not '-1'"),
        (
            {"WORKBENCH_LOGIN_LOCKOUT_SECONDS": "5m"},
            "WORKBENCH_LOGIN_LOCKOUT_SECONDS must be a non-negative whole number, not '5m'",
        ),
    ],
)
def test_a_bad_lockout_setting_stops_the_hub_with_a_sentence(env, sentence):
    with pytest.raises(ConfigError) as refused:
        build(env)
    assert str(refused.value) == sentence


def test_pam_gets_no_nativeauthenticator_settings():
    """The host's accounts: PAM (pam_faillock) decides about failed logins, and the accounts exist already."""
    c = build(
        {
            "WORKBENCH_AUTHENTICATOR": "pam",
            "WORKBENCH_ADMIN_USERS": "ada",
            "WORKBENCH_ADMIN_PASSWORD": "a-good-long-password",
        }
    )
    assert "NativeAuthenticator" not in c
    assert "WorkbenchAuthenticator" not in c


def test_our_authorization_page_comes_before_nativeauthenticators():
    paths = build({}).JupyterHub.template_paths
    assert Path(paths[0]) == Path(first_admin.__file__).with_name("auth_templates")
    assert (Path(paths[0]) / "authorization-area.html").is_file()
    assert Path(paths[1]).parts[-2:] == ("nativeauthenticator", "templates")


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        ("correct horse battery", "correct horse battery"),
        (" spaces are part of it ", " spaces are part of it "),  # read raw, never stripped
        ("   ", None),  # only spaces: not set
        ("", None),
    ],
)
def test_the_admin_password_reaches_the_authenticator_as_given(value, kept):
    c = Config()
    update_auth(c, {"WORKBENCH_ADMIN_PASSWORD": value})
    assert (c.WorkbenchAuthenticator.admin_password if "admin_password" in c.WorkbenchAuthenticator else None) == kept


# -- the lock-out's sentence -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (0.2, "1 second"),
        (30, "30 seconds"),
        (59.01, "1 minute"),
        (60, "1 minute"),
        (61, "1 minute and 1 second"),
        (299.5, "5 minutes"),
        (245, "4 minutes and 5 seconds"),
    ],
)
def test_the_time_left_in_words(seconds, words):
    assert lockout.duration(seconds) == words


def test_the_whole_time_since_the_last_failure_counts():
    now = datetime(2026, 12, 7, 12, 0, 0)
    assert lockout.seconds_left(now - timedelta(seconds=100), 300, now) == 200
    assert lockout.seconds_left(now - timedelta(seconds=400), 300, now) == 0
    # NativeAuthenticator read timedelta.seconds: a day and 10 s ago was "10 s ago", locked again
    assert lockout.seconds_left(now - timedelta(days=1, seconds=10), 300, now) == 0
    assert lockout.seconds_left(None, 300, now) == 0


async def test_a_locked_out_name_is_told_how_long_and_a_day_later_is_not():
    auth = authenticator(allowed_failed_logins=2, seconds_before_next_try=300)
    sign_up(auth, "ann")
    for _ in range(2):
        assert await auth.authenticate(None, {"username": "ann", "password": "wrong"}) is None
    left = auth.lockout_seconds_left("ann")
    assert 299 < left <= 300
    assert lockout.locked_out_sentence("ann", left) == (
        "Too many failed logins for ann: you may try again in 5 minutes. "
        "Until then no password is checked for this name."
    )
    auth.login_attempts["ann"]["time"] = datetime.now() - timedelta(days=1, seconds=10)
    assert auth.lockout_seconds_left("ann") == 0
    assert not auth.is_blocked("ann")


# -- where others reach the hub --------------------------------------------------------------------


def final(env: dict[str, str], local: dict | None = None) -> Config:
    c = build(env)
    for trait, value in (local or {}).items():
        c.JupyterHub[trait] = value
    return c


@pytest.mark.parametrize(
    ("env", "local", "where"),
    [
        # make run: loopback only
        ({}, {}, ""),
        ({"WORKBENCH_IP": "::1"}, {}, ""),
        ({"WORKBENCH_IP": "localhost"}, {}, ""),
        # the operator's certificate on loopback (a tunnel, a test): still this machine only
        ({"WORKBENCH_SSL_CERT": "/c.pem", "WORKBENCH_SSL_KEY": "/k.pem"}, {}, ""),
        # every address, or one other machines reach
        ({"WORKBENCH_IP": "0.0.0.0"}, {}, "the proxy's address 0.0.0.0"),
        ({"WORKBENCH_IP": "192.0.2.7"}, {}, "the proxy's address 192.0.2.7"),
        ({}, {"bind_url": "https://:443"}, "the proxy's address (every address)"),
        # docker compose: the hub listens on 0.0.0.0 in its container; the published address decides
        ({"WORKBENCH_IP": "0.0.0.0", "WORKBENCH_PUBLISH_IP": "127.0.0.1"}, {}, ""),
        ({"WORKBENCH_IP": "0.0.0.0", "WORKBENCH_PUBLISH_IP": "0.0.0.0"}, {}, "WORKBENCH_PUBLISH_IP=0.0.0.0"),
        # a TLS proxy in front, even on this host: the browsers are elsewhere
        ({"WORKBENCH_ALLOW_HTTP": "1"}, {}, "a TLS proxy in front (WORKBENCH_ALLOW_HTTP=1)"),
        ({"WORKBENCH_DOMAIN": "gpu.example.org"}, {}, "the public URL https://gpu.example.org/"),
        (
            {"WORKBENCH_IP": "0.0.0.0", "WORKBENCH_PUBLISH_IP": "127.0.0.1", "WORKBENCH_DOMAIN": "gpu.example.org"},
            {},
            "the public URL https://gpu.example.org/",
        ),
        ({}, {"public_url": "http://localhost:8000/"}, ""),
    ],
)
def test_where_other_machines_reach_the_hub(env, local, where):
    assert first_admin.reached_from(final(env, local), env) == where


def test_the_guard_is_set_for_nativeauthenticator_only():
    env = {"WORKBENCH_IP": "0.0.0.0"}
    c = final(env)
    assert first_admin.guard_first_admin(c, c, env) == "the proxy's address 0.0.0.0"
    assert c.WorkbenchAuthenticator.reached_from == "the proxy's address 0.0.0.0"
    # PAM (or a site's LDAP/OAuth in the local config): the accounts exist outside the hub
    pam = {**env, "WORKBENCH_AUTHENTICATOR": "pam", "WORKBENCH_ADMIN_USERS": "ada"}
    c = final(pam)
    assert first_admin.guard_first_admin(c, c, pam) == ""
    assert "reached_from" not in c.WorkbenchAuthenticator
    c = final(env, {"authenticator_class": "ldapauthenticator.LDAPAuthenticator"})
    assert first_admin.guard_first_admin(c, c, env) == ""
    # on loopback nothing is set
    c = final({})
    assert first_admin.guard_first_admin(c, c, {}) == ""
    assert "reached_from" not in c.WorkbenchAuthenticator


# -- the admins' accounts at start -----------------------------------------------------------------


def admins(**config):
    auth = authenticator(**config)
    auth.admin_users = {"admin", "grace"}
    return auth


def test_off_loopback_without_the_password_the_hub_stops_while_an_admin_has_no_account():
    auth = admins(reached_from="the proxy's address 0.0.0.0", minimum_password_length=8)
    sign_up(auth, "admin")
    with pytest.raises(first_admin.FirstAdminError) as refused:
        first_admin.set_up_admins(auth)
    assert str(refused.value) == (
        "this hub is reached from other machines (the proxy's address 0.0.0.0) and the admin account grace does "
        "not exist yet, so whoever signed up first under that name would own the hub: set WORKBENCH_ADMIN_PASSWORD "
        "(at least 8 characters, not a common password) and each admin without an account gets one with it at "
        "start (README: The first admin)"
    )
    sign_up(auth, "grace", authorized=False)  # a sign-up waiting under the name counts as its account
    assert first_admin.set_up_admins(auth) == []


def test_on_loopback_nothing_is_made_or_refused():
    auth = admins()
    assert first_admin.set_up_admins(auth) == []
    assert UserInfo.all_users(auth.db) == []


def test_the_password_makes_the_missing_accounts_authorized_and_leaves_the_others():
    password = "a-first-admin-passphrase"
    auth = admins(admin_password=password, reached_from="x", minimum_password_length=8, check_common_password=True)
    sign_up(auth, "admin")  # signed up long ago, with their own password
    assert first_admin.set_up_admins(auth) == ["grace"]
    grace = UserInfo.find(auth.db, "grace")
    assert grace.is_authorized
    assert bcrypt.checkpw(password.encode(), grace.password)
    assert grace.password[:7] == b"$2b$12$"  # NativeAuthenticator's hash and cost
    assert UserInfo.find(auth.db, "admin").password == FAST  # untouched
    assert first_admin.set_up_admins(auth) == []  # the next start: nothing to make


@pytest.mark.parametrize(
    ("password", "sentence"),
    [
        (
            "short",
            "WORKBENCH_ADMIN_PASSWORD does not pass the hub's password rules: it needs at least 8 characters and "
            "must not be one of the common passwords NativeAuthenticator refuses",
        ),
        (
            "password",
            "WORKBENCH_ADMIN_PASSWORD does not pass the hub's password rules: it needs at least 8 characters and "
            "must not be one of the common passwords NativeAuthenticator refuses",
        ),
        ("x" * 80, "WORKBENCH_ADMIN_PASSWORD is longer than bcrypt's 72 bytes: pick a shorter one"),
    ],
)
def test_a_password_the_rules_refuse_stops_the_hub(password, sentence):
    auth = admins(admin_password=password, minimum_password_length=8, check_common_password=True)
    with pytest.raises(first_admin.FirstAdminError) as refused:
        first_admin.set_up_admins(auth)
    assert str(refused.value) == sentence
    assert UserInfo.all_users(auth.db) == []


def test_an_admin_name_that_cannot_be_an_account_is_a_sentence():
    auth = authenticator(admin_password="a-first-admin-passphrase")
    auth.admin_users = {"ada lovelace"}
    with pytest.raises(first_admin.FirstAdminError, match="WORKBENCH_ADMIN_USERS names 'ada lovelace'"):
        first_admin.set_up_admins(auth)


def test_the_banner_says_how_the_first_admin_begins():
    address = "https://gpu.example.org"
    assert banner.first_admin_line(build({}), address, ["admin"]) == (
        "First admin: open https://gpu.example.org/hub/signup and sign up as admin; admins are authorized at "
        "once, other sign-ups wait for an admin at /hub/authorize"
    )
    with_password = build({"WORKBENCH_ADMIN_PASSWORD": "a-first-admin-passphrase"})
    assert banner.first_admin_line(with_password, address, ["admin", "grace"]) == (
        "First admin: log in at https://gpu.example.org/hub/login as admin or grace with WORKBENCH_ADMIN_PASSWORD "
        "(an admin without an account got one at start); other sign-ups wait for an admin at /hub/authorize"
    )
