"""Idle reclaim of MIG slices through the real hub: the workbench service reads a dcgm-exporter (an HTTP server
on 127.0.0.1 serving exporter text) for three students on slices of one simulated H200. The slice at 0 % is
warned about and its server stopped; the one at 80 % is kept; the one the exporter has no series for is never
touched, and api/gpus and the fleet page say why it has no idle rule."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from tests.conftest import wait_until
from tests.service.conftest import shut_down, start_workbench_hub
from tests.service.test_idle_reclaim_hub import ledger

pytestmark = pytest.mark.integration

PARENT = "GPU-sim-00-h200-141gb"
IDLE_MINUTES = 0.25  # 15 s


class Exporter(BaseHTTPRequestHandler):
    """dcgm-exporter's /metrics: DCGM_FI_PROF_GR_ENGINE_ACTIVE per GPU instance, labelled as it labels them."""

    ratios: ClassVar[dict[int, float]] = {}  # set by the test, read by every request's handler

    def do_GET(self):
        lines = ["# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge"]
        for gi, ratio in sorted(type(self).ratios.items()):
            lines.append(
                f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu="0",UUID="{PARENT}",device="nvidia0",modelName="NVIDIA H200",'
                f'GPU_I_PROFILE="1g.18gb",GPU_I_ID="{gi}",Hostname="gpu-node-1"}} {ratio:.6f}'
            )
        body = ("\n".join(lines) + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def exporter():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Exporter)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def hub(tmp_path_factory, exporter):
    base = tmp_path_factory.mktemp("dcgm")
    local = base / "local_config.py"
    local.write_text("c.Spawner.http_timeout = 180\n")  # a busy 2-core CI host starts servers slowly
    Exporter.ratios = {gi: 0.8 for gi in range(1, 8)}  # busy while the servers start
    hub = start_workbench_hub(
        base / "hub",
        {
            "WORKBENCH_LOCAL_CONFIG": str(local),
            "WORKBENCH_SIMULATED_GPUS": "1xH200-141GB:mig=7x1g.18gb",
            "WORKBENCH_DCGM_EXPORTER_URL": f"127.0.0.1:{exporter.server_address[1]}",
            "WORKBENCH_GPU_IDLE_MINUTES": str(IDLE_MINUTES),
            "WORKBENCH_GPU_IDLE_CHECK_SECONDS": "1",
            "WORKBENCH_QUEUE_TIMEOUT": "120",
        },
    )
    hub.create_users("alice", "bob", "carol")
    yield hub
    shut_down(hub)


def instance_id(uuid: str) -> int:
    """A simulated slice's GPU instance id: its place in the layout, from 1 (MIG-sim-00-h200-141gb-2-… is 3)."""
    return int(uuid.split("-")[-2]) + 1


def test_the_idle_slice_is_reclaimed_the_busy_one_kept_the_unseen_one_never_touched(hub):
    for user in ("alice", "bob", "carol"):
        assert hub.spawn(user, gpus=1, gpu_profile="1g.18gb").status_code in (201, 202)
    for user in ("alice", "bob", "carol"):
        hub.wait_ready(user, 180)
    held = {user: uuids[0] for user, uuids in hub.leases().items()}
    Exporter.ratios = {instance_id(held["alice"]): 0.0, instance_id(held["bob"]): 0.8}  # carol's: no series

    def reasons():
        rows = {r["uuid"]: r for r in hub.service("GET", "api/gpus").json()["gpus"]}
        carol = rows[held["carol"]]
        return rows if carol["no_reading_reason"] == "no series for this slice" else None

    rows = wait_until(reasons, 30, "api/gpus never said why carol's slice has no reading", log=hub.log)
    assert (rows[held["bob"]]["utilization_percent"], rows[held["bob"]]["reading_source"]) == (80.0, "dcgm")
    assert rows[held["carol"]]["utilization_percent"] is None
    page = hub.service("GET", "", validate=False).text
    assert "no reading (MIG slice: no series for this slice): no idle rule" in page
    assert ">DCGM</small>" in page

    hub.wait_stopped("alice", timeout=60)
    assert ("alice", "reclaimed: GPU idle 15 s") in ledger(hub)
    assert f"Stopping alice/default: its GPUs {held['alice']} stayed under 5 %" in hub.log()
    time.sleep(IDLE_MINUTES * 60 + 5)
    assert hub.server("bob")["ready"], "a slice at 80 % is busy"
    assert hub.server("carol")["ready"], "a slice without a series has no reading: never idle"
    said = hub.log().count(f"No DCGM reading for MIG slice {held['carol']} of carol/default: no series for this slice")
    assert said == 1, "logged once, not every pass"
    for user in ("bob", "carol"):
        assert hub.api("DELETE", f"/users/{user}/server").status_code in (202, 204)
        hub.wait_stopped(user)
