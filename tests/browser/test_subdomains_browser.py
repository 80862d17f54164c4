"""A student's page opened by a logged-in admin in Chromium, with and without users' servers on their own origins.

Bob, a student, serves a page from his server: a file behind jupyter-server-proxy (``/user/bob/proxy/PORT/``,
as TensorBoard, Dash or ``python -m http.server`` are reached; jupyter_server already confines what it serves
under ``/files/`` to an opaque origin with ``sandbox``). The admin opens it and clicks its button. The page
then tries, as the admin: to read the hub's cookies (a window of the hub's page), to read a hub page and take
its ``_xsrf`` token, to call the hub's REST API (who am I, make a token), to send a token request blind, and to
read everyone's usage from the workbench service.

* ``WORKBENCH_SUBDOMAIN_HOST=http://localhost:PORT``: the page is on ``bob.localhost``, another origin. Every
  one of those fails in the browser, no token was made, and the hub on bob's own host knows no admin. A login
  on bob's host is refused. Bob's own JupyterLab, on his host, still reads his GPU monitor.
* without it: the same page, on the hub's origin, reads the hub's ``_xsrf`` cookie, learns it is the admin,
  makes a token of the admin's and reads everyone's usage. This contrast is what shows the test can fail.

Chromium resolves ``*.localhost`` to loopback by itself; Python's resolver may not, so the test's own requests
go to 127.0.0.1 with the host in ``Host``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.browser.test_login_to_lab import _artifact, log_in, sign_up
from tests.conftest import free_port, hub_pool, wait_until
from tests.lab_browser import explained, wait_for_lab

pytestmark = [pytest.mark.browser, pytest.mark.integration]

ADMIN = "admin"
STUDENT = "bob"
PAGE = Path(__file__).with_name("student_page.html")


@pytest.fixture
def student_site(tmp_path):
    """Bob's web server on loopback, as a student starts one in a terminal; its port."""
    site = tmp_path / "site"
    site.mkdir()
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(site)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_until(lambda: _answers(port), 30, "the student's http.server did not start")
    yield site, port
    proc.terminate()
    proc.wait(10)


def _answers(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/", timeout=2).status_code == 200
    except requests.RequestException:
        return False


@pytest.fixture
def start_hub(tmp_path):
    """start(subdomains) -> a started hub (local backend, one simulated GPU), on its own origins when asked."""
    local = tmp_path / "local_config.py"
    local.write_text("c.Spawner.http_timeout = 180\n")  # a busy 2-core host may take over 30 s to start one

    def prepare(hub):
        if "WORKBENCH_SUBDOMAIN_HOST" in hub.env:  # the port is the hub's own, known once it is made
            hub.env["WORKBENCH_SUBDOMAIN_HOST"] = hub.env["WORKBENCH_SUBDOMAIN_HOST"].format(port=hub.port)

    env = {"WORKBENCH_LOCAL_CONFIG": str(local), "WORKBENCH_SIMULATED_GPUS": "1", "WORKBENCH_ADMIN_USERS": ADMIN}
    with hub_pool(tmp_path, prepare) as start:
        yield lambda subdomains: start(
            {**env, "WORKBENCH_SUBDOMAIN_HOST": "http://localhost:{port}"} if subdomains else env
        )


def admin_opens_the_students_page(chromium_browser, hub, hub_origin: str, page_url: str) -> dict:
    """The admin logs in on the hub's host, opens the workbench service's page (its login cookie), then bob's
    page, confirms bob's server may know who they are (JupyterHub asks when it is not one's own server),
    and clicks the page's button. What the page found."""
    context = chromium_browser.new_context(viewport={"width": 1300, "height": 900})
    page = context.new_page()
    page.set_default_timeout(60_000)
    with explained(page, "subdomains-admin", hub.log):
        log_in(page, hub_origin, ADMIN)
        page.wait_for_url(re.compile(r".*/hub/(spawn|home).*"))
        page.goto(f"{hub_origin}/services/workbench/")
        page.wait_for_load_state()
        assert "GPU" in page.inner_text("body")
        page.goto(page_url)
        authorize = page.get_by_role("button", name="Authorize")
        if authorize.count():
            authorize.first.click()
        page.wait_for_url(page_url)
        page.click("#go")
        page.wait_for_selector("#result:not(:empty)", timeout=60_000)
        found = json.loads(page.inner_text("#result"))
        # Whether the browser would send the admin's hub login with a request the page makes to its own host.
        page_origin = re.match(r"https?://[^/]+", page_url).group(0)
        found["login_cookie_on_page_host"] = any(
            c["name"].startswith("jupyterhub-hub-login") for c in context.cookies(f"{page_origin}/hub/")
        )
        page.screenshot(
            path=str(_artifact(f"subdomains-student-page-{'own' if 'bob.' in page_url else 'hub'}-origin.png"))
        )
    context.close()
    return found


def admin_authorizes(chromium_browser, hub_origin: str, name: str) -> None:
    """The admin signs up (authorized at once), logs in on the hub's host and presses Authorize for ``name``."""
    context = chromium_browser.new_context()
    page = context.new_page()
    page.set_default_timeout(60_000)
    assert "The signup was successful!" in sign_up(page, hub_origin, ADMIN)
    log_in(page, hub_origin, ADMIN)
    page.wait_for_url(re.compile(r".*/hub/(spawn|home).*"))
    page.goto(f"{hub_origin}/hub/authorize")
    page.click(f'tr[id="{name}"] button:text-is("Authorize")')
    page.locator(f'tr[id="{name}"] button:text-is("Unauthorize")').wait_for()
    context.close()


def admins_tokens(hub) -> list[str]:
    return [t.get("note") or "" for t in hub.api("GET", f"/users/{ADMIN}/tokens").json().get("api_tokens", [])]


def write_page(site: Path, hub_origin: str) -> None:
    (site / "evil.html").write_text(PAGE.read_text().replace("__HUB__", hub_origin).replace("__ADMIN__", ADMIN))


def test_without_subdomains_a_students_page_acts_as_the_admin(start_hub, chromium_browser, student_site):
    """The contrast: what the page gets on the hub's origin."""
    hub = start_hub(False)
    site, port = student_site
    hub_origin = f"http://localhost:{hub.port}"
    write_page(site, hub_origin)
    page = chromium_browser.new_page()
    assert "The signup was successful!" in sign_up(page, hub_origin, ADMIN)
    page.close()
    hub.create_users(STUDENT)
    assert hub.spawn(STUDENT, gpus=0).status_code in (201, 202)
    assert hub.wait_ready(STUDENT, timeout=180)["url"] == f"/user/{STUDENT}/"

    found = admin_opens_the_students_page(
        chromium_browser, hub, hub_origin, f"{hub_origin}/user/{STUDENT}/proxy/{port}/evil.html"
    )
    assert "_xsrf=" in found["hub_cookies"], found
    assert found["login_cookie_on_page_host"] is True, found
    assert found["hub_page"] == "200 with _xsrf", found
    assert found["whoami"] == f"200 {ADMIN}", found
    assert found["token"] == "201 token", found
    assert found["service"] == "200 usage of everyone", found
    assert "taken by bob's page" in admins_tokens(hub)


def test_with_subdomains_the_students_page_gets_nothing_of_the_admins(start_hub, chromium_browser, student_site):
    hub = start_hub(True)
    site, port = student_site
    hub_origin = f"http://localhost:{hub.port}"
    bob_origin = f"http://{STUDENT}.localhost:{hub.port}"
    write_page(site, hub_origin)

    # Bob signs up, is authorized, logs in on the hub's host and starts a GPU server: his JupyterLab is on his
    # own host, and its status bar reads his GPU monitor there.
    bob = chromium_browser.new_context(viewport={"width": 1300, "height": 900})
    page = bob.new_page()
    page.set_default_timeout(60_000)
    with explained(page, "subdomains-student", hub.log):
        assert "sent to the admin" in sign_up(page, hub_origin, STUDENT)
        admin_authorizes(chromium_browser, hub_origin, STUDENT)
        log_in(page, hub_origin, STUDENT)
        page.wait_for_url("**/hub/spawn**")
        page.locator("#workbench-gpus").fill("1")
        with page.expect_response(
            lambda r: r.url.startswith(f"{bob_origin}/user/{STUDENT}/api/gpu/metrics") and r.status == 200,
            timeout=240_000,
        ) as metrics:
            page.click("form#spawn_form [type=submit]")
            wait_for_lab(page, bob_origin, STUDENT, log=hub.log)
        assert isinstance(metrics.value.json().get("gpus"), list)
        assert hub.server(STUDENT)["url"] == f"{bob_origin}/user/{STUDENT}/"
    bob.close()

    found = admin_opens_the_students_page(
        chromium_browser, hub, hub_origin, f"{bob_origin}/user/{STUDENT}/proxy/{port}/evil.html"
    )
    assert found["hub_cookies"].startswith("blocked: SecurityError"), found
    assert found["login_cookie_on_page_host"] is False, found
    for attempt in ("hub_page", "whoami", "token", "service"):
        assert found[attempt] == "blocked: TypeError", (attempt, found)
    assert found["own_host_api"] == "403", found  # the hub on bob's host: no admin's cookie there
    notes = admins_tokens(hub)
    assert "taken by bob's page" not in notes
    assert "sent blind by bob's page" not in notes

    # The hub's login form also shows on bob's host; logging in there is refused, and no login cookie is set.
    context = chromium_browser.new_context()
    page = context.new_page()
    page.set_default_timeout(60_000)
    log_in(page, bob_origin, ADMIN)
    page.wait_for_load_state()
    assert f"Cannot log in at {STUDENT}.localhost:{hub.port}: that address serves a user's own pages." in (
        page.inner_text("body")
    )
    assert not [c for c in context.cookies() if c["name"].startswith("jupyterhub-hub-login")]
    context.close()
