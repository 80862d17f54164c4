"""Fixtures for the workbench service tests: a hub with the service, shared per module."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.conftest import ARTIFACTS as ARTIFACTS  # re-exported for the service tests
from tests.conftest import Hub, free_port
from tests.service.openapi_check import check


class WorkbenchHub(Hub):
    """A Hub plus calls to the workbench service through the proxy, each answer checked
    against the service's own OpenAPI document."""

    _openapi: dict | None = None

    def openapi(self) -> dict:
        if self._openapi is None:
            r = requests.get(f"{self.url}/services/workbench/api/openapi.json", timeout=30)
            r.raise_for_status()
            self._openapi = r.json()
        return self._openapi

    def service(self, method: str, path: str, token=None, validate: bool = True, **kwargs) -> requests.Response:
        headers = dict(kwargs.pop("headers", {}))
        if token is not False:
            headers.setdefault("Authorization", f"token {token or self.token}")
        r = requests.request(
            method,
            f"{self.url}/services/workbench/{path}",
            headers=headers,
            timeout=30,
            allow_redirects=False,
            **kwargs,
        )
        proxy_error = r.status_code in (502, 503) and "json" not in r.headers.get("Content-Type", "")
        if validate and not proxy_error:  # the proxy's own 503 (service not up) is not the service's answer
            check(self.openapi(), method, path, r.status_code, r.headers.get("Content-Type", ""), r.content)
        return r

    def cli(self, *args: str, token: str | None = None) -> subprocess.CompletedProcess:
        """``workbench ARGS`` as an admin runs it, the hub and token from the environment
        (``token``: another token, "" for none)."""
        env = {**os.environ, "WORKBENCH_URL": self.url, "WORKBENCH_ADMIN_TOKEN": self.token if token is None else token}
        return subprocess.run(
            [sys.executable, "-m", "workbench_hub.cli", *args], env=env, capture_output=True, text=True, timeout=60
        )

    def wait_service(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.service("GET", "api/openapi.json", validate=False).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.3)
        raise AssertionError(f"the workbench service did not answer:\n{self.log()[-3000:]}")


def start_workbench_hub(
    data_dir: Path, env: dict[str, str] | None = None, args: list[str] | None = None
) -> WorkbenchHub:
    data_dir.mkdir(parents=True, exist_ok=True)
    hub = WorkbenchHub(
        data_dir,
        {"WORKBENCH_SIMULATED_GPUS": "4", "WORKBENCH_SERVICE_PORT": str(free_port()), **(env or {})},
        args or [],
    )
    hub.start()
    hub.wait_service()
    return hub


def shut_down(hub: WorkbenchHub) -> None:
    try:
        hub.kill_everything()
    except requests.RequestException:  # the hub is gone: stop what is left
        hub.stop()


@pytest.fixture(scope="module")
def workbench_hub(tmp_path_factory):
    """One hub (2 H100 + 2 A100, simulated) with the service, for a whole test module."""
    hub = start_workbench_hub(
        tmp_path_factory.mktemp("hub") / "hub",
        {"WORKBENCH_SIMULATED_GPUS": "2xH100-80GB,2xA100-40GB", "WORKBENCH_SESSION_CHECK_SECONDS": "1"},
    )
    yield hub
    shut_down(hub)


def browser_flow():
    """The sign-up and login steps of tests/browser/test_login_to_lab.py (one copy of them)."""
    return importlib.import_module("tests.browser.test_login_to_lab")
