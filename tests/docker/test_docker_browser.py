"""The foundations' browser test once more, against the docker backend."""

from __future__ import annotations

import uuid

import pytest

from tests.browser.test_login_to_lab import _artifact, log_in, sign_up
from tests.docker.conftest import inspect, remove_user_objects, user_container
from tests.lab_browser import wait_for_lab

pytestmark = [pytest.mark.docker, pytest.mark.browser, pytest.mark.integration]


def test_admin_reaches_jupyterlab_in_a_pinned_container(running_hub, chromium_browser, singleuser_image, docker_volume):
    admin = f"admin{uuid.uuid4().hex[:6]}"
    hub = running_hub(
        {
            "WORKBENCH_BACKEND": "docker",
            "WORKBENCH_IMAGE": singleuser_image,
            "WORKBENCH_SIMULATED_GPUS": "2",
            "WORKBENCH_ADMIN_USERS": admin,
            "WORKBENCH_DATASETS_VOLUME": docker_volume("wb-datasets"),
            "WORKBENCH_PROFILES": "small:1:2G,large*:2:3G",
        }
    )
    page = chromium_browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(60_000)
    try:
        assert "The signup was successful!" in sign_up(page, hub.url, admin)
        log_in(page, hub.url, admin)
        page.wait_for_url("**/hub/spawn**")
        page.fill("#workbench-gpus", "1")
        assert page.is_checked("#workbench-profile-large"), "the default profile is preselected"
        assert page.locator("#workbench-profile-note").count() == 0, "containers do enforce the size"
        page.check("#workbench-profile-small")
        page.click("form#spawn_form [type=submit]")
        wait_for_lab(page, hub.url, admin, log=hub.log)
        page.wait_for_selector(".jp-DirListing-item:has-text('notebooks')")
        page.screenshot(path=str(_artifact("jupyterlab-docker.png")))
        info = inspect(user_container(admin))
        assert info["HostConfig"]["DeviceRequests"][0]["DeviceIDs"] == hub.leases()[admin]
        assert info["HostConfig"]["Memory"] == 2 << 30, "the profile picked on the form sizes the container"
    finally:
        remove_user_objects(admin)
