"""The SSH page in Chromium: a bad key gets a sentence and changes nothing; a key
added there lets the next ``ssh`` in (tests/ssh/conftest.py's shared hub)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.ssh, pytest.mark.browser, pytest.mark.docker, pytest.mark.integration]


def test_a_key_added_on_the_page_lets_the_next_ssh_in(ssh_hub, alice, chromium_browser):
    laptop = ssh_hub.keygen("browser-laptop")
    refused = ssh_hub.run("ssh", alice.name, "HOST", "echo in", identity=laptop)
    assert refused.returncode != 0 and "Permission denied (publickey)" in refused.stderr

    context = chromium_browser.new_context(extra_http_headers={"Authorization": f"token {alice.token}"})
    try:
        page = context.new_page()
        page.goto(f"{ssh_hub.hub.url}/user/{alice.name}/workbench/ssh")
        config = page.locator("#ssh-config")
        config.wait_for()
        page.wait_for_function("document.querySelector('#ssh-config').textContent.includes('ProxyCommand')")
        text = config.text_content()
        assert f"/user/{alice.name}/sshd/" in text and "User jovyan" in text and "websocat --binary" in text
        before = ssh_hub.server_api(alice.name, "GET", "/keys").json()["keys"]

        page.fill("#key", "ssh-rsa this-is-not-a-key")
        page.click("#add")
        page.wait_for_selector("#message.error")
        assert "not valid base64" in page.text_content("#message")
        assert ssh_hub.server_api(alice.name, "GET", "/keys").json()["keys"] == before

        page.fill("#key", (laptop.parent / f"{laptop.name}.pub").read_text())
        page.click("#add")
        page.wait_for_selector("#message.ok")
        assert page.text_content("#message").startswith("Key added: SHA256:")
        page.wait_for_function("document.querySelector('#keys').textContent.includes('browser-laptop@laptop')")
    finally:
        context.close()

    r = ssh_hub.run("ssh", alice.name, "HOST", "echo in", identity=laptop)
    assert r.returncode == 0 and r.stdout == "in\n", r.stderr
