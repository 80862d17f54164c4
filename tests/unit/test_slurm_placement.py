"""The Slurm side of the GPU policy with Slurm replaced by tables: placement, reconcile, the node GPU map,
reservations and fair share before and in Slurm's queue, and the start report the hub accepts.

The real cluster runs in tests/slurm; these tables reach the cases it cannot make on demand (a job that
vanishes, a lying report, a node whose GPUs were swapped, another hub's jobs, an hour of GPU use).
"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta

import pytest

from workbench_spawner.backends.slurm.fairness import free_on_slurm, reprioritize
from workbench_spawner.backends.slurm.inventory import MapConflictError, NodeGPUMap, cluster_inventory
from workbench_spawner.backends.slurm.jobs import SlurmUnavailableError
from workbench_spawner.backends.slurm.node_report import NodeReport
from workbench_spawner.backends.slurm.placement import SlurmPlacement
from workbench_spawner.backends.slurm.reconcile import WORDS, reconcile_jobs
from workbench_spawner.backends.slurm.records import SlurmJob, SlurmNode
from workbench_spawner.backends.slurm.report_api import read_report
from workbench_spawner.ledger.hub_identity import hub_id
from workbench_spawner.ledger.reconcile_book import SERVER_ADOPTED, SERVER_STOPPED
from workbench_spawner.ledger.reservation_book import ReservationBook
from workbench_spawner.placement.engine import EngineJob, EngineJobEndedError
from workbench_spawner.placement.engine_report import ReportRefusedError
from workbench_spawner.placement.engine_reservations import EngineReservations
from workbench_spawner.placement.host import NoGPUAvailableError
from workbench_spawner.rules.queue_order import Waiting
from workbench_spawner.rules.reservations import Reservation
from workbench_spawner.rules.window import parse_window

NODES = [SlurmNode("n1", "10.0.0.1", "IDLE", "h100", 2), SlurmNode("n2", "10.0.0.2", "IDLE", "h100", 2)]
REAL = cluster_inventory(NODES, "")  # SLURM-n1-gpu0 ... until jobs report UUIDs


def report(node: str, uuids: list[str], job: list[str]) -> NodeReport:
    return NodeReport(
        node,
        tuple({"index": i, "uuid": u, "name": "NVIDIA H100", "memory_total_bytes": 80} for i, u in enumerate(uuids)),
        tuple(job),
    )


class FakeSlurm:
    """A queue we script: each call of jobs() pops the next list (the last one repeats)."""

    def __init__(self, *states: list[SlurmJob]):
        self.states = list(states)
        self.cancelled: list[str] = []
        self.priorities: list[tuple[str, int]] = []
        self.now = 0.0

    def jobs(self) -> list[SlurmJob]:
        self.now += 1.0
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]

    def cancel(self, job_id: str) -> None:
        self.cancelled.append(job_id)

    def clock(self) -> float:
        return self.now

    def placement(self, store, **kwargs) -> SlurmPlacement:
        kwargs.setdefault("learn", NodeGPUMap(store).accept)
        return SlurmPlacement(
            store,
            lambda: REAL,
            poll_interval=0.001,
            report_timeout=5.0,
            clock=self.clock,
            jobs=self.jobs,
            cancel_job=self.cancel,
            nodes=lambda: NODES,
            set_job_priority=lambda j, p: self.priorities.append((j, p)),
            **kwargs,
        )


def pending(job_id: str, reason: str = "Resources", **kw) -> SlurmJob:
    return SlurmJob(job_id, "PENDING", reason, gpus_requested=1, partition="gpu", **kw)


def running(job_id: str, node: str = "n1", idx: tuple[int, ...] = (1,)) -> SlurmJob:
    return SlurmJob(job_id, "RUNNING", "None", node, gpu_indices=idx, gpus_requested=len(idx), partition="gpu")


def place(placement: SlurmPlacement, count: int = 1, started=lambda: None, timeout: float = 30.0, **kw):
    events: list[str] = []
    job = EngineJob(job_id="7", started=started, describe=events.append, **kw)
    result = asyncio.run(placement.place("alice", "", count, None, timeout, job=job))
    return result, events


# -- placement --------------------------------------------------------------------------------------


def test_a_job_that_runs_and_reports_gets_a_lease_on_its_node(store):
    slurm = FakeSlurm([pending("7")], [running("7")])
    lease, events = place(slurm.placement(store), started=lambda: report("n1", ["GPU-a", "GPU-b"], ["GPU-b"]))
    assert (lease.node, lease.gpu_uuids, lease.ref) == ("n1", ("GPU-b",), "slurm:7")
    assert any("Slurm: Resources" in e for e in events)
    assert not slurm.cancelled
    # Learned only what Slurm gave the job: GPU 1 of n1 (a real job reports no other GPU).
    assert NodeGPUMap(store).known() == {
        "n1": [{"index": 1, "uuid": "GPU-b", "name": "NVIDIA H100", "memory_total_bytes": 80}]
    }


def test_a_cpu_only_job_runs_gets_no_lease_and_names_no_gpu(store):
    slurm = FakeSlurm([running("7", idx=())])
    lease, _ = place(slurm.placement(store), count=0, started=lambda: report("n1", ["GPU-a"], []))
    assert lease is None
    assert store.leases() == []
    assert not slurm.cancelled
    assert NodeGPUMap(store).known() == {}  # a job without GPUs cannot name the node's GPUs


@pytest.mark.parametrize(
    ("node_report", "why"),
    [
        (lambda: report("n2", ["GPU-a", "GPU-b"], ["GPU-b"]), "another node"),  # reports from elsewhere
        (lambda: report("n1", ["GPU-a", "GPU-b"], ["GPU-a"]), "another index"),  # its UUID is not Slurm's index
        (lambda: report("n1", ["GPU-a"], []), "no such index"),
    ],
)
def test_a_report_that_disagrees_with_slurm_cancels_the_job_and_teaches_nothing(store, node_report, why):
    slurm = FakeSlurm([running("7")])
    with pytest.raises(NoGPUAvailableError, match=r"gres.conf disagree"):
        place(slurm.placement(store), started=node_report)
    assert slurm.cancelled == ["7"], why
    assert store.leases() == [], why
    assert NodeGPUMap(store).known() == {}


def test_gpus_leased_to_another_server_cancel_the_job(store):
    assert store.adopt("bob", "", ["GPU-b"], "slurm:6", node="n1")
    slurm = FakeSlurm([running("7")])
    with pytest.raises(NoGPUAvailableError, match="held by another server"):
        place(slurm.placement(store), started=lambda: report("n1", ["GPU-a", "GPU-b"], ["GPU-b"]))
    assert slurm.cancelled == ["7"]
    assert [lease.user for lease in store.leases()] == ["bob"]


def test_a_job_that_leaves_the_queue_before_it_runs_is_the_end_of_the_spawn(store):
    slurm = FakeSlurm([pending("7")], [])
    with pytest.raises(EngineJobEndedError, match="gone from the queue"):
        place(slurm.placement(store))
    assert slurm.cancelled == []


def test_a_hopeless_reason_cancels_at_once_and_a_drained_node_does_not(store):
    slurm = FakeSlurm([pending("7", "PartitionTimeLimit")])
    with pytest.raises(NoGPUAvailableError, match="cannot run this request"):
        place(slurm.placement(store))
    assert slurm.cancelled == ["7"]
    waits = FakeSlurm([pending("7", "ReqNodeNotAvail, UnavailableNodes:n2")], [running("7")])
    lease, events = place(waits.placement(store), started=lambda: report("n1", ["GPU-a", "GPU-b"], ["GPU-b"]))
    assert lease.gpu_uuids == ("GPU-b",)
    assert not waits.cancelled
    assert any("unavailable (down, drained or reserved)" in e for e in events)


def test_the_queue_timeout_cancels_a_pending_job_and_says_so(store):
    slurm = FakeSlurm([pending("7")])
    with pytest.raises(NoGPUAvailableError, match=r"within 5 seconds .* the job was cancelled"):
        place(slurm.placement(store), timeout=5)
    assert slurm.cancelled == ["7"]
    assert slurm.now >= 5


def test_an_unanswering_controller_is_waited_for_then_times_out(store):
    def down():
        slurm.now += 1
        raise SlurmUnavailableError("squeue: Unable to contact slurm controller")

    slurm = FakeSlurm([])
    placement = slurm.placement(store)
    placement.jobs = down
    with pytest.raises(NoGPUAvailableError, match="within 3 seconds"):
        place(placement, timeout=3)
    assert slurm.cancelled == ["7"]


def test_a_job_that_never_reports_is_cancelled_with_its_log_named(store):
    slurm = FakeSlurm([running("7")])
    placement = slurm.placement(store)
    placement.report_timeout = 0.5

    def never():
        slurm.now += 0.2
        return None

    with pytest.raises(NoGPUAvailableError, match=r"did not report back .* ~/workbench-slurm-7.log"):
        place(placement, started=never)
    assert slurm.cancelled == ["7"]


# -- the node GPU map (real GPUs) ---------------------------------------------------------------------


def test_real_gpus_are_learned_one_job_at_a_time_and_named_everywhere(store):
    book = NodeGPUMap(store)
    book.accept(NodeReport("n1", ({"index": 1, "uuid": "GPU-bbbb", "name": "NVIDIA H100"},), ("GPU-bbbb",)))
    resolved = NodeGPUMap.resolve_with(REAL, book.known())
    assert [d.uuid for d in resolved.devices] == ["SLURM-n1-gpu0", "GPU-bbbb", "SLURM-n2-gpu0", "SLURM-n2-gpu1"]
    assert resolved.devices[1].name == "NVIDIA H100"
    assert resolved.devices[1].node == "n1"
    book.accept(report("n1", ["GPU-aaaa", "GPU-bbbb"], ["GPU-aaaa"]))  # the next job names GPU 0 too
    assert [e["uuid"] for e in book.known()["n1"]] == ["GPU-aaaa", "GPU-bbbb"]
    assert [d.uuid for d in NodeGPUMap.resolve_with(REAL, book.known()).devices][:2] == ["GPU-aaaa", "GPU-bbbb"]


@pytest.mark.parametrize(
    ("liar", "words"),
    [
        (report("n1", ["GPU-aaaa", "GPU-zzzz"], []), "but the hub knows it as GPU-bbbb"),  # renames n1's GPU 1
        (report("n2", ["GPU-aaaa", "GPU-cccc"], []), "which the hub knows as GPU 0 of node n1"),  # n1's GPU on n2
        (report("n1", ["GPU-bbbb", "GPU-aaaa"], []), "but the hub knows it as GPU-aaaa"),  # swaps n1's two
    ],
)
def test_a_report_that_contradicts_what_is_known_is_refused_and_changes_nothing(store, liar, words):
    book = NodeGPUMap(store)
    book.accept(report("n1", ["GPU-aaaa", "GPU-bbbb"], []))
    before = book.known()
    with pytest.raises(MapConflictError, match=words):
        book.accept(liar)
    assert book.known() == before


def test_an_admin_forgets_a_node_whose_gpus_were_swapped(store):
    book = NodeGPUMap(store)
    book.accept(report("n1", ["GPU-aaaa", "GPU-bbbb"], []))
    assert book.forget("n1")
    assert not book.forget("n1")
    book.accept(report("n1", ["GPU-new0", "GPU-new1"], []))
    assert [e["uuid"] for e in book.known()["n1"]] == ["GPU-new0", "GPU-new1"]


def test_a_conflicting_report_at_start_cancels_the_job(store):
    NodeGPUMap(store).accept(report("n1", ["GPU-aaaa", "GPU-bbbb"], []))
    slurm = FakeSlurm([running("7")])
    liar = report("n1", ["GPU-aaaa", "GPU-zzzz"], ["GPU-zzzz"])  # agrees with Slurm's index 1, renames it
    with pytest.raises(NoGPUAvailableError, match=r"reported GPUs the hub cannot accept: .*knows it as GPU-bbbb"):
        place(slurm.placement(store), started=lambda: liar)
    assert slurm.cancelled == ["7"]
    assert store.leases() == []
    assert NodeGPUMap(store).known()["n1"][1]["uuid"] == "GPU-bbbb"


def test_the_hub_id_is_made_once_and_kept(store):
    first = hub_id(store)
    assert re.fullmatch(r"[0-9a-f]{8}", first), first  # 8 hex digits: in every Slurm job tag and pod name
    assert hub_id(store) == first


# -- reconcile after a restart ----------------------------------------------------------------------


def tagged(
    job: SlurmJob, user: str, hub: str = "0a1b2c3d", slurm_user: str | None = None, submitted: int = 1_699_999_000
) -> SlurmJob:
    from dataclasses import replace

    from workbench_spawner.backends.slurm.tags import job_tag

    return replace(
        job, comment=job_tag(user, "", hub), start_time=1_700_000_000, user=slurm_user or user, submit_time=submitted
    )


def test_reconcile_adopts_cancels_and_leaves_other_hubs_alone(store):
    store.adopt("held", "", ["GPU-a"], "slurm:1", node="n1")
    uuids = {("n1", 0): "GPU-a", ("n1", 1): "GPU-b"}
    cancelled: list[str] = []
    jobs = [
        tagged(running("1", idx=(0,)), "held"),  # has its lease: untouched
        tagged(running("2", idx=(1,)), "carol"),  # running, GPU free and known: adopted
        tagged(pending("3"), "dave"),  # pending, nobody waits: cancelled
        tagged(running("4", idx=(0,)), "erin"),  # its GPU is leased to "held": cancelled
        tagged(running("5", node="n2", idx=(0,)), "fay"),  # a GPU the hub cannot name: cancelled
        tagged(running("6", idx=(1,)), "gus", hub="ffff0000"),  # another hub's: left alone
        running("8"),  # not the workbench's at all
        tagged(running("9", idx=(1,)), "carol", slurm_user="mallory"),  # a forged tag: never charged to carol
        tagged(pending("10"), "hal", submitted=1_800_000_000),  # submitted by this hub process: a live spawn
    ]
    actions = reconcile_jobs(
        jobs,
        store.leases(),
        "0a1b2c3d",
        lambda n, i: uuids.get((n, i)),
        lambda *a: store.adopt(*a),
        cancelled.append,
        submitted_before=1_750_000_000,
    )
    assert [(a.ident, a.what) for a in actions] == [
        ("2", "adopted"),
        ("3", "cancelled"),
        ("4", "cancelled"),
        ("5", "cancelled"),
        ("6", "left"),
        ("9", "left"),
        ("10", "left"),
    ]
    assert cancelled == ["3", "4", "5"]
    carol = store.lease_of("carol", "")
    assert carol.gpu_uuids == ("GPU-b",)
    assert carol.node == "n1"
    assert carol.ref == "slurm:2"
    assert carol.since == datetime.fromtimestamp(1_700_000_000, UTC)


def test_reconcile_logs_a_job_slurm_does_not_cancel_and_goes_on(store, caplog):
    cancelled: list[str] = []

    def cancel(job_id: str) -> None:
        if job_id == "3":
            raise SlurmUnavailableError("scancel timed out")
        cancelled.append(job_id)

    jobs = [tagged(pending("3"), "dave"), tagged(pending("4"), "erin")]
    actions = reconcile_jobs(jobs, [], "0a1b2c3d", lambda n, i: None, store.adopt, cancel)
    assert [(a.ident, a.what) for a in actions] == [("3", "cancelled"), ("4", "cancelled")]
    assert cancelled == ["4"]
    assert "Could not cancel Slurm job 3: scancel timed out" in caplog.text
    assert WORDS.fixes == {"adopted": SERVER_ADOPTED, "cancelled": SERVER_STOPPED}


# -- fairness on Slurm --------------------------------------------------------------------------------


def test_fair_share_hands_our_priorities_to_the_lighter_user_and_leaves_others_alone():
    jobs = [
        pending("10", priority=300),
        pending("11", priority=200),
        pending("12", priority=100),
        pending("99", priority=250),
    ]  # 99: a job from outside the workbench
    waiting = {
        "10": Waiting("10", "heavy", joined=0, gpu_hours=12),
        "11": Waiting("11", "light", joined=1, gpu_hours=0.5),
        "12": Waiting("12", "medium", joined=2, gpu_hours=3),
    }
    assert sorted(reprioritize(jobs, waiting, "fair-share", now=60, aging_minutes=30)) == [
        ("10", 100),
        ("11", 300),
        ("12", 200),
    ]
    assert reprioritize(jobs, waiting, "fifo", now=60, aging_minutes=30) == []
    # A held job (priority 0) keeps its hold and passes no 0 on; the others are still reordered.
    held = [pending("10", reason="JobHeldUser", priority=0), pending("11", priority=100), pending("12", priority=200)]
    assert sorted(reprioritize(held, waiting, "fair-share", now=60, aging_minutes=30)) == [("11", 200), ("12", 100)]
    # After the aging bound the heavy user's request, which came first, goes first again.
    assert reprioritize(jobs, waiting, "fair-share", now=31 * 60, aging_minutes=30) == []


def test_fair_share_in_the_queue_says_why_and_sets_slurm_priorities(store):
    slurm = FakeSlurm([pending("7", priority=200), pending("8", priority=300)], [running("7")])
    placement = slurm.placement(store, queue_order="fair-share", gpu_hours=lambda user: 12.0)
    placement._pending["8"] = Waiting("8", "light", joined=-5, gpu_hours=1.0)
    lease, events = place(placement, started=lambda: report("n1", ["GPU-a", "GPU-b"], ["GPU-b"]))
    assert slurm.priorities == []  # the lighter user's job already had the higher priority
    assert any("you used 12.0 GPU-hours this week; 1 user who used less is ahead" in e for e in events), events
    assert lease.gpu_uuids == ("GPU-b",)
    # The heavy user's job came first and Slurm ranked it higher: the priorities are swapped.
    heavy_first = FakeSlurm([pending("7", priority=200), pending("8", priority=300)], [running("7")])
    placement = heavy_first.placement(store, queue_order="fair-share", gpu_hours=lambda user: 0.0)
    placement._pending["8"] = Waiting("8", "heavy", joined=-5, gpu_hours=40.0)
    store.release("alice", "", "test")
    _, events = place(placement, started=lambda: report("n1", ["GPU-a", "GPU-b"], ["GPU-b"]))
    assert sorted(heavy_first.priorities) == [("7", 300), ("8", 200)]
    assert any(
        "you used 0.0 GPU-hours this week), next in line" in e
        or ("next in line; you used 0.0 GPU-hours this week" in e)
        for e in events
    ), events


def test_free_gpus_on_slurm_skip_allocated_indices_and_unusable_nodes():
    nodes = [SlurmNode("n1", "a", "MIXED", "h100", 2, gpus_used=(0,)), SlurmNode("n2", "b", "DOWN+DRAIN", "h100", 2)]
    assert free_on_slurm(REAL, nodes, None) == ["SLURM-n1-gpu1"]
    assert free_on_slurm(REAL, nodes, "A100") == []


def reserve(store, group: str, gpus: int, window: str, grace: float = 15.0) -> None:
    ReservationBook(store).create(
        Reservation(group, gpus, parse_window(window), grace_minutes=grace),
        {"H100": 4},
        datetime(2026, 12, 8, 9, 0, tzinfo=UTC),
        UTC,
    )


def on_slurm(nodes: list[SlurmNode]):
    """What the Slurm placement hands the reservation check as free: the GPUs sinfo shows unallocated."""
    return lambda inventory: free_on_slurm(inventory, nodes, None)


def test_a_non_member_waits_before_submitting_while_free_gpus_are_reserved(store):
    reserve(store, "ml-course", 3, "2026-12-08 10:00-12:00")
    now = datetime(2026, 12, 8, 10, 5, tzinfo=UTC)
    book = EngineReservations(store, lambda: REAL, UTC, lambda: now)
    one_busy = [SlurmNode("n1", "a", "MIXED", "h100", 2, gpus_used=(0,)), NODES[1]]
    ok, why = book.may_submit(["other"], 1, None, on_slurm(one_busy))
    assert not ok
    assert "3 free in the cluster, but 3 of 4 GPUs reserved for ml-course until 12:00" in why
    assert book.may_submit(["ml-course"], 1, None, on_slurm(one_busy)) == (True, "")
    assert book.may_submit(["other"], 1, None, on_slurm(NODES)) == (True, "")  # 4 free, 3 kept
    assert book.may_submit(["other"], 0, None, on_slurm(one_busy)) == (True, "")  # CPU-only servers never wait
    # After the grace period, unasked reserved GPUs go to everyone.
    later = EngineReservations(store, lambda: REAL, UTC, lambda: now + timedelta(minutes=20))
    assert later.may_submit(["other"], 1, None, on_slurm(one_busy)) == (True, "")
    later.asking["job-9"] = (frozenset({"ml-course"}), 3, None)  # unless members are waiting in Slurm's queue
    assert later.may_submit(["other"], 1, None, on_slurm(one_busy))[0] is False


def test_requests_already_admitted_count_as_taking_free_gpus(store):
    reserve(store, "ml-course", 2, "2026-12-08 10:00-12:00")
    now = datetime(2026, 12, 8, 10, 5, tzinfo=UTC)
    book = EngineReservations(store, lambda: REAL, UTC, lambda: now)
    # 4 free, 2 kept: two non-members may go, but not at once if the first was admitted and not running.
    assert book.may_submit(["other"], 1, None, on_slurm(NODES)) == (True, "")
    book.asking["alice/"] = (frozenset({"other"}), 1, None)
    assert book.may_submit(["other"], 1, None, on_slurm(NODES)) == (True, "")
    book.asking["bob/"] = (frozenset({"other"}), 1, None)
    ok, why = book.may_submit(["other"], 1, None, on_slurm(NODES))
    assert not ok
    assert why.startswith("2 free in the cluster")
    # A member admitted before counts as the members' use: the reserve it fills is not held twice.
    book.asking = {"stud/": (frozenset({"ml-course"}), 1, None)}
    assert book.may_submit(["other"], 1, None, on_slurm(NODES)) == (True, "")


def test_admit_to_queue_waits_then_gives_up_with_the_reservation_named(store):
    reserve(store, "ml-course", 4, "2026-12-08 10:00-12:00")
    now = datetime(2026, 12, 8, 10, 5, tzinfo=UTC)
    slurm = FakeSlurm([])
    placement = slurm.placement(store, reservations=EngineReservations(store, lambda: REAL, UTC, lambda: now))
    events: list[str] = []

    def tick():
        slurm.now += 1
        return NODES

    placement.nodes = tick
    with pytest.raises(NoGPUAvailableError, match="nothing was submitted to Slurm"):
        asyncio.run(placement.admit_to_queue("alice/", 1, None, ["other"], deadline=3, describe=events.append))
    assert events == [
        "Waiting for 1 GPU outside reserved ones: 4 free in the cluster, but 4 of 4 GPUs "
        "reserved for ml-course until 12:00"
    ]


# -- the start report a job may send -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (
            {"exec_prefix": "", "batch_cancel_cmd": "touch /tmp/x"},
            "may carry only port and workbench_report; refused: batch_cancel_cmd, exec_prefix",
        ),
        ({"port": 8888, "cmd": ["sh"]}, "refused: cmd"),
        ({"port": "8888"}, "port must be a whole number from 1 to 65535"),
        ({"port": True}, "port must be a whole number"),
        ({"port": 70000}, "port must be a whole number"),
        ({"workbench_report": {"gpus": []}}, "workbench_report must be an object naming the node"),
        (
            {"workbench_report": {"node": "n1", "gpus": [{"index": i, "uuid": f"G{i}"} for i in range(65)]}},
            "more than 64 GPUs",
        ),
        ({"workbench_report": {"node": "n" * 300}}, "longer than 256 characters"),
        ({}, "neither port nor workbench_report"),
        ({"workbench_report": {"node": "n1", "gpus": [{"index": "x", "uuid": "GPU-a"}]}}, "whole-number index"),
        ({"workbench_report": {"node": "n1", "gpus": [{"index": 0, "uuid": 7}]}}, "a text uuid"),
        ({"workbench_report": {"node": "n1", "gpus": [], "job_gpus": [1]}}, "job_gpus in workbench_report must be"),
        ([1, 2], "must be a JSON object"),
    ],
)
def test_a_start_report_takes_port_and_gpu_report_only(body, words):
    with pytest.raises(ReportRefusedError, match=words.replace("(", r"\(")):
        read_report(body)


def test_a_good_start_report_is_taken_whole():
    body = {
        "port": 41234,
        "workbench_report": {"node": "n1", "gpus": [{"index": 0, "uuid": "GPU-a"}], "job_gpus": ["GPU-a"]},
    }
    assert read_report(body) == body
