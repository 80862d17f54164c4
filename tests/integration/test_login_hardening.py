"""Sign-ups, logins and cookies against a real hub (issue 46): no state change on GET, the lock-out on by
default, SameSite on every cookie, and the first admin of a hub that others reach.

The browser's side of the same (another site navigating an admin's Chromium to the old links) is
tests/browser/test_cross_site_browser.py.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests
from nativeauthenticator.crypto.signing import Signer

from tests.conftest import Hub, hub_form, native_sign_up, sign_up_decision

pytestmark = pytest.mark.integration

PASSWORD = "admin-pass-1234"
STUDENT_PASSWORD = "student-pass-5678"
INVALID = "Invalid username or password."
LOCKED = re.compile(
    r"Too many failed logins for (\w+): you may try again in (\d+ minutes?(?: and \d+ seconds?)?|\d+ seconds?)\. "
    r"Until then no password is checked for this name\."
)


def sign_ups(hub: Hub) -> dict[str, bool]:
    """NativeAuthenticator's table, read from the hub's database: name -> authorized."""
    with sqlite3.connect(hub.data_dir / "jupyterhub.sqlite") as db:
        return {name: bool(ok) for name, ok in db.execute("SELECT username, is_authorized FROM users_info")}


def login_error(r: requests.Response) -> str:
    """The login page's error sentence (the page NativeAuthenticator renders), or '' on a login."""
    found = re.search(r'<p class="login_error">\s*(.*?)\s*</p>', r.text, re.S)
    return found.group(1).replace("&#39;", "'") if found else ""


def log_in(hub: Hub, name: str, password: str, session: requests.Session | None = None) -> requests.Response:
    return hub_form(session or requests.Session(), hub.url, "/hub/login", {"username": name, "password": password})


def set_cookie_lines(responses: list[requests.Response]) -> dict[str, list[str]]:
    """name -> the Set-Cookie lines (lower-cased) that set it over a chain of answers; the ones that clear
    a cookie (an empty value, which a browser matches by name and path only) are left out."""
    found: dict[str, list[str]] = {}
    for r in responses:
        for line in r.raw.headers.getlist("Set-Cookie"):
            name, _, rest = line.partition("=")
            if not rest.startswith(('""', ";")):
                found.setdefault(name, []).append(line.lower())
    return found


# -- authorize, unauthorize, discard: POST only ------------------------------------------------------


def test_the_old_links_change_nothing_and_the_buttons_do(running_hub):
    hub = running_hub({"WORKBENCH_SIMULATED_GPUS": "1"})
    admin = hub.admin_pages(PASSWORD)
    for name in ("eve", "mallory"):
        assert "sent to the admin" in native_sign_up(requests.Session(), hub.url, name, STUDENT_PASSWORD)
    assert sign_ups(hub) == {"admin": True, "eve": False, "mallory": False}

    # The links NativeAuthenticator's page had: 405 with a sentence, even for the logged-in admin.
    for path, sentence in [
        ("/hub/authorize/eve", "A link cannot authorize a sign-up or take an authorization back"),
        ("/hub/discard/mallory", "A link cannot discard a sign-up"),
    ]:
        r = admin.get(f"{hub.url}{path}", allow_redirects=False, timeout=30)
        assert r.status_code == 405, (path, r.status_code)
        assert r.headers["Allow"] == "POST"
        assert sentence in r.text
    assert sign_ups(hub) == {"admin": True, "eve": False, "mallory": False}
    assert hub.api("GET", "/users/eve").status_code == 404  # no hub user made either

    # A POST without the form's _xsrf (what another site's form would send) is refused by JupyterHub.
    r = admin.post(f"{hub.url}/hub/authorize/eve", data={"action": "authorize"}, allow_redirects=False, timeout=30)
    assert r.status_code == 403, r.text[-500:]
    assert sign_ups(hub)["eve"] is False

    # The page's buttons: forms that POST with _xsrf and say what they want.
    page = admin.get(f"{hub.url}/hub/authorize", timeout=30).text
    assert re.search(r'<form method="post" action="/hub/authorize/eve"', page), page
    assert 'name="action" value="authorize"' in page
    assert 'action="/hub/discard/mallory"' in page
    assert 'href="/hub/authorize/' not in page
    assert 'href="/hub/discard/' not in page

    r = sign_up_decision(admin, hub.url, "eve", "authorize")
    assert r.status_code == 302, r.text[-500:]
    assert r.headers["Location"].endswith("/hub/authorize#eve")
    assert sign_ups(hub)["eve"] is True
    assert hub.api("GET", "/users/eve").status_code == 200  # authorizing still makes the hub user
    # The same button again changes nothing (no toggle): eve stays authorized.
    assert sign_up_decision(admin, hub.url, "eve", "authorize").status_code == 302
    assert sign_ups(hub)["eve"] is True
    assert log_in(hub, "eve", STUDENT_PASSWORD).status_code == 302

    assert sign_up_decision(admin, hub.url, "eve", "unauthorize").status_code == 302
    assert sign_ups(hub)["eve"] is False
    assert hub.api("GET", "/users/eve").status_code == 200  # taking it back leaves the hub user, as before
    assert "has not been authorized by an administrator yet" in login_error(log_in(hub, "eve", STUDENT_PASSWORD))

    r = sign_up_decision(admin, hub.url, "mallory", "discard")
    assert r.status_code == 302, r.text[-500:]
    assert "mallory" not in sign_ups(hub)
    # Bad input: a sentence and a 4xx.
    r = sign_up_decision(admin, hub.url, "nobody-signed-up", "authorize")
    assert r.status_code == 404
    assert "No sign-up named &#39;nobody-signed-up&#39;." in r.text
    r = sign_up_decision(admin, hub.url, "eve", "toggle")
    assert r.status_code == 400
    assert "Send action=authorize or action=unauthorize" in r.text
    assert sign_up_decision(admin, hub.url, "admin", "discard").status_code == 409

    # A student cannot press the admin's buttons.
    student = requests.Session()
    native_sign_up(student, hub.url, "bob", STUDENT_PASSWORD)
    sign_up_decision(admin, hub.url, "bob", "authorize")
    assert log_in(hub, "bob", STUDENT_PASSWORD, student).status_code == 302
    assert sign_up_decision(student, hub.url, "eve", "authorize").status_code == 403
    assert sign_ups(hub)["eve"] is False


def test_the_e_mail_link_opens_a_page_and_its_button_confirms(running_hub, tmp_path):
    """Self-approval (``allow_self_approval_for``, from the local config file): the mailed link shows a
    Confirm button and changes nothing; its POST authorizes and makes the hub user."""
    secret = "a-test-secret-key-for-links"
    local = tmp_path / "local_config.py"
    local.write_text(
        "c = get_config()\n"
        "c.NativeAuthenticator.allow_self_approval_for = r'^nobody@nowhere\\.invalid$'\n"
        f"c.NativeAuthenticator.secret_key = {secret!r}\n"
    )
    hub = running_hub({"WORKBENCH_SIMULATED_GPUS": "1", "WORKBENCH_LOCAL_CONFIG": str(local)})
    # carol's address does not match the pattern, so no mail is sent; the link is made as the hub makes it
    r = hub_form(
        requests.Session(),
        hub.url,
        "/hub/signup",
        {
            "username": "carol",
            "email": "carol@example.org",
            "signup_password": STUDENT_PASSWORD,
            "signup_password_confirmation": STUDENT_PASSWORD,
        },
    )
    assert "sent to the admin" in r.text, r.text[-1000:]
    expire = (datetime.now(UTC) + timedelta(minutes=15)).isoformat()
    link = f"{hub.url}/hub/confirm/{Signer(secret).sign_object({'username': 'carol', 'expire': expire})}"

    browser = requests.Session()
    page = browser.get(link, timeout=30)
    assert page.status_code == 200
    assert "Confirm the sign-up of carol" in page.text
    assert 'id="confirm_submit"' in page.text
    assert sign_ups(hub)["carol"] is False
    assert browser.get(f"{hub.url}/hub/confirm/not-a-signed-link", timeout=30).text.count("Invalid URL") == 1

    r = browser.post(link, data={"_xsrf": browser.cookies.get("_xsrf")}, timeout=30)
    assert "carol has been authorized!" in r.text, r.text[-1000:]
    assert sign_ups(hub)["carol"] is True
    assert hub.api("GET", "/users/carol").status_code == 200
    assert log_in(hub, "carol", STUDENT_PASSWORD).status_code == 302


# -- the lock-out, on by default -------------------------------------------------------------------


def test_ten_wrong_passwords_then_the_right_one_is_refused_with_the_time_left(running_hub):
    hub = running_hub({"WORKBENCH_SIMULATED_GPUS": "1"})  # the defaults: 5 failed logins, 300 s
    native_sign_up(requests.Session(), hub.url, "admin", PASSWORD)
    answers = [login_error(log_in(hub, "admin", f"guess-{i}-wrong")) for i in range(10)]
    assert answers[:4] == [INVALID] * 4
    # The fifth failure locks the name: it and every try after it read when to try again.
    assert all(LOCKED.fullmatch(answer) for answer in answers[4:]), answers
    r = log_in(hub, "admin", PASSWORD)
    assert r.status_code == 200, "the right password logged in during the lock-out"
    match = LOCKED.fullmatch(login_error(r))
    assert match, login_error(r)
    assert match.group(2) in ("5 minutes",) or match.group(2).startswith("4 minutes"), match.group(2)
    # Another name is not held up.
    native_sign_up(requests.Session(), hub.url, "ann", STUDENT_PASSWORD)  # waits for an admin
    assert "has not been authorized" in login_error(log_in(hub, "ann", STUDENT_PASSWORD))


def test_guesses_sent_at_once_are_all_counted(running_hub):
    """Ten guesses at once: the checks of one name wait for each other, so exactly five are checked
    (the lock-out's default) and the other five are refused without a password check."""
    hub = running_hub({"WORKBENCH_SIMULATED_GPUS": "1"})
    native_sign_up(requests.Session(), hub.url, "admin", PASSWORD)
    sessions = [requests.Session() for _ in range(10)]
    for session in sessions:
        session.get(f"{hub.url}/hub/login", timeout=30)  # each its own _xsrf, as ten browsers
    start = threading.Barrier(10)

    def guess(i: int) -> str:
        session = sessions[i]
        start.wait()
        r = session.post(
            f"{hub.url}/hub/login",
            data={"username": "admin", "password": f"guess-{i}-wrong", "_xsrf": session.cookies.get("_xsrf")},
            allow_redirects=False,
            timeout=60,
        )
        return login_error(r)

    with ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(guess, range(10)))
    assert all(answer == INVALID or LOCKED.fullmatch(answer) for answer in answers), answers
    assert sum(1 for answer in answers if LOCKED.fullmatch(answer)) >= 6, answers
    refused = "Login refused for admin without a password check: locked out after 5 failed logins"
    assert hub.log().count(refused) == 5, hub.log()[-3000:]
    assert LOCKED.fullmatch(login_error(log_in(hub, "admin", PASSWORD)))
    assert hub.log().count(refused) == 6


def test_the_lockout_can_be_turned_off(running_hub):
    hub = running_hub({"WORKBENCH_SIMULATED_GPUS": "1", "WORKBENCH_LOGIN_ATTEMPTS": "0"})
    native_sign_up(requests.Session(), hub.url, "admin", PASSWORD)
    assert [login_error(log_in(hub, "admin", f"wrong-{i}")) for i in range(6)] == [INVALID] * 6
    assert log_in(hub, "admin", PASSWORD).status_code == 302


# -- SameSite on every cookie ----------------------------------------------------------------------


def test_the_hubs_and_the_user_servers_cookies_say_samesite_lax(running_hub):
    hub = running_hub({"WORKBENCH_SIMULATED_GPUS": "1"})
    native_sign_up(requests.Session(), hub.url, "admin", PASSWORD)
    browser = requests.Session()
    page = browser.get(f"{hub.url}/hub/login", timeout=30)
    login = log_in(hub, "admin", PASSWORD, browser)
    assert login.status_code == 302
    hub_cookies = set_cookie_lines([page, login])
    assert {"_xsrf", "jupyterhub-session-id", "jupyterhub-hub-login"} <= set(hub_cookies), hub_cookies
    for name, lines in hub_cookies.items():
        assert all("; samesite=lax" in line for line in lines), (name, lines)

    # The user's server: JupyterHub's OAuth into it sets its own login cookie, OAuth state and _xsrf.
    r = hub.spawn("admin")
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("admin", timeout=120)
    lab = browser.get(f"{hub.url}/user/admin/lab", timeout=60)
    assert lab.status_code == 200, lab.text[-500:]
    server_cookies = set_cookie_lines([*lab.history, lab])
    expected = {"jupyterhub-user-admin", "jupyterhub-user-admin-oauth-state", "_xsrf"}
    assert expected <= set(server_cookies), server_cookies
    for name in expected:
        assert all("; samesite=lax" in line for line in server_cookies[name]), (name, server_cookies[name])
    assert all("; path=/user/admin/" in line for line in server_cookies["_xsrf"]), server_cookies["_xsrf"]


# -- the first admin -------------------------------------------------------------------------------


def refused_start(tmp_path: Path, env: dict[str, str]) -> str:
    """Start a hub that must stop at start with status 2; its log."""
    hub = Hub(tmp_path / "refused", env, [])
    hub.data_dir.mkdir()
    with pytest.raises(RuntimeError, match="the hub exited with 2"):
        hub.start()
    return hub.log()


OFF_LOOPBACK = {"WORKBENCH_SIMULATED_GPUS": "1", "WORKBENCH_ALLOW_HTTP": "1"}  # a TLS proxy in front


def test_off_loopback_the_hub_does_not_start_without_the_admins_password(tmp_path):
    log = refused_start(tmp_path, {**OFF_LOOPBACK, "WORKBENCH_ADMIN_USERS": "admin,grace"})
    sentences = [line for line in log.splitlines() if line.startswith("GPU Workbench: ")]
    assert sentences == [
        "GPU Workbench: this hub is reached from other machines (a TLS proxy in front (WORKBENCH_ALLOW_HTTP=1)) "
        "and the admin accounts admin and grace do not exist yet, so whoever signed up first under those names "
        "would own the hub: set WORKBENCH_ADMIN_PASSWORD (at least 8 characters, not a common password) and each "
        "admin without an account gets one with it at start (README: The first admin)"
    ], log[-3000:]
    assert "Traceback" not in log


def test_a_weak_admin_password_stops_the_hub_with_a_sentence(tmp_path):
    log = refused_start(tmp_path, {**OFF_LOOPBACK, "WORKBENCH_ADMIN_PASSWORD": "password"})
    assert (
        "GPU Workbench: WORKBENCH_ADMIN_PASSWORD does not pass the hub's password rules: it needs at least 8 "
        "characters and must not be one of the common passwords NativeAuthenticator refuses"
    ) in log


def test_the_admins_password_makes_their_accounts_at_start_and_is_never_shown(running_hub):
    secret = "first-admin-" + "x7Qp2" * 3
    hub = running_hub({**OFF_LOOPBACK, "WORKBENCH_ADMIN_USERS": "admin,grace", "WORKBENCH_ADMIN_PASSWORD": secret})
    assert sign_ups(hub) == {"admin": True, "grace": True}
    # Nobody can take the name by signing up first; the admin logs in with the password.
    r = hub_form(
        requests.Session(),
        hub.url,
        "/hub/signup",
        {"username": "admin", "signup_password": "mine-now-1234", "signup_password_confirmation": "mine-now-1234"},
    )
    assert "this username is already in use" in r.text
    assert log_in(hub, "admin", "mine-now-1234").status_code == 200
    admin = requests.Session()
    assert log_in(hub, "grace", secret, admin).status_code == 302
    assert admin.get(f"{hub.url}/hub/authorize", timeout=30).status_code == 200  # an admin's page
    assert "Admin account admin made at start" in hub.log()
    assert secret not in hub.log()
    assert secret.encode() not in Path(f"/proc/{hub.proc.pid}/cmdline").read_bytes()

    # Started again without the variable: the accounts exist, so the hub starts, passwords unchanged.
    hub.stop()
    del hub.env["WORKBENCH_ADMIN_PASSWORD"]
    hub.start()
    assert log_in(hub, "admin", secret).status_code == 302
    assert secret not in hub.log()


def test_on_loopback_the_first_sign_up_as_admin_still_works(running_hub):
    hub = running_hub({"WORKBENCH_SIMULATED_GPUS": "1"})
    assert "The signup was successful" in native_sign_up(requests.Session(), hub.url, "admin", PASSWORD)
    assert log_in(hub, "admin", PASSWORD).status_code == 302
