"""Slurm nodes that take no job and jobs that ended badly, as tables (the real cluster: tests/slurm/
test_slurm_node_failure.py, which can make only one of these cases in its minute).

* Node states: which of Slurm's states and flags take no new job, in what words; the cache that keeps
  sinfo off the spawn form's every render; the policy's status, free count, admission and spawn form,
  the wait sentence and the fleet rows, which count such a node's GPUs as neither free nor in use.
* Job states: the ledger's reason for each way a job can end, the poll that remembers it, the
  reconciler's answer from Slurm's job list, and a cancel by the hub itself, which is a stop.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from batchspawner import JobStatus

from workbench_devices import DeviceInventory, parse_simulated_spec
from workbench_spawner.backends.slurm import fleet as slurm_fleet
from workbench_spawner.backends.slurm import jobs as slurm_jobs
from workbench_spawner.backends.slurm import spawner as slurm_spawner
from workbench_spawner.backends.slurm.ending import job_ending
from workbench_spawner.backends.slurm.job_spawner import SlurmJobSpawner, final_state
from workbench_spawner.backends.slurm.job_states import pending_message
from workbench_spawner.backends.slurm.jobs import SlurmUnavailableError, cancelled_by_hub
from workbench_spawner.backends.slurm.node_report import NodeReport
from workbench_spawner.backends.slurm.node_states import NodeStates
from workbench_spawner.backends.slurm.placement import SlurmPlacement
from workbench_spawner.backends.slurm.records import SlurmJob, SlurmNode, node_unusable, parse_sinfo_json
from workbench_spawner.backends.slurm.spawner import SlurmGPUSpawner
from workbench_spawner.form.render import free_text, render_options_form
from workbench_spawner.ledger import reasons
from workbench_spawner.ledger.store import AllocationStore, Lease
from workbench_spawner.placement.engine import EngineJob
from workbench_spawner.policy.gpu_policy import GPUPolicy, GPUStatus
from workbench_spawner.policy.settings import PolicySettings
from workbench_spawner.rules.quota import Quota

DOWN = "down, not responding"
# Two nodes as cluster_inventory lays them out: n1 two H100s, n2 two H100s and an H200's three MIG slices.
N1 = [replace(d, node="n1") for d in parse_simulated_spec("2xH100-80GB", "n1")]
N2 = [replace(d, node="n2") for d in parse_simulated_spec("2xH100-80GB,1xH200-141GB:mig=2x1g.18gb+1x3g.71gb", "n2")]
INVENTORY = DeviceInventory("simulated", N1 + N2, "test")


def node(name: str, state: str = "IDLE", reason: str = "") -> SlurmNode:
    return SlurmNode(name, name, state, "h100-80gb", 2, reason=reason)


# -- node states ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "reason", "words"),
    [
        # Nodes that take jobs: their GPUs count as before.
        ("IDLE", "", None),
        ("MIXED", "", None),
        ("ALLOCATED", "", None),
        ("MIXED+COMPLETING", "", None),
        ("IDLE+RESERVED", "", None),  # an ordinary reservation: its members' jobs still start
        ("IDLE+PLANNED", "", None),  # backfill keeps it for a planned job: still a working node
        ("MIXED+REBOOT_REQUESTED", "", None),  # jobs run until the reboot is issued
        ("IDLE+POWERING_UP", "", None),  # jobs wait for the boot
        ("", "", None),
        # Nodes that take none: why, in words, with Slurm's reason once.
        ("DOWN+NOT_RESPONDING", "Not responding", DOWN),
        ("down+not_responding", "Not responding", DOWN),  # sinfo --json 22.05 writes the base state in lower case
        ("DOWN", "bad DIMM", "down (bad DIMM)"),
        ("DOWN*", "", "down"),  # sinfo's short form
        ("IDLE+DRAIN", "MIG layout change", "drained (MIG layout change)"),
        ("MIXED+DRAIN", "", "draining"),
        ("ALLOCATED+DRAIN", "", "draining"),
        ("DRAINED", "", "drained"),
        ("DRAINING", "", "draining"),
        ("DOWN+DRAIN", "", "down, drained"),
        ("IDLE+FAIL", "", "failed"),
        ("MIXED+FAIL", "ECC errors", "failing (ECC errors)"),
        ("IDLE+NOT_RESPONDING", "", "not responding"),
        ("MIXED+NO_RESPOND", "", "not responding"),
        ("FUTURE", "", "not in service yet (FUTURE)"),
        ("UNKNOWN", "", "not registered with Slurm yet"),
        ("ERROR", "", "in an error state"),
        ("IDLE+POWERED_DOWN", "", "powered down"),
        ("IDLE+POWERING_DOWN", "", "powering down"),
        ("IDLE+MAINTENANCE+RESERVED", "", "in a maintenance reservation"),
        ("IDLE+MAINT", "", "in a maintenance reservation"),
        ("MIXED+REBOOT_ISSUED", "", "rebooting"),
        (
            "DOWN+INVALID_REG",
            "gres/gpu count too low",
            "down, registered with a configuration Slurm refused (gres/gpu count too low)",
        ),
    ],
)
def test_which_node_states_take_no_job(state, reason, words):
    assert node_unusable(state, reason) == words
    assert node("n1", state.upper(), reason).usable is (words is None)


def test_sinfo_json_gives_the_state_flags_and_the_reason():
    (dead,) = parse_sinfo_json(
        json.dumps(
            {
                "nodes": [
                    {
                        "name": "wbnode1",
                        "state": "down",
                        "state_flags": ["NOT_RESPONDING"],
                        "reason": "Not responding",
                        "gres": "gpu:h100-80gb:2",
                        "gres_used": "gpu:h100-80gb:0(IDX:N/A)",
                    }
                ]
            }
        )
    )
    assert dead.state == "DOWN+NOT_RESPONDING"
    assert dead.reason == "Not responding"
    assert dead.unusable_because() == DOWN


class Sinfo:
    """sinfo as a table we script; counts its calls, raises SlurmUnavailableError while ``down``."""

    def __init__(self, *nodes: SlurmNode):
        self.nodes = list(nodes)
        self.calls = 0
        self.down = False

    def __call__(self) -> list[SlurmNode]:
        self.calls += 1
        if self.down:
            raise SlurmUnavailableError("sinfo: Unable to contact slurm controller")
        return self.nodes


def test_node_states_run_sinfo_once_per_max_age_and_keep_the_last_answer_when_slurm_is_away(caplog):
    now = [0.0]
    sinfo = Sinfo(node("n1", "DOWN+NOT_RESPONDING", "Not responding"), node("n2"))
    states = NodeStates(sinfo, max_age=5.0, clock=lambda: now[0])
    for _ in range(20):  # twenty renders of the form within five seconds: one sinfo
        assert states.unusable() == {"n1": DOWN}
    assert sinfo.calls == 1
    now[0] = 5.0
    sinfo.nodes = [node("n1"), node("n2", "IDLE+DRAIN", "swap GPU")]
    assert states.unusable() == {"n2": "drained (swap GPU)"}
    assert sinfo.calls == 2
    # The controller does not answer: what it said last stands, and it is asked again only after retry_after.
    now[0] = 10.0
    sinfo.down = True
    with caplog.at_level(logging.WARNING, "workbench.slurm"):
        assert states.unusable() == {"n2": "drained (swap GPU)"}
        now[0] = 39.0
        assert states.unusable() == {"n2": "drained (swap GPU)"}
    assert sinfo.calls == 3
    assert "could not be read" in caplog.text
    now[0] = 40.0
    sinfo.down = False
    assert states.unusable() == {"n2": "drained (swap GPU)"}
    assert sinfo.calls == 4


def test_before_slurm_ever_answered_every_node_counts_as_usable():
    sinfo = Sinfo()
    sinfo.down = True
    assert NodeStates(sinfo).unusable() == {}


# -- what the user sees: status, free count, admission, the form --------------------------------------------


@pytest.fixture
def slurm_store(tmp_path):
    store = AllocationStore(f"sqlite:///{tmp_path / 'wb.sqlite'}")
    yield store
    store.dispose()


def policy_with(store: AllocationStore, *nodes: SlurmNode) -> GPUPolicy:
    settings = PolicySettings(
        store.url, INVENTORY, default_quota=Quota(2), node="", backend="slurm", placement="engine"
    )
    placement = SlurmPlacement(store, lambda: INVENTORY, nodes=lambda: list(nodes), devices=lambda: INVENTORY.devices)
    return GPUPolicy(settings, store, placement)


def test_a_down_nodes_gpus_are_neither_free_nor_in_use_for_the_form_and_admission(slurm_store):
    policy = policy_with(slurm_store, node("n1", "DOWN+NOT_RESPONDING", "Not responding"), node("n2"))
    assert slurm_store.adopt("bob", "", [N2[0].uuid], "slurm:7", node="n2")
    status = policy.status()
    gone = {s.device.uuid: s.unavailable for s in status if s.unavailable}
    assert gone == {d.uuid: f"node n1 is {DOWN}" for d in N1}
    assert all(s.free_slots == 0 for s in status if s.device.node == "n1")
    # Free: n2's other H100 and its three slices; the held one is in use, n1's are neither.
    assert policy.free_count() == 1
    assert policy.free_count("1g.18gb") == 2
    ctx = policy.admission_context("ann", "", [])
    assert ctx.free_by_model == {"H100-80GB": 1, "H200-141GB 1g.18gb": 2, "H200-141GB 3g.71gb": 1}
    assert free_text(status) == f"1 of 2 GPUs and 3 of 3 MIG slices free now; 2 more unavailable (node n1 is {DOWN})"
    page = render_options_form(
        user="bob",
        ctx=ctx,
        status=status,
        source="simulated",
        message="test",
        shared=False,
        profiles=(),
        limits_enforced=False,
        held={"": 1},
    )
    assert page.count(f"unavailable: node n1 is {DOWN}") == 2
    assert "yours" in page  # bob's GPU on n2 reads as before


def test_with_every_node_up_the_status_is_as_before(slurm_store):
    policy = policy_with(slurm_store, node("n1"), node("n2", "MIXED"))
    assert not any(s.unavailable for s in policy.status())
    assert policy.free_count() == 4
    assert free_text(policy.status()) == "4 of 4 GPUs and 3 of 3 MIG slices free now"


@pytest.mark.parametrize(
    ("down", "text"),
    [
        ({"n2": "node n2 is down"}, "2 of 2 GPUs free now; 5 more unavailable (node n2 is down)"),
        (
            {"n1": "node n1 is down", "n2": "node n2 is drained"},
            "No GPU free now: all 7 unavailable (node n1 is down; node n2 is drained)",
        ),
        ({}, "4 of 4 GPUs and 3 of 3 MIG slices free now"),
    ],
)
def test_the_free_line_counts_only_devices_a_server_could_get(down, text):
    status = [GPUStatus(d, [], 1, unavailable=down.get(d.node, "")) for d in INVENTORY.devices]
    assert free_text(status) == text


# -- the wait sentence ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("unavailable", "text"),
    [
        ({}, "Waiting for 1 GPU: all 4 GPUs that fit are in use (Slurm: Resources), next in line"),
        (
            {"n1": (2, DOWN)},
            "Waiting for 1 GPU: all 4 GPUs that fit are in use (Slurm: Resources), next in line; "
            f"2 more GPUs are on n1, which takes no jobs now: {DOWN}",
        ),
        (
            {"n1": (1, "drained"), "n3": (0, "down")},
            "Waiting for 1 GPU: all 4 GPUs that fit are in use (Slurm: Resources), next in line; "
            "1 more GPU is on n1, which takes no jobs now: drained",
        ),
        (
            {"n3": (2, "down"), "n1": (1, "drained (bad fan)")},
            "Waiting for 1 GPU: all 4 GPUs that fit are in use (Slurm: Resources), next in line; "
            "3 more GPUs are on nodes that take no jobs now: n1 drained (bad fan); n3 down",
        ),
    ],
)
def test_the_wait_sentence_names_gpus_on_nodes_that_take_no_job(unavailable, text):
    assert pending_message(SlurmJob("1", "PENDING", "Resources"), 0, 4, "1 GPU", "GPUs", unavailable) == text


def test_a_job_waiting_while_a_node_is_down_is_told_only_the_gpus_that_could_run_it(slurm_store):
    states = [[SlurmJob("9", "PENDING", "Resources", gpus_requested=1, partition="gpu")]] * 3 + [
        [SlurmJob("9", "RUNNING", "None", "n2", gpu_indices=(1,), gpus_requested=1, partition="gpu")]
    ]
    now = [0.0]

    def jobs() -> list[SlurmJob]:
        now[0] += 1
        return states.pop(0) if len(states) > 1 else states[0]

    placement = SlurmPlacement(
        slurm_store,
        lambda: INVENTORY,
        poll_interval=0.001,
        clock=lambda: now[0],
        jobs=jobs,
        nodes=lambda: [node("n1", "DOWN+NOT_RESPONDING", "Not responding"), node("n2", "MIXED")],
        devices=lambda: INVENTORY.devices,
    )
    assert placement.unusable(INVENTORY.devices) == {d.uuid: f"node n1 is {DOWN}" for d in N1}
    gpus = tuple({"index": d.index, "uuid": d.uuid} for d in N2)
    events: list[str] = []
    job = EngineJob("9", started=lambda: NodeReport("n2", gpus, (N2[1].uuid,)), describe=events.append)
    lease = asyncio.run(placement.place("ann", "", 1, None, 30.0, job=job))
    assert lease.gpu_uuids == (N2[1].uuid,)
    assert (
        "Waiting for 1 GPU: all 2 GPUs that fit are in use (Slurm: Resources), next in line; "
        f"2 more GPUs are on n1, which takes no jobs now: {DOWN}"
    ) in events


# -- the fleet rows ---------------------------------------------------------------------------------------------


def test_the_fleet_rows_of_a_down_node_have_no_free_slot_and_say_its_state(monkeypatch):
    nodes = {"n1": node("n1", "DOWN+NOT_RESPONDING", "Not responding"), "n2": node("n2", "MIXED")}
    monkeypatch.setattr(slurm_fleet, "slurm_nodes", lambda: nodes)
    rows = [
        {"node": d.node, "index": d.index, "holders": [], "free_slots": 1, "unavailable": None} for d in N1 + N2[:1]
    ]
    slurm_fleet.annotate_slurm(rows)
    assert [(r["unavailable"], r["free_slots"]) for r in rows] == [(f"node n1 is {DOWN}", 0)] * 2 + [(None, 1)]
    assert rows[0]["slurm"]["node_state"] == "down+not_responding"
    assert rows[0]["slurm"]["node_reason"] == "Not responding"
    assert rows[2]["slurm"]["node_reason"] == ""


# -- job states: the ledger's reasons ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "by_hub", "reason"),
    [
        ("NODE_FAIL", False, reasons.NODE_FAILED),
        ("NODE_FAIL wbnode1", False, reasons.NODE_FAILED),
        ("BOOT_FAIL", False, reasons.NODE_FAILED),
        ("OUT_OF_MEMORY", False, reasons.OUT_OF_MEMORY),
        ("PREEMPTED", False, reasons.EVICTED),
        ("CANCELLED", False, reasons.JOB_CANCELLED),
        ("cancelled", False, reasons.JOB_CANCELLED),
        ("CANCELLED by 0", False, reasons.JOB_CANCELLED),
        ("CANCELLED", True, reasons.STOPPED),  # the hub's own stop is never "cancelled outside the hub"
        ("NODE_FAIL", True, reasons.NODE_FAILED),  # the node died before the hub's cancel reached it
        ("TIMEOUT", False, reasons.JOB_TIMED_OUT),  # the session's time limit
        ("DEADLINE", False, reasons.JOB_TIMED_OUT),
        ("COMPLETED", False, reasons.SERVER_EXITED),
        ("FAILED", False, reasons.SERVER_EXITED),
        ("REQUEUED", False, reasons.SERVER_EXITED),
        ("RUNNING", False, None),  # not an end
        ("", False, None),
    ],
)
def test_each_way_a_job_ends_has_its_ledger_reason(state, by_hub, reason):
    ending = job_ending("42", state, by_hub)
    assert (ending.reason if ending else None) == reason


@pytest.mark.parametrize(
    ("job_status", "state"),
    [
        ("NODE_FAIL wbnode1", "NODE_FAIL"),
        ("CANCELLED wbnode2", "CANCELLED"),
        ("OUT_OF_MEMORY wbnode1\n", "OUT_OF_MEMORY"),
        ("slurm_load_jobs error: Invalid job id specified", ""),  # gone from Slurm's memory (MinJobAge)
        ("", ""),
    ],
)
def test_the_state_word_of_squeues_line(job_status, state):
    assert final_state(job_status) == state


def polled(job_id: str, job_status: str, status: JobStatus) -> SimpleNamespace:
    """What ``SlurmJobSpawner.poll`` works on, with squeue answering ``job_status``."""
    spawner = SimpleNamespace(job_id=job_id, job_status="", _gpu_starting=False, slurm_end=("", ""))

    async def query_job_status() -> JobStatus:
        spawner.job_status = job_status
        return status

    def clear_state() -> None:
        spawner.job_id, spawner.job_status = "", ""

    spawner.query_job_status = query_job_status
    spawner.clear_state = clear_state
    return spawner


@pytest.mark.parametrize(
    ("job_status", "reason"),
    [
        ("NODE_FAIL wbnode1", reasons.NODE_FAILED),
        ("OUT_OF_MEMORY wbnode1", reasons.OUT_OF_MEMORY),
        ("CANCELLED wbnode1", reasons.JOB_CANCELLED),
        ("COMPLETED wbnode1", reasons.SERVER_EXITED),
        ("TIMEOUT 1:00:00 wbnode1", reasons.JOB_TIMED_OUT),
        ("slurm_load_jobs error: Invalid job id specified", None),
    ],
)
def test_the_poll_that_finds_the_job_gone_remembers_why_for_the_ledger(job_status, reason):
    spawner = polled("8101", job_status, JobStatus.NOTFOUND)
    assert asyncio.run(SlurmJobSpawner.poll(spawner)) == 1
    assert spawner.job_id == ""
    assert spawner.slurm_end[0] == "8101"
    assert why(asyncio.run(SlurmGPUSpawner.gpu_exit_reason(spawner))) == reason


def why(ending) -> str | None:
    """The ledger's reason of an ending (None: no ending)."""
    return ending.reason if ending is not None else None


def test_a_blank_answer_from_squeue_is_not_an_ended_job():
    """batchspawner leaves the status blank when its squeue call fails: the server is not judged gone (its lease
    was closed as "server exited: exit code 1" while the job ran); a job Slurm forgot still is (above)."""
    spawner = polled("8104", "", JobStatus.NOTFOUND)
    spawner.log, spawner.server_label = logging.getLogger("test"), "ann"
    assert asyncio.run(SlurmJobSpawner.poll(spawner)) is None
    assert spawner.job_id == "8104"
    assert spawner.slurm_end == ("", "")


def test_a_running_job_leaves_nothing_to_remember():
    spawner = polled("8102", "RUNNING wbnode1", JobStatus.RUNNING)
    assert asyncio.run(SlurmJobSpawner.poll(spawner)) is None
    assert spawner.slurm_end == ("", "")
    assert asyncio.run(SlurmGPUSpawner.gpu_exit_reason(spawner)) is None


def test_squeue_is_asked_for_ended_jobs_too():
    # Without -t all, squeue lists nothing for a job that ended, and NODE_FAIL would read as "server exited".
    assert " -t all " in SlurmJobSpawner._default_batch_query_cmd(None)


def test_a_cancel_by_the_hub_is_noted_before_scancel_runs(monkeypatch):
    seen = []

    def scancel(args, timeout=20):
        seen.append((args, cancelled_by_hub(args[-1])))
        return ""

    monkeypatch.setattr(slurm_jobs, "run_slurm", scancel)
    assert not cancelled_by_hub("8103")
    slurm_jobs.cancel("8103")
    assert seen == [(["scancel", "8103"], True)]
    spawner = polled("8103", "CANCELLED wbnode1", JobStatus.NOTFOUND)
    asyncio.run(SlurmJobSpawner.poll(spawner))
    assert why(asyncio.run(SlurmGPUSpawner.gpu_exit_reason(spawner))) == reasons.STOPPED


def reconciler() -> SlurmGPUSpawner:
    """A spawner as the reconciler asks it about a lease: no user, no server, only the class's rules."""
    return SlurmGPUSpawner.__new__(SlurmGPUSpawner)


def lease(ref: str) -> Lease:
    return Lease("ann", "", ("GPU-1",), datetime(2026, 12, 6, tzinfo=UTC), ref, "wbnode1")


@pytest.mark.parametrize(
    ("ref", "state", "reason"),
    [
        ("slurm:8201", "NODE_FAIL", reasons.NODE_FAILED),
        ("slurm:8201", "OUT_OF_MEMORY", reasons.OUT_OF_MEMORY),
        ("slurm:8201", "CANCELLED", reasons.JOB_CANCELLED),
        ("slurm:8201", "TIMEOUT", reasons.JOB_TIMED_OUT),
        ("slurm:8201", "COMPLETED", reasons.SERVER_EXITED),  # a known end with nothing more to say
        ("slurm:8201", "PENDING", None),  # requeued: nothing says why
        ("slurm:8299", "NODE_FAIL", None),  # another job's state; this one is gone from Slurm's memory
        ("pid:42", "NODE_FAIL", None),
    ],
)
def test_the_reconciler_reads_why_from_slurms_job_list(monkeypatch, ref, state, reason):
    monkeypatch.setattr(slurm_spawner, "recent_jobs", lambda: [SlurmJob("8201", state, "None", "wbnode1")])
    assert why(reconciler().gpu_lease_gone_reason(lease(ref))) == reason


def test_the_reconciler_says_stopped_for_a_job_the_hub_cancelled_and_nothing_when_slurm_is_away(monkeypatch):
    monkeypatch.setattr(slurm_jobs, "run_slurm", lambda args, timeout=20: "")
    slurm_jobs.cancel("8202")
    monkeypatch.setattr(slurm_spawner, "recent_jobs", lambda: [SlurmJob("8202", "CANCELLED")])
    assert why(reconciler().gpu_lease_gone_reason(lease("slurm:8202"))) == reasons.STOPPED

    def away():
        raise SlurmUnavailableError("squeue: Unable to contact slurm controller")

    monkeypatch.setattr(slurm_spawner, "recent_jobs", away)
    assert reconciler().gpu_lease_gone_reason(lease("slurm:8202")) is None
