"""Fixtures for the HTTPS tests: a test CA, a hub that serves its certificate, and a Chromium that trusts it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import CHROMIUM, CHROMIUM_ARGS, Hub, hub_pool, missing
from tests.https.certs import CA, nss_home

TEST_NAME = "workbench.test"  # resolved to 127.0.0.1 by Chromium's --host-resolver-rules


@pytest.fixture(scope="module")
def test_ca(tmp_path_factory):
    """A CA made for this module, its PEM file, and a certificate + key for workbench.test (and 127.0.0.1)."""
    directory = tmp_path_factory.mktemp("tls")
    ca = CA.make()
    cert, key = ca.write(directory, "hub", TEST_NAME, "127.0.0.1")
    return {"ca": ca, "ca_pem": ca.write_ca(directory / "ca.pem"), "cert": cert, "key": key, "dir": directory}


@pytest.fixture
def tls_hub(tmp_path, monkeypatch):
    """A factory: tls_hub(env, ca_pem=...) -> a started Hub whose URL is https://127.0.0.1:<port>.

    requests (the fixture's own polling and Hub.api) verifies against ``ca_pem``.
    """

    def https_url(hub: Hub) -> None:
        if hub.env.get("WORKBENCH_SSL_CERT"):
            hub.url = f"https://127.0.0.1:{hub.port}"

    with hub_pool(tmp_path, https_url) as start_hub:

        def start(env: dict[str, str], ca_pem: Path | None = None) -> Hub:
            if ca_pem:
                monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(ca_pem))
            return start_hub(env)

        yield start


@pytest.fixture
def trusting_chromium(tmp_path):
    """A factory: trusting_chromium(ca_pem, resolve={name: ip}, http2=True) -> a Playwright browser.

    Chromium trusts ``ca_pem`` through an NSS database in a HOME of its own
    (certutil from libnss3-tools), exactly as an operator's workstation would
    after importing the CA: certificates are verified, names included; no
    error is ignored.
    """
    if not Path(CHROMIUM).exists():
        missing(f"{CHROMIUM} is not installed (apt-get install chromium)")
    if shutil.which("certutil") is None:
        missing("certutil is not installed (apt-get install libnss3-tools)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("the playwright Python package is not installed")
    manager = sync_playwright()
    playwright = manager.start()
    browsers = []

    def launch(ca_pem: Path, resolve: dict[str, str], http2: bool = True):
        home = nss_home(tmp_path / f"chromium-home{len(browsers)}", ca_pem)
        rules = ", ".join(f"MAP {name} {ip}" for name, ip in resolve.items())
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[*CHROMIUM_ARGS, f"--host-resolver-rules={rules}", *([] if http2 else ["--disable-http2"])],
            env={**os.environ, "HOME": str(home)},
        )
        browsers.append(browser)
        return browser

    yield launch
    for browser in browsers:
        browser.close()
    playwright.stop()
