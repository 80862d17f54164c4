"""The GPUs the hub learned per Slurm node, through the real service and the CLI: listed, forgotten by
an admin only, an unknown node a 404 with a sentence. (A real cluster names them in tests/slurm; here the
map is written as the Slurm spawner writes it, into the hub's own GPU database.) The hub runs the Slurm backend:
its service mounts api/slurm/nodes because the backend's extension adds them, and no other hub has them."""

from __future__ import annotations

import pytest

from workbench_spawner.backends.slurm.inventory import NodeGPUMap
from workbench_spawner.backends.slurm.node_report import NodeReport
from workbench_spawner.ledger.store import AllocationStore

from .conftest import shut_down, start_workbench_hub

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def slurm_hub(tmp_path_factory):
    """A hub on the Slurm backend (loopback only; it starts whether or not a Slurm controller answers)."""
    hub = start_workbench_hub(
        tmp_path_factory.mktemp("slurm-hub") / "hub",
        {"WORKBENCH_BACKEND": "slurm", "WORKBENCH_HUB_IP": "127.0.0.1", "WORKBENCH_HUB_CONNECT_IP": "127.0.0.1"},
    )
    yield hub
    shut_down(hub)


def test_a_hub_on_another_backend_has_no_slurm_routes(workbench_hub):
    r = workbench_hub.service("GET", "api/slurm/nodes", validate=False)
    assert r.status_code == 404


def test_admins_list_and_forget_what_jobs_reported(slurm_hub):
    hub = slurm_hub
    assert hub.service("GET", "api/slurm/nodes").json() == {"nodes": []}
    store = AllocationStore(f"sqlite:///{hub.data_dir / 'workbench.sqlite'}")
    try:
        NodeGPUMap(store).accept(
            NodeReport(
                "gpu07", ({"index": 0, "uuid": "GPU-1111", "name": "NVIDIA H100", "memory_total_bytes": 85899345920},)
            )
        )
    finally:
        store.dispose()
    listing = hub.service("GET", "api/slurm/nodes").json()
    assert listing == {
        "nodes": [
            {
                "node": "gpu07",
                "gpus": [{"index": 0, "uuid": "GPU-1111", "name": "NVIDIA H100", "memory_total_bytes": 85899345920}],
            }
        ]
    }
    shown = hub.cli("slurm-nodes")
    assert shown.returncode == 0, shown
    assert shown.stdout.strip() == "gpu07:0 GPU-1111 NVIDIA H100", shown

    hub.create_users("slurmstudent")
    r = hub.service("DELETE", "api/slurm/nodes/gpu07", token=hub.user_token("slurmstudent"))
    assert r.status_code == 403
    assert "only hub admins may make the hub forget a node's GPUs" in r.json()["message"]
    r = hub.service("DELETE", "api/slurm/nodes/gpu99")
    assert r.status_code == 404
    assert 'nothing about the GPUs of a node named "gpu99"' in r.json()["message"]
    refused = hub.cli("slurm-forget-node", "gpu99")
    assert refused.returncode == 1
    assert "gpu99" in refused.stderr
    assert hub.service("GET", "api/slurm/nodes").json()["nodes"][0]["node"] == "gpu07"  # unchanged

    done = hub.cli("slurm-forget-node", "gpu07")
    assert done.returncode == 0, done
    assert "forgot the GPUs of gpu07" in done.stdout, done
    assert hub.service("GET", "api/slurm/nodes").json() == {"nodes": []}
