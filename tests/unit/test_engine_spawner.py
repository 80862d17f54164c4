"""The spawner side both engines share (``placement/engine_spawner.py``): the lease's ref read back, the progress
line and the inventory read once per process."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import TypeVar

import pytest

from tests.unit.fake_backends import FakeEngineSpawner
from workbench_devices import DeviceInventory
from workbench_spawner.backends.kubernetes.spawner import KubernetesGPUSpawner
from workbench_spawner.backends.slurm.spawner import SlurmGPUSpawner
from workbench_spawner.form.progress import SpawnEvents
from workbench_spawner.ledger.store import Lease
from workbench_spawner.placement import engine_spawner
from workbench_spawner.placement.engine import EngineJob
from workbench_spawner.placement.engine_spawner import EngineSpawner, inventory_once
from workbench_spawner.policy.gpu_policy import _policies

Made = TypeVar("Made", bound=EngineSpawner)


def lease(ref: str, node: str = "wbnode1") -> Lease:
    return Lease("ann", "", ("GPU-1",), datetime(2026, 12, 6, tzinfo=UTC), ref, node)


def bare(cls: type[EngineSpawner]) -> EngineSpawner:
    """A spawner with its class's rules and nothing else (no user, no server)."""
    return cls.__new__(cls)


@pytest.mark.parametrize(
    ("cls", "ref", "job"),
    [
        (SlurmGPUSpawner, "slurm:8201", "8201"),
        (SlurmGPUSpawner, "k8s:ns/wb-1-ann", ""),  # another engine's lease
        (SlurmGPUSpawner, "pid:42", ""),
        (SlurmGPUSpawner, "slurm", ""),
        (KubernetesGPUSpawner, "k8s:ns/wb-1-ann", "ns/wb-1-ann"),
        (KubernetesGPUSpawner, "slurm:8201", ""),
        (KubernetesGPUSpawner, "", ""),
    ],
)
def test_a_lease_is_read_back_only_by_the_engine_that_wrote_it(cls, ref, job):
    assert bare(cls).lease_job(lease(ref)) == job


@pytest.mark.parametrize(("cls", "placed"), [(SlurmGPUSpawner, "slurm"), (KubernetesGPUSpawner, "kubernetes")])
def test_both_engines_are_engine_placed_and_keep_a_start_report(cls, placed):
    assert cls.placement_mode == "engine"
    assert cls.workbench_backend == placed
    assert "workbench_report" in cls.class_trait_names()
    assert bare(cls).workbench_report is None  # until the server's start-up reports


class Submitting(FakeEngineSpawner):
    """The reference engine backend, noting the start report it holds when it is asked to submit."""

    held_at_submission: list[dict | None]

    async def engine_submit(self) -> EngineJob:
        self.held_at_submission.append(self.workbench_report)
        return await super().engine_submit()


def made(cls: type[Made], **traits) -> Made:
    """A spawner of ``cls`` for ann's default server, as the hub makes one."""
    return cls(
        user=SimpleNamespace(name="ann", url="/user/ann/", escaped_name="ann", groups=[]),
        hub=SimpleNamespace(public_host="", api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/"),
        orm_spawner=SimpleNamespace(name="", server=None),
        **traits,
    )


async def test_a_report_of_an_earlier_job_is_forgotten_before_the_engine_submits(tmp_path):
    _policies.clear()
    spawner = made(Submitting, gpu_db_url=f"sqlite:///{tmp_path / 'wb.sqlite'}", simulated_gpus="2")
    spawner.held_at_submission = []
    spawner.workbench_report = {"node": "wbnode1", "gpus": []}  # the last job's, read back after a restart
    try:
        await spawner._apply_gpu_options({"gpus": 1})
        await spawner.start()
        assert spawner.held_at_submission == [None]
        await spawner.stop()
    finally:
        _policies.clear()


def test_a_stopped_slurm_server_saves_no_state_so_a_restarted_hub_does_not_think_it_ran():
    spawner = made(SlurmGPUSpawner)
    spawner.job_id, spawner._job_node = "8201", "wbnode1"
    assert spawner.get_state() == {"job_id": "8201", "slurm_node": "wbnode1"}
    spawner.clear_state()  # the hub's stop: clear_state, then the state it saves
    assert spawner.get_state() == {}
    restarted = made(SlurmGPUSpawner)
    restarted.load_state(spawner.get_state())
    assert restarted._gpu_running is False


class Report:
    node = "wbnode2"


@pytest.mark.parametrize(
    ("with_lease", "report", "node", "line"),
    [
        (True, None, "wbnode1", "Running on wbnode1 with GPU-1"),
        (False, Report(), "wbnode2", "Running on wbnode2 with no GPU"),
        (False, None, "", "Running on its node with no GPU"),
    ],
)
def test_the_progress_page_says_where_the_server_runs(with_lease, report, node, line):
    spawner = bare(SlurmGPUSpawner)
    spawner._gpu_events = SpawnEvents()
    spawner.gpu_uuids = ["GPU-1"] if with_lease else []
    assert spawner.announce_running(lease("slurm:1") if with_lease else None, report) == node
    assert [e["message"] for e in spawner._gpu_events._events] == [line]


def test_the_inventory_is_read_once_and_an_engine_away_is_asked_again(monkeypatch):
    monkeypatch.setattr(engine_spawner, "_inventories", {})
    reads: list[str] = []

    def away() -> DeviceInventory:
        reads.append("away")
        raise OSError("connection refused")

    def found() -> DeviceInventory:
        reads.append("found")
        return DeviceInventory("toy", [], "0 GPU(s)")

    assert inventory_once(("toy",), away, OSError, "Toy") == DeviceInventory(
        "none", [], "Toy did not answer: connection refused"
    )
    assert inventory_once(("toy",), found, OSError, "Toy").source == "toy"
    assert inventory_once(("toy",), away, OSError, "Toy").source == "toy"
    assert reads == ["away", "found"]
