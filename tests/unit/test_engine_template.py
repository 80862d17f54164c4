"""The engine placement template driven by a tiny made-up engine: what a third engine has to write.

``Toy`` is an engine whose queue is a list of scripted states: it implements only the template's hooks
(one look at its queue, what is free in it, how a report maps to UUIDs, what the hub learns, cancelling)
and its words.
The template does the rest: the hub's line, the wait's words, the deadline, the report's check, the
lease and its release grace, and cancelling on every failure.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from workbench_devices import DeviceInventory, GPUDevice
from workbench_spawner.placement.engine import (
    EngineJob,
    EngineJobEndedError,
    Look,
    ReportConflictError,
    ReportMismatchError,
)
from workbench_spawner.placement.engine_reservations import EngineReservations
from workbench_spawner.placement.engine_template import EngineTemplate, EngineWords
from workbench_spawner.placement.host import NoGPUAvailableError

DEVICES = DeviceInventory(
    "toy", [GPUDevice(uuid=f"GPU-{i}", index=i, name="Toy GPU", memory_total_bytes=1, node="t1") for i in range(2)]
)


class Toy(EngineTemplate):
    """A made-up engine: each look takes the next scripted state ("pending", "running", "gone") and a second passes."""

    words = EngineWords(
        engine="Toy",
        the_job="the toy job",
        job_noun="toy job",
        job_gone="the toy job was cancelled",
        answerer="the toy engine",
        placed="Toy placed the job on {node}",
        no_report="The toy job {job} on {node} never reported within {timeout:g} seconds.",
        held="Toy gave {uuids} of {node}, still held by another server after {grace:g} seconds.",
        conflict="The toy job's report contradicts the hub: {problem}.",
    )
    ref_prefix = "toy"
    unavailable_errors = (TimeoutError,)

    def __init__(self, store, *states: str, learned: list | None = None):
        self.now = 0.0
        super().__init__(
            store,
            lambda: DEVICES,
            EngineReservations(store, lambda: DEVICES),
            poll_interval=0.001,
            report_timeout=5.0,
            clock=lambda: self.now,
            release_grace=10.0,
        )
        self.states = list(states)
        self.cancelled: list[tuple[str, str]] = []
        self.learned = learned if learned is not None else []

    # -- the hooks: everything a third engine writes -----------------------------------------------

    def free_gpus(self, inventory: DeviceInventory) -> list[str]:
        return [device.uuid for device in inventory.devices]

    async def look(self, job: EngineJob, what: str, kind: str | None, memo: dict[str, Any]) -> Look:
        self.now += 1
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        if state == "silent":
            raise TimeoutError("no reply")
        if state == "gone":
            return Look(ended=f"The toy job {job.job_id} vanished.")
        if state == "running":
            return Look(node="t1", record={"gpus": [1]})
        return Look(text=f"Waiting for {what}: the toy queue is busy", report=(0,), detail="busy")

    async def cancel(self, job_id: str, why: str) -> None:
        self.cancelled.append((job_id, why))

    def uuids(self, job: EngineJob, look: Look, report: Any, count: int) -> list[str]:
        if report["node"] != look.node or len(report["gpus"]) != count:
            raise ReportMismatchError(f"The toy job {job.job_id} reported {report}, the toy engine says otherwise.")
        return list(report["gpus"])

    def learn_from(self, job: EngineJob, look: Look, report: Any) -> None:
        if "GPU-x" in report["gpus"]:
            raise ReportConflictError("GPU-x is known elsewhere")
        self.learned.append(report["gpus"])


def place(toy: Toy, report=None, count=1, timeout=5.0):
    said: list[str] = []
    job = EngineJob(job_id="t-7", started=lambda: report, describe=said.append)
    return asyncio.run(toy.place("alice", "", count, None, timeout, job=job)), said


def test_pending_then_running_then_reported_gives_a_lease(store):
    toy = Toy(store, "pending", "pending", "running")
    lease, said = place(toy, {"node": "t1", "gpus": ["GPU-1"]})
    assert (lease.user, lease.gpu_uuids, lease.ref, lease.node) == ("alice", ("GPU-1",), "toy:t-7", "t1")
    # The engine's own words once (not at every look), then the template's sentence once placed.
    assert said == ["Waiting for 1 GPU: the toy queue is busy", "Toy placed the job on t1"]
    assert toy.learned == [["GPU-1"]]
    assert toy.cancelled == []
    assert toy.waiting() == 0


def test_an_engine_that_does_not_answer_is_waited_for_in_its_words(store):
    toy = Toy(store, "silent", "pending", "running")
    lease, said = place(toy, {"node": "t1", "gpus": ["GPU-1"]})
    assert lease.gpu_uuids == ("GPU-1",)
    assert said[0] == "Waiting for the toy engine to answer (no reply)"


def test_a_job_that_ends_before_it_starts_ends_the_spawn_without_cancelling(store):
    toy = Toy(store, "pending", "gone")
    with pytest.raises(EngineJobEndedError, match="vanished"):
        place(toy)
    assert toy.cancelled == []
    assert store.leases() == []
    assert toy.waiting() == 0


def test_the_deadline_cancels_the_job_in_the_engines_vocabulary(store):
    toy = Toy(store, "pending")
    with pytest.raises(NoGPUAvailableError) as refused:
        place(toy, timeout=3.0)
    assert str(refused.value) == (
        "Toy did not start the toy job for 1 GPU within 3 seconds (busy); the toy job was cancelled. Try again "
        "later, ask for fewer GPUs, or start a CPU-only server (0 GPUs)."
    )
    assert toy.cancelled == [("t-7", "queue timeout")]
    assert toy.now >= 3


def test_a_report_that_contradicts_the_engine_cancels_and_teaches_nothing(store):
    toy = Toy(store, "running")
    with pytest.raises(ReportMismatchError, match="the toy engine says otherwise"):
        place(toy, {"node": "t2", "gpus": ["GPU-1"]})
    assert [why for _, why in toy.cancelled] == ["its GPU report does not match the engine's record"]
    assert toy.learned == []
    assert store.leases() == []


def test_a_report_that_contradicts_the_hub_cancels_with_the_engines_words(store):
    toy = Toy(store, "running")
    with pytest.raises(NoGPUAvailableError, match="contradicts the hub: GPU-x is known elsewhere"):
        place(toy, {"node": "t1", "gpus": ["GPU-x"]})
    assert len(toy.cancelled) == 1
    assert store.leases() == []


def test_a_server_that_never_reports_is_cancelled(store):
    toy = Toy(store, "running")
    toy.report_poll = 0.0

    async def tick() -> None:  # the clock moves while the template waits for the report
        while True:
            toy.now += 1
            await asyncio.sleep(0)

    async def run():
        ticking = asyncio.ensure_future(tick())
        try:
            job = EngineJob(job_id="t-7", started=lambda: None)
            return await toy.place("alice", "", 1, None, 5.0, job=job)
        finally:
            ticking.cancel()

    with pytest.raises(NoGPUAvailableError, match=r"^The toy job t-7 on t1 never reported within 5 seconds\.$"):
        asyncio.run(run())
    assert toy.cancelled == [("t-7", "no start report")]


def test_gpus_the_ledger_still_holds_wait_the_release_grace_then_cancel(store):
    assert store.adopt("bob", "", ["GPU-1"], "toy:t-6", node="t1")
    toy = Toy(store, "running")
    with pytest.raises(NoGPUAvailableError) as held:
        place(toy, {"node": "t1", "gpus": ["GPU-1"]})
    assert str(held.value) == "Toy gave GPU-1 of t1, still held by another server after 10 seconds."
    assert toy.now >= 10, "it waited the release grace"
    assert toy.cancelled == [("t-7", "its GPUs are leased to another server")]
    assert [lease.user for lease in store.leases()] == ["bob"]


def test_a_cpu_only_job_gets_no_lease(store):
    toy = Toy(store, "running")
    lease, _ = place(toy, {"node": "t1", "gpus": []}, count=0)
    assert lease is None
    assert store.leases() == []
    assert toy.learned == []


def test_no_job_means_nothing_to_place(store):
    with pytest.raises(NoGPUAvailableError, match="nothing to place"):
        asyncio.run(Toy(store, "running").place("alice", "", 1, None, 5.0, job=None))


def test_the_engine_policy_names_gpus_through_its_backends_book(store):
    """``EnginePolicy``: the inventory of the backend the settings name, resolved by that backend's book."""
    from workbench_spawner.backends.slurm.inventory import NodeGPUMap, cluster_inventory
    from workbench_spawner.backends.slurm.node_report import NodeReport
    from workbench_spawner.backends.slurm.records import SlurmNode
    from workbench_spawner.placement.engine_policy import EnginePolicy
    from workbench_spawner.policy.settings import PolicySettings

    listed = cluster_inventory([SlurmNode("n1", "10.0.0.1", "IDLE", "h100", 2)], "")
    assert [d.uuid for d in listed.devices] == ["SLURM-n1-gpu0", "SLURM-n1-gpu1"]
    gpu = {"index": 1, "uuid": "GPU-b", "name": "H100", "memory_total_bytes": 80}
    NodeGPUMap(store).accept(NodeReport("n1", (gpu,), ("GPU-b",)))
    settings = PolicySettings(store.url, listed, backend="slurm")
    assert [d.uuid for d in EnginePolicy(settings, store).inventory.devices] == ["SLURM-n1-gpu0", "GPU-b"]
    unknown = PolicySettings(store.url, listed, backend="")
    assert EnginePolicy(unknown, store).inventory is listed
