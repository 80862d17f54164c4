"""A GPU's MIG layout changes while the real hub runs (local backend, a simulated layout in a file): the admin
drains the GPU, the layout is cut again, the hub and the workbench service adopt it without a restart."""

from __future__ import annotations

import time

import pytest

from tests.conftest import process_env, wait_until

pytestmark = pytest.mark.integration

SEVEN = "1xH200-141GB:mig=7x1g.18gb"
TWO = "1xH200-141GB:mig=2x3g.71gb"


def slices(hub) -> list[tuple[str, str]]:
    gpus = hub.service("GET", "api/gpus").json()
    rows = gpus["gpus"] if isinstance(gpus, dict) else gpus
    return [(r["uuid"], r["profile"]) for r in rows]


def test_a_new_layout_is_used_without_a_restart(running_hub, tmp_path):
    layout = tmp_path / "layout.txt"
    layout.write_text(SEVEN)
    hub = running_hub(
        {"WORKBENCH_SIMULATED_GPUS": f"@{layout}", "WORKBENCH_INVENTORY_REFRESH_SECONDS": "1"},
    )
    hub.create_users("ann", "ben")
    assert len(slices(hub)) == 7
    assert hub.spawn("ann", gpus=1, gpu_profile="1g.18gb").status_code in (201, 202)
    hub.wait_ready("ann", 180)
    assert hub.leases()["ann"] == ["MIG-sim-00-h200-141gb-0-1g.18gb"]

    # The admin's procedure: drain the GPU, let its servers end, cut it again, undrain.
    assert hub.service("PUT", "api/drains/GPU-sim-00-h200-141gb", json={"reason": "7x1g -> 2x3g"}).status_code == 200
    assert hub.api("DELETE", "/users/ann/server").status_code in (202, 204)
    hub.wait_stopped("ann")
    layout.write_text(TWO)
    time.sleep(1.5)  # WORKBENCH_INVENTORY_REFRESH_SECONDS since the last read
    # The hub reads it again when the policy is next needed (here: ben's spawn), before admission: the old
    # profile is gone. The workbench service follows from the stored settings.
    refused = hub.spawn("ben", gpus=1, gpu_profile="1g.18gb")
    assert refused.status_code == 400 and "1g.18gb" in refused.json()["message"], refused.text
    assert "The GPU inventory changed" in hub.log()
    wait_until(
        lambda: slices(hub) == [(f"MIG-sim-00-h200-141gb-{i}-3g.71gb", "3g.71gb") for i in range(2)],
        30,
        "api/gpus to list the new layout",
        log=hub.log,
    )
    assert hub.service("DELETE", "api/drains/GPU-sim-00-h200-141gb").status_code == 204
    assert hub.spawn("ben", gpus=1, gpu_profile="3g.71gb").status_code in (201, 202)
    hub.wait_ready("ben", 180)
    env = process_env(int(hub.server("ben")["state"]["pid"]))
    assert env["WORKBENCH_GPUS"] == env["CUDA_VISIBLE_DEVICES"] == "MIG-sim-00-h200-141gb-0-3g.71gb"
    assert env["WORKBENCH_SIMULATED_GPUS"] == TWO, "the server is told the layout in force, not the hub's file"
