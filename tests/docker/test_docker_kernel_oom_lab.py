"""A student's notebook kernel killed by her Docker server's memory limit: JupyterLab says so, with the limit.

End to end, nothing faked: a real hub with the docker backend starts the student's server with the small
profile's 512 MiB memory limit; she signs up, is authorized, logs in in Chromium, spawns from the form and
opens a notebook in her JupyterLab, which starts a session with a kernel. The test then finds that
notebook's kernel through the server's sessions API (``GET /user/<name>/api/sessions``, her token) and runs
a cell that allocates until the container's memory cgroup is full in THAT kernel, over a second websocket
to it (tests/kernel_ws.py; JupyterLab's own keeps its connection). The kernel's OOM killer kills the
kernel, jupyter_server restarts it and tells every websocket of the kernel, the lab's too; the GPU monitor
extension asks ``api/gpu/memory``, which read the kill from the container's cgroup (v1 here), and the lab
shows "Your kernel was stopped because this server reached its memory limit (512 MiB): ...".
"""

from __future__ import annotations

import json

import pytest
import requests

from tests.browser.test_login_to_lab import _artifact, log_in, sign_up
from tests.browser.test_saved_before_stop_browser import ADMIN, admin_authorizes
from tests.docker.conftest import container_of, inspect, unique
from tests.docker.test_docker_kernel_oom import ALLOCATE, LIMIT, PROFILES, memory, oom_kill_count, wait_for
from tests.kernel_ws import Kernel
from tests.lab_browser import explained, wait_for_lab

pytestmark = [pytest.mark.docker, pytest.mark.browser, pytest.mark.integration]

NOTEBOOK = "load.ipynb"
# The lab's sentence for the 512 MiB limit (extensions/gpu-monitor/src/memoryModel.ts oomKillText).
LAB_TEXT = (
    "Your kernel was stopped because this server reached its memory limit (512 MiB): "
    "use a larger profile, or load less at once"
)
TOAST = ".Toastify__toast"


def notebook_kernel(hub_url: str, user: str, token: str, path: str) -> str | None:
    """The id of the kernel of the server's one session for the notebook ``path``; None while it has none."""
    r = requests.get(f"{hub_url}/user/{user}/api/sessions", headers={"Authorization": f"token {token}"}, timeout=10)
    assert r.status_code == 200, f"{r.status_code} {r.text[:2000]}"
    sessions = [s for s in r.json() if s.get("path") == path]
    assert len(sessions) <= 1, f"more than one session for {path}: {sessions}"
    if not sessions or not sessions[0].get("kernel"):
        return None
    return sessions[0]["kernel"]["id"]


def test_the_lab_says_a_kernel_was_killed_by_the_servers_memory_limit(docker_hub, chromium_browser):
    from playwright.sync_api import expect

    hub = docker_hub(WORKBENCH_PROFILES=PROFILES, WORKBENCH_ADMIN_USERS=ADMIN)
    student = unique("stu")
    hub.track_users.append(student)
    page = chromium_browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(60_000)
    console: list[str] = []
    page.on("console", lambda msg: console.append(f"{msg.type}: {msg.text}"))
    kernel = None
    try:
        # She signs up, the admin authorizes her, she logs in and starts her server from the form.
        with explained(page, "docker-kernel-oom-lab-spawn", hub.log):
            assert "sent to the admin" in sign_up(page, hub.url, student)
            admin_authorizes(hub.url, student)
            log_in(page, hub.url, student)
            page.wait_for_url("**/hub/spawn**")
            page.locator("#workbench-gpus").fill("1")
            assert page.is_checked("#workbench-profile-small"), "the small profile (512 MiB) is the default"
            page.click("form#spawn_form [type=submit]")
            wait_for_lab(page, hub.url, student, log=hub.log)
        name = container_of(hub, student)
        assert inspect(name)["HostConfig"]["Memory"] == LIMIT, "the small profile limits the container"
        token = hub.user_token(student)
        before = memory(hub.url, student, token)
        print("api/gpu/memory before:", before)
        assert before["cgroup"] == "v1", before
        assert before["limit_bytes"] == LIMIT, before
        assert before["oom_kills"] == 0, before
        assert before["last_oom_kill_at"] is None, before
        server_pid = inspect(name)["State"]["Pid"]

        # Her notebook, opened in her lab: the lab starts a session with a kernel for it.
        cell = {
            "cell_type": "code",
            "source": "print('alive', 6 * 7)",
            "metadata": {},
            "outputs": [],
            "execution_count": None,
        }
        content = {
            "cells": [cell],
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            "nbformat": 4,
            "nbformat_minor": 5,
        }
        r = requests.put(
            f"{hub.url}/user/{student}/api/contents/{NOTEBOOK}",
            headers={"Authorization": f"token {token}"},
            data=json.dumps({"type": "notebook", "format": "json", "content": content}),
            timeout=30,
        )
        assert r.status_code in (200, 201), r.text
        with explained(page, "docker-kernel-oom-lab-notebook", hub.log):
            page.goto(f"{hub.url}/user/{student}/lab/tree/{NOTEBOOK}", wait_until="domcontentloaded")
            expect(page.locator(".jp-NotebookPanel .jp-Notebook .jp-Cell")).to_have_count(1, timeout=120_000)
            # The lab's kernel is up: the notebook's execution indicator says idle.
            expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")).to_have_count(
                1, timeout=120_000
            )
        kernel_id = wait_for(
            lambda: notebook_kernel(hub.url, student, token, NOTEBOOK), 30, f"a session with a kernel for {NOTEBOOK}"
        )
        print("the notebook's kernel:", kernel_id)
        assert page.get_by_text("reached its memory limit").count() == 0, "nothing spoke of memory yet"

        # The allocating cell runs in the notebook's own kernel; the container's memory limit kills it.
        kernel = Kernel(hub.url, student, token, kernel_id)
        kernel.wait_ready(60)
        outcome = kernel.execute(ALLOCATE, timeout=120)
        print("the cell:", outcome.describe())
        assert outcome.kernel_died, f"the kernel was not killed: {outcome.describe()}"
        assert not outcome.closed, f"the kernel was not killed: {outcome.describe()}"
        after = wait_for(
            lambda: (m := memory(hub.url, student, token))["oom_kills"] and m, 15, "api/gpu/memory counts the kill"
        )
        print("api/gpu/memory after:", after)
        assert after["oom_kills"] >= 1, after
        assert after["oom_kills"] == oom_kill_count(name), after

        # The lab, whose notebook's kernel died, says why, with the server's real limit.
        with explained(page, "docker-kernel-oom-lab-notification", hub.log):
            toast = page.locator(TOAST, has_text=LAB_TEXT)
            expect(toast).to_have_count(1, timeout=30_000)
            expect(toast).to_be_visible()
            print("the lab said:", toast.inner_text())
            page.screenshot(path=str(_artifact("docker-kernel-oom-lab.png")))

        # The server survived (same container, same process), and the notebook's session kept its kernel
        # (the same id: jupyter_server restarted it in place).
        state = inspect(name)["State"]
        assert state["Running"], state
        assert not state["OOMKilled"], state
        assert state["Pid"] == server_pid, state
        assert notebook_kernel(hub.url, student, token, NOTEBOOK) == kernel_id
        assert student not in hub.usage_reasons(), "the server did not end"

        # She closes JupyterLab's own "Kernel Restarting" dialog and runs her cell in the lab (Shift+Enter):
        # the restarted kernel answers in the notebook, and the notification stays until she closes it.
        with explained(page, "docker-kernel-oom-lab-rerun", hub.log):
            dialog = page.locator(".jp-Dialog", has_text="appears to have died")
            expect(dialog).to_be_visible(timeout=10_000)
            dialog.get_by_role("button", name="Ok").click()
            expect(dialog).to_have_count(0)
            page.locator(".jp-NotebookPanel .jp-Cell").first.click()
            page.keyboard.press("Shift+Enter")
            output = page.locator(".jp-NotebookPanel .jp-Cell").first.locator(".jp-OutputArea-output")
            expect(output).to_have_text("alive 42", timeout=60_000)
            expect(page.locator(".jp-NotebookPanel .jp-InputPrompt").first).to_have_text("[1]:")
            expect(toast).to_be_visible()
    finally:
        print("browser console, last lines:", *console[-40:], sep="\n  ")
        if kernel:
            kernel.close()
        page.close()
