"""A student with two named servers in Chromium: a GPU server for training started from its own spawn form
(``/hub/spawn/alice/big``), a CPU-only server for writing started through the REST API. The hub's home page
lists each with what it holds and its state; the spawn form of a third server says which of her servers holds
her GPU; the SSH page of the named server gives the entry for that server; stopping the writing server from
the home page leaves the GPU server running, and its row says why it stopped.

One hub for the file (4 simulated GPUs, up to 3 named servers, the default quota of 1 GPU): the tests run in
order and build on each other, as the student does.
"""

from __future__ import annotations

import re

import pytest
import requests

from tests.browser.test_login_to_lab import _artifact, log_in, sign_up
from tests.browser.test_saved_before_stop_browser import admin_authorizes
from tests.conftest import hub_pool, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.integration]

STUDENT = "alice"
GPU0 = "GPU-sim-00-h100-80gb"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with hub_pool(tmp_path_factory.mktemp("named-servers")) as start:
        yield start({"WORKBENCH_SIMULATED_GPUS": "4", "WORKBENCH_NAMED_SERVERS": "3", "WORKBENCH_ADMIN_USERS": "admin"})


@pytest.fixture
def page(hub, chromium_browser):
    page = chromium_browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(60_000)
    if not hub.api("GET", f"/users/{STUDENT}").ok:
        assert "sent to the admin" in sign_up(page, hub.url, STUDENT)
        admin_authorizes(hub.url, STUDENT)
    log_in(page, hub.url, STUDENT)
    page.wait_for_url(re.compile(r".*/hub/(spawn|home|user).*"))
    return page


def servers(hub) -> dict:
    return hub.api("GET", f"/users/{STUDENT}").json()["servers"]


def rows(page) -> dict[str, tuple[str, str, str]]:
    """The home page's server table as the student reads it: server -> (name cell, GPUs, state)."""
    found = {}
    for row in page.locator("#workbench-servers tr.workbench-server-row").all():
        cells = [" ".join(c.inner_text().split()) for c in row.locator("td").all()]
        found[row.get_attribute("data-server")] = tuple(cells)
    return found


def test_a_named_gpu_server_starts_from_its_own_form_and_the_home_page_shows_both(hub, page):
    page.goto(f"{hub.url}/hub/spawn/{STUDENT}/big")
    assert page.inner_text("#workbench-starting") == "Starting server big."
    assert page.inner_text("#workbench-held") == "You hold 0 GPUs now."
    page.locator("#workbench-gpus").fill("1")
    page.click("form#spawn_form [type=submit]")
    page.wait_for_url(re.compile(rf".*/(spawn-pending|user)/{STUDENT}/big.*"))
    # The writing server: CPU only, through the REST API, beside it.
    assert hub.api("POST", f"/users/{STUDENT}/servers/small", json={"gpus": 0}).status_code in (201, 202)
    wait_until(
        lambda: {name for name, s in servers(hub).items() if s.get("ready")} == {"big", "small"},
        180,
        "big and small to be ready",
        log=hub.log,
    )
    assert hub.leases() == {STUDENT: [GPU0]}

    page.goto(f"{hub.url}/hub/home")
    page.wait_for_selector("#workbench-servers")
    assert rows(page) == {
        "": ("default server", "", "not running"),
        "big": ("big", "H100-80GB (GPU 0) simulated", "running"),
        "small": ("small", "none (CPU only)", "running"),
    }
    assert page.locator('tr[data-server="big"] a').get_attribute("href") == f"/user/{STUDENT}/big/"
    # JupyterHub's own list of named servers is still there, below.
    assert page.locator('tr.home-server-row[data-server-name="small"]').count() == 1
    page.screenshot(path=str(_artifact("home-named-servers.png")), full_page=True)


def test_the_form_of_a_third_server_says_which_server_holds_the_gpu(hub, page):
    page.goto(f"{hub.url}/hub/spawn/{STUDENT}/third")
    assert page.inner_text("#workbench-starting") == "Starting server third."
    assert page.inner_text("#workbench-held") == "You hold 1 GPU now: 1 on big."
    states = [
        " ".join(c.split()) for c in page.locator("#workbench-gpu-table tbody tr td:nth-child(4)").all_inner_texts()
    ]
    assert states == ["yours: big", "free", "free", "free"]
    # Her quota is 1 GPU at once and big holds it: this server may have none.
    assert page.locator("#workbench-gpus").get_attribute("max") == "0"
    page.screenshot(path=str(_artifact("spawn-form-third-server.png")), full_page=True)


def test_the_ssh_page_of_a_named_server_is_that_servers(hub):
    token = hub.user_token(STUDENT)
    r = requests.get(
        f"{hub.url}/user/{STUDENT}/big/api/workbench/ssh", headers={"Authorization": f"token {token}"}, timeout=30
    )
    assert r.status_code == 200, r.text[-2000:]
    info = r.json()
    assert info["websocket_url"] == f"ws://127.0.0.1:{hub.port}/user/{STUDENT}/big/sshd/"
    assert info["alias"] == f"workbench-127.0.0.1-{STUDENT}+big"
    assert info["token_scope"] == f"access:servers!server={STUDENT}/big"


def test_stopping_one_server_from_the_home_page_leaves_the_other_and_says_why(hub, page):
    page.goto(f"{hub.url}/hub/home")
    page.click("#stop-small")  # JupyterHub's own stop button of the named server
    wait_until(lambda: "small" not in servers(hub) or not servers(hub)["small"].get("ready"), 60, "small to stop")
    wait_until(lambda: not servers(hub).get("small"), 60, "small to be gone from the running servers", log=hub.log)
    page.goto(f"{hub.url}/hub/home")
    page.wait_for_selector("#workbench-servers")
    assert rows(page) == {
        "": ("default server", "", "not running"),
        "big": ("big", "H100-80GB (GPU 0) simulated", "running"),
        "small": ("small", "", "stopped You stopped this server."),
        "third": ("third", "", "not running"),  # made when its form opened, never started
    }
    assert hub.leases() == {STUDENT: [GPU0]}, "big keeps its GPU"
    page.screenshot(path=str(_artifact("home-named-servers-one-stopped.png")), full_page=True)
