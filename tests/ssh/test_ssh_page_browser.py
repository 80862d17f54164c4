"""The SSH page in Chromium, reached as a person reaches it: log in at /hub/login (a cookie,
so the page's API calls need the XSRF header), open JupyterLab, click the launcher's
"SSH into this server". There a bad key gets a sentence and changes nothing; the client
file downloads; a key added there lets the next ``ssh`` in, with the config entry the
page shows (tests/ssh/conftest.py's shared hub)."""

from __future__ import annotations

import subprocess

import pytest
import requests

from tests.browser.test_login_to_lab import PASSWORD, log_in, sign_up
from tests.conftest import hub_form, native_sign_up, sign_up_decision

pytestmark = [pytest.mark.ssh, pytest.mark.browser, pytest.mark.docker, pytest.mark.integration]

#: the hub's admin (WORKBENCH_ADMIN_USERS' default), who authorizes sign-ups
ADMIN = "admin"


def admin_authorizes(hub_url: str, name: str) -> None:
    """NativeAuthenticator: the admin signs up (authorized at once), logs in, authorizes ``name``."""
    session = requests.Session()
    native_sign_up(session, hub_url, ADMIN, PASSWORD)
    r = hub_form(session, hub_url, "/hub/login", {"username": ADMIN, "password": PASSWORD})
    assert r.status_code == 302, r.text
    r = sign_up_decision(session, hub_url, name, "authorize")
    assert r.status_code == 302, r.text


def test_a_key_added_on_the_page_lets_the_next_ssh_in(ssh_hub, alice, chromium_browser):
    laptop = ssh_hub.keygen("browser-laptop")
    refused = ssh_hub.run("ssh", alice.name, "HOST", "echo in", identity=laptop)
    assert refused.returncode != 0
    assert "Permission denied (publickey)" in refused.stderr

    hub_url = ssh_hub.hub.url
    context = chromium_browser.new_context(accept_downloads=True, viewport={"width": 1400, "height": 900})
    context.set_default_timeout(60_000)
    try:
        lab = context.new_page()
        assert "sent to the admin" in sign_up(lab, hub_url, alice.name)
        admin_authorizes(hub_url, alice.name)
        log_in(lab, hub_url, alice.name)
        lab.wait_for_url(lambda url: "/hub/login" not in url)
        assert "jupyterhub-hub-login" in {c["name"] for c in context.cookies()}  # logged in with a cookie

        # JupyterLab's launcher links the page (jupyter-server-proxy's launcher entry)
        lab.goto(f"{hub_url}/user/{alice.name}/lab")
        card = lab.locator(".jp-LauncherCard", has_text="SSH into this server")
        card.wait_for(timeout=120_000)
        with context.expect_page() as opened:
            card.click()
        page = opened.value
        page.wait_for_url(f"**/user/{alice.name}/workbench/ssh")
        page.wait_for_function("document.querySelector('#ssh-config').textContent.includes('ProxyCommand')")
        text = page.text_content("#ssh-config")
        assert f"/user/{alice.name}/sshd/" in text
        assert "User jovyan" in text
        assert "ProxyCommand python3 ~/.ssh/workbench-ssh-proxy.py --token-file ~/.ssh/workbench-token" in text
        assert alice.token not in page.content()

        # the client file, as the page's link downloads it, becomes the laptop's ProxyCommand
        with page.expect_download() as download:
            page.click("#proxy-script-link")
        proxy_file = ssh_hub.workdir / ".ssh" / "workbench-ssh-proxy.py"
        proxy_file.parent.mkdir(mode=0o700, exist_ok=True)
        download.value.save_as(proxy_file)
        assert proxy_file.read_text().startswith("#!/usr/bin/env python3")

        before = ssh_hub.server_api(alice.name, "GET", "/keys").json()["keys"]
        page.fill("#key", "ssh-rsa this-is-not-a-key")
        page.click("#add")
        page.wait_for_selector("#message.error")
        assert "not valid base64" in page.text_content("#message")
        assert ssh_hub.server_api(alice.name, "GET", "/keys").json()["keys"] == before

        # the browser's session is a cookie, so a POST without the page's X-XSRFToken header is refused
        status = page.evaluate(
            """async (key) => (await fetch(API + "/keys", {method: "POST",
            headers: {"Content-Type": "application/json"}, body: JSON.stringify({key})})).status""",
            (laptop.parent / f"{laptop.name}.pub").read_text(),
        )
        assert status == 403
        assert ssh_hub.server_api(alice.name, "GET", "/keys").json()["keys"] == before

        page.fill("#key", (laptop.parent / f"{laptop.name}.pub").read_text())
        page.click("#add")
        page.wait_for_selector("#message.ok")
        assert page.text_content("#message").startswith("Key added: SHA256:")
        page.wait_for_function("document.querySelector('#keys').textContent.includes('browser-laptop@laptop')")
        entry = page.text_content("#ssh-config-env")
    finally:
        context.close()

    cfg, alias = ssh_hub.config(alice.name, identity=laptop, entry=entry)
    r = subprocess.run(
        ["ssh", "-F", str(cfg), alias, "echo in"],
        capture_output=True,
        text=True,
        timeout=60,
        env=ssh_hub.env(alice.token),
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == "in\n", r.stderr
