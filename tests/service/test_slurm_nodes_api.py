"""The GPUs the hub learned per Slurm node, through the real service and the CLI: listed, forgotten by
an admin only, an unknown node a 404 with a sentence. (A real cluster names them in tests/slurm; here the
map is written as the Slurm spawner writes it, into the hub's own GPU database.)"""

from __future__ import annotations

import pytest

from workbench_spawner.backends.slurm.inventory import NodeGPUMap
from workbench_spawner.backends.slurm.jobs import NodeReport
from workbench_spawner.ledger.store import AllocationStore

pytestmark = pytest.mark.integration


def test_admins_list_and_forget_what_jobs_reported(workbench_hub):
    hub = workbench_hub
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
    assert shown.returncode == 0 and shown.stdout.strip() == "gpu07:0 GPU-1111 NVIDIA H100", shown

    hub.create_users("slurmstudent")
    r = hub.service("DELETE", "api/slurm/nodes/gpu07", token=hub.user_token("slurmstudent"))
    assert r.status_code == 403 and "only hub admins may make the hub forget a node's GPUs" in r.json()["message"]
    r = hub.service("DELETE", "api/slurm/nodes/gpu99")
    assert r.status_code == 404 and 'nothing about the GPUs of a node named "gpu99"' in r.json()["message"]
    refused = hub.cli("slurm-forget-node", "gpu99")
    assert refused.returncode == 1 and "gpu99" in refused.stderr
    assert hub.service("GET", "api/slurm/nodes").json()["nodes"][0]["node"] == "gpu07"  # unchanged

    done = hub.cli("slurm-forget-node", "gpu07")
    assert done.returncode == 0 and "forgot the GPUs of gpu07" in done.stdout, done
    assert hub.service("GET", "api/slurm/nodes").json() == {"nodes": []}
