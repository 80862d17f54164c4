"""A student in Chromium loses nothing when idle reclaim stops her server: the notebook she edited and did
not save is saved before the stop, her lab's status bar says so, and the spawn page and the hub's home
page say why the server stopped.

JupyterLab's autosave is turned off for her (a user setting, as a student may), so only the GPU monitor's
save round can have written the edit: before the stop the file on disk lacks it, after the stop it has it.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import requests

from tests.browser.test_login_to_lab import PASSWORD, _artifact, log_in, sign_up
from tests.conftest import hub_form, native_sign_up, sign_up_decision, wait_until, write_utilization
from tests.lab_browser import explained, wait_for_lab

pytestmark = [pytest.mark.browser, pytest.mark.integration]

STUDENT = "ann"
ADMIN = "admin"
IDLE_MINUTES = 1  # warned after 30 idle seconds, stopped 30 s later
NOTEBOOK = "experiment.ipynb"
EDIT = "saved_by_the_stop = 37"
CAUSE = "idle GPU reclaimed after 1 minute"


def admin_authorizes(hub_url: str, name: str) -> None:
    """NativeAuthenticator: the admin signs up (authorized at once), logs in and authorizes ``name``."""
    session = requests.Session()
    native_sign_up(session, hub_url, ADMIN, PASSWORD)
    assert hub_form(session, hub_url, "/hub/login", {"username": ADMIN, "password": PASSWORD}).status_code == 302
    r = sign_up_decision(session, hub_url, name, "authorize")
    assert r.status_code == 302, r.text


def notebook_sources(path: Path) -> str:
    """Every cell's source in the notebook file on disk, joined."""
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in cells)


def test_an_unsaved_notebook_is_saved_before_idle_reclaim_stops_the_server(running_hub, chromium_browser, tmp_path):
    utilization = tmp_path / "utilization.json"
    write_utilization(utilization, {"*": 80})
    local = tmp_path / "local_config.py"
    local.write_text("c.Spawner.http_timeout = 180\n")  # a busy 2-core host may take over 30 s to start one
    hub = running_hub(
        {
            "WORKBENCH_LOCAL_CONFIG": str(local),
            "WORKBENCH_SIMULATED_GPUS": "1",
            "WORKBENCH_ADMIN_USERS": ADMIN,
            "WORKBENCH_SIMULATED_UTILIZATION": str(utilization),
            "WORKBENCH_GPU_IDLE_MINUTES": str(IDLE_MINUTES),
            "WORKBENCH_GPU_IDLE_CHECK_SECONDS": "1",
        }
    )
    page = chromium_browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(60_000)
    assert "sent to the admin" in sign_up(page, hub.url, STUDENT)
    admin_authorizes(hub.url, STUDENT)
    log_in(page, hub.url, STUDENT)
    page.wait_for_url("**/hub/spawn**")
    page.locator("#workbench-gpus").fill("1")
    page.click("form#spawn_form [type=submit]")
    wait_for_lab(page, hub.url, STUDENT, log=hub.log)

    # Her notebook, and no autosave: only a save round can write her edit before the stop.
    token = hub.user_token(STUDENT)
    server = f"{hub.url}/user/{STUDENT}"
    auth = {"Authorization": f"token {token}"}
    r = requests.put(
        f"{server}/lab/api/settings/@jupyterlab/docmanager-extension:plugin",
        data=json.dumps({"raw": json.dumps({"autosave": False})}),
        headers=auth,
        timeout=30,
    )
    assert r.status_code == 204, r.text
    notebook = {
        "cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": "x = 1"}],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    r = requests.put(
        f"{server}/api/contents/{NOTEBOOK}",
        json={"type": "notebook", "format": "json", "content": notebook},
        headers=auth,
        timeout=30,
    )
    assert r.status_code in (200, 201), r.text
    on_disk = hub.data_dir / "homes" / STUDENT / NOTEBOOK
    assert on_disk.exists(), f"the notebook is not in the student's home {on_disk.parent}"

    with explained(page, "saved-before-stop-edit", hub.log):
        page.goto(f"{server}/lab/tree/{NOTEBOOK}")
        page.wait_for_selector("#jp-main-dock-panel", timeout=120_000)
        editor = page.locator(".jp-NotebookPanel .jp-Cell .cm-content").first
        editor.wait_for(state="visible", timeout=60_000)
        editor.click()
        page.keyboard.press("Control+End")
        page.keyboard.press("Enter")
        page.keyboard.type(EDIT)
        # The document is dirty (JupyterLab marks its tab) and the file on disk lacks the edit.
        page.locator(".lm-TabBar-tab.jp-mod-dirty", has_text=NOTEBOOK).wait_for(state="visible", timeout=10_000)
    assert EDIT not in notebook_sources(on_disk)
    assert page.locator(".jp-WorkbenchGPU-notice").is_hidden(), "a busy GPU gets no warning"

    write_utilization(utilization, {"*": 0})  # the GPU goes quiet: warned, then reclaimed
    status = page.locator(".jp-WorkbenchGPU-notice")
    with explained(page, "saved-before-stop-status", hub.log):
        status.wait_for(state="visible", timeout=60_000)
        assert status.inner_text().startswith("GPU idle: stops in "), status.inner_text()
        time.sleep(3)
        assert EDIT not in notebook_sources(on_disk), "saved before the countdown ended (autosave is off)"
        # The status bar says what was saved, while the page still has the lab (the server may be gone).
        page.wait_for_function(
            "() => (document.querySelector('.jp-WorkbenchGPU-notice')?.textContent ?? '')"
            ".includes('saved 1 notebook before stopping')",
            timeout=IDLE_MINUTES * 60 * 1000 + 30_000,
        )
    said = status.inner_text()
    page.screenshot(path=str(_artifact("saved-before-stop-status-bar.png")))
    assert said == "saved 1 notebook before stopping", said

    hub.wait_stopped(STUDENT, timeout=90)
    saved = notebook_sources(on_disk)
    assert EDIT in saved, saved
    assert "x = 1" in saved, saved

    # The spawn page and the home page say why, with the idle limit as configured and the save.
    for path in (f"/hub/spawn/{STUDENT}", "/hub/home"):
        page.goto(f"{hub.url}{path}")
        box = page.locator(".workbench-stopped")
        with explained(page, f"saved-before-stop-box{path.replace('/', '-')}", hub.log):
            box.wait_for(state="visible", timeout=30_000)
        text = box.inner_text()
        assert CAUSE in text, (path, text)
        assert re.search(r"\bsaved 1 notebook\b", text), (path, text)
        assert "could not be reached" not in text, (path, text)
    page.screenshot(path=str(_artifact("saved-before-stop-home.png")), full_page=True)
    wait_until(
        lambda: ("ann", "reclaimed: GPU idle 1 min") in [(u, r) for u, rs in hub.usage_reasons().items() for r in rs],
        30,
        "the ledger's reason",
        hub.log,
    )
