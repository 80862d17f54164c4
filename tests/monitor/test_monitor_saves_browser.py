"""JupyterLab in Debian's Chromium saves a notebook's unsaved edit before the hub stops the server.

The hub's service PUTs notices to ``api/gpu/notices`` as here; when one says ``stopping`` (or its
countdown reaches 0) the lab saves every open document with unsaved changes, reports the round to
``POST api/gpu/saves`` and says "saved 1 notebook before stopping" in the status bar.

Needs /usr/bin/chromium (or WORKBENCH_CHROMIUM) and the built labextension;
skips with the reason otherwise, fails instead when WORKBENCH_STRICT_TESTS=1.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import pytest
import requests

from tests.lab_browser import explained
from tests.monitor.monitor_support import kernel_ready, start_server, stop_server

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("saves")
    server = start_server(tmp, {"WORKBENCH_SIMULATED_GPUS": "1"}, app="lab", interval=1.0)
    server.root = tmp / "root"
    yield server
    stop_server(server)


def put_notices(server, notices: list[dict]) -> None:
    response = requests.put(
        server.url + "api/gpu/notices",
        json={"notices": notices},
        headers={"Authorization": f"token {server.token}"},
        timeout=10,
    )
    assert response.status_code == 200, response.text


def notice(notice_id: str, seconds: float, **over) -> dict:
    return {
        "id": notice_id,
        "kind": "idle",
        "message": "Your server will be stopped because its GPU has been idle.",
        "hint": "Use the GPU to keep it.",
        "stop_at": (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat(),
        **over,
    }


def write_notebook(server, name: str, source: str) -> None:
    cell = {"cell_type": "code", "source": source, "metadata": {}, "outputs": [], "execution_count": None}
    nb = {
        "cells": [cell],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (server.root / name).write_text(json.dumps(nb))


def source_on_disk(server, name: str) -> str:
    cells = json.loads((server.root / name).read_text())["cells"]
    return "".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in cells)


def open_and_edit(page, server, name: str, marker: str) -> None:
    """Open the notebook, type into its cell and wait for JupyterLab to mark the tab unsaved."""
    from playwright.sync_api import expect

    page.goto(f"{server.url}lab/tree/{name}?reset&token={server.token}", wait_until="domcontentloaded")
    editor = page.locator(".jp-Notebook .jp-Cell .cm-content").first
    expect(editor).to_be_visible(timeout=90_000)
    # The kernel's first connection writes its language_info into the notebook (unsaved): save that
    # first, so the edit below is the only unsaved change.
    kernel_ready(server, name)
    expect(page.get_by_text("Python 3 (ipykernel) | Idle")).to_be_visible(timeout=30_000)
    page.wait_for_timeout(1_000)
    editor.click()
    page.keyboard.press("Control+s")
    expect(page.locator(".lm-TabBar-tab.jp-mod-dirty")).to_have_count(0, timeout=10_000)
    page.keyboard.press("End")
    page.keyboard.type(f"  # {marker}")
    expect(page.locator(".lm-TabBar-tab.jp-mod-dirty")).to_have_count(1, timeout=10_000)
    assert marker not in source_on_disk(server, name), "saved before any notice"


def saves_report(server, notice_id: str) -> dict:
    response = requests.get(
        server.url + "api/gpu/saves",
        params={"notice_id": notice_id},
        headers={"Authorization": f"token {server.token}"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    return response.json()


def wait_on_disk(server, name: str, marker: str, seconds: float = 30) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if marker in source_on_disk(server, name):
            return True
        time.sleep(0.3)
    return False


def test_a_stopping_notice_saves_the_unsaved_notebook(chromium_browser, labextension_built, lab):
    from playwright.sync_api import expect

    write_notebook(lab, "stopping.ipynb", "x = 1")
    page = chromium_browser.new_page(viewport={"width": 1400, "height": 900})
    with explained(page, "monitor-saves-stopping", lab.log_text):
        open_and_edit(page, lab, "stopping.ipynb", "edited before the stop")
        # the hub is stopping the server now: stop_at is now, and it says so
        put_notices(lab, [notice("stop-1", 0, stopping=True)])

        assert wait_on_disk(lab, "stopping.ipynb", "edited before the stop"), "the edit was not saved"
        status = page.locator(".jp-WorkbenchGPU-notice")
        expect(status).to_contain_text("saved 1 notebook before stopping", timeout=15_000)
        expect(page.locator(".lm-TabBar-tab.jp-mod-dirty")).to_have_count(0)  # saved, not merely reported
        report = saves_report(lab, "stop-1")
        assert report["saved"] == 1, report
        assert report["failed"] == 0, report
        assert report["names"] == ["stopping.ipynb"], report
        assert report["reported"] == 1, report
        assert report["done"] is True, report
    put_notices(lab, [])
    page.close()


def test_the_countdown_reaching_zero_saves_and_nothing_left_says_all_saved(chromium_browser, labextension_built, lab):
    from playwright.sync_api import expect

    write_notebook(lab, "countdown.ipynb", "y = 2")
    page = chromium_browser.new_page(viewport={"width": 1400, "height": 900})
    with explained(page, "monitor-saves-countdown", lab.log_text):
        open_and_edit(page, lab, "countdown.ipynb", "edited in the countdown")
        put_notices(lab, [notice("idle-2", 6)])  # seen within a poll (10 s), counted down in the lab
        status = page.locator(".jp-WorkbenchGPU-notice")
        assert wait_on_disk(lab, "countdown.ipynb", "edited in the countdown"), "not saved at the countdown's end"
        expect(status).to_contain_text("saved 1 notebook before stopping", timeout=15_000)
        assert saves_report(lab, "idle-2")["saved"] == 1

        # The hub then says "stopping" for the same notice: a second round finds nothing unsaved,
        # and this tab's report still counts the notebook the first round saved.
        put_notices(lab, [notice("idle-2", 0, stopping=True)])
        page.wait_for_timeout(5_000)  # the lab polls every 2 s once a stop is under a minute away
        expect(status).to_contain_text("saved 1 notebook before stopping")
        assert saves_report(lab, "idle-2")["saved"] == 1

        # A new stop with nothing unsaved says so.
        put_notices(lab, [notice("stop-3", 0, stopping=True)])
        expect(status).to_contain_text("all work saved before stopping", timeout=15_000)
        assert saves_report(lab, "stop-3")["saved"] == 0
    put_notices(lab, [])
    page.close()
