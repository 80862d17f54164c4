"""Placement on Kubernetes with the API replaced by scripted pods: the scheduler's words and the place in
line while a pod is pending, the queue timeout, pods that end or never report, reports checked against
the pod before any lease is written, and reservations held before a pod exists.

Each look at a scripted pod takes its next state and moves the fake clock one second, so a test of a
five-second queue timeout runs in milliseconds. (The real scheduler and kubelet: tests/kubernetes.)
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from workbench_devices import DeviceInventory
from workbench_spawner.backends.kubernetes.cluster import KubeNode, KubernetesUnavailableError
from workbench_spawner.backends.kubernetes.inventory import NodeUUIDs, cluster_inventory
from workbench_spawner.backends.kubernetes.placement import (
    KubernetesPlacement,
    PodJob,
    PodReport,
    container_trouble,
    scheduler_words,
)
from workbench_spawner.ledger.reservation_book import ReservationBook
from workbench_spawner.placement.engine import EngineJob, EngineJobEndedError
from workbench_spawner.placement.engine_reservations import EngineReservations
from workbench_spawner.placement.host import NoGPUAvailableError
from workbench_spawner.rules.reservations import Reservation
from workbench_spawner.rules.window import parse_window

NS = "wb"
H200 = {"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/gpu.memory": "144384"}
NODES = [KubeNode("n1", True, True, 2, 2, labels=H200), KubeNode("n2", True, True, 2, 2, labels=H200)]
REAL = cluster_inventory(NODES, "")  # K8S-n1-gpu0 ... until pods report UUIDs
SIM = cluster_inventory(NODES, "2xH200-141GB")  # GPU-sim-n1-00-h200-141gb ...
SIM_N1 = [d.uuid for d in SIM.devices if d.node == "n1"]
SIM_N2 = [d.uuid for d in SIM.devices if d.node == "n2"]
INSUFFICIENT = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
NOW = datetime(2026, 12, 8, 10, 5, tzinfo=UTC)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def pending() -> dict:
    return {"metadata": {}, "spec": {}, "status": {"phase": "Pending"}}


def scheduled(node: str = "n1", waiting: str = "", terminated: dict | None = None) -> dict:
    state = {"waiting": {"reason": waiting, "message": f"the {waiting} message"}} if waiting else {}
    if terminated is not None:
        state = {"terminated": terminated}
    return {
        "metadata": {},
        "spec": {"nodeName": node},
        "status": {"phase": "Pending", "containerStatuses": [{"name": "notebook", "state": state}]},
    }


class Pod:
    """A pod we script: each look (``pod()``) takes the next state (the last repeats) and a second passes.

    ``None`` as a state: the watch does not have the pod (not seen yet, or deleted)."""

    def __init__(self, clock: Clock, *states, events=(), report=None, name="wb-1a2b3c4d-alice", submitted=0.0):
        self.clock = clock
        self.states = list(states)
        self.scheduler_events = [{"reason": "FailedScheduling", "message": m} for m in events]
        self.report = report
        self.name = name
        self.submitted = submitted
        self.said: list[str] = []  # the progress events the user saw
        self.reports: list[tuple[int, str]] = []  # (ahead, the scheduler's words) as the hub counts them
        self.looks = 0
        self.watch = lambda: None  # called at each look, to see the hub's state while the pod waits

    def pod(self):
        self.clock.now += 1
        self.looks += 1
        self.watch()
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]

    def job(self) -> PodJob:
        return PodJob(
            job_id=f"{NS}/{self.name}",
            started=lambda: self.report,
            describe=self.said.append,
            pod=self.pod,
            events=lambda: self.scheduler_events,
            submitted=self.submitted,
        )


def placement(
    store, clock: Clock, inventory: DeviceInventory = REAL, free=lambda inventory: [], now=NOW
) -> KubernetesPlacement:
    """Wired as KubernetesGPUSpawner.engine_placement wires it: reported UUIDs are learned on real nodes."""
    book = NodeUUIDs(store)
    capacity = {n.name: n.gpu_capacity for n in NODES}

    def current() -> DeviceInventory:
        return book.resolve(inventory)

    real = inventory.source == "kubernetes"
    return KubernetesPlacement(
        store,
        current,
        EngineReservations(store, current, UTC, lambda: now),
        free,
        poll_interval=0.01,
        report_timeout=5.0,
        clock=clock,
        learn=(lambda node, uuids, profile: book.accept(node, uuids, capacity[node]))
        if real
        else (lambda node, uuids, profile: None),
    )


async def place(placement: KubernetesPlacement, pod: Pod, count=1, timeout=5.0, user="alice", groups=(), model=None):
    return await placement.place(
        user,
        "",
        count,
        model,
        timeout,
        report=lambda ahead, words="": pod.reports.append((ahead, words)),
        groups=groups,
        job=pod.job(),
    )


# -- while the pod is pending ---------------------------------------------------------------------------


async def test_a_pending_pod_shows_the_schedulers_words_then_gets_its_lease(store):
    clock = Clock()
    pod = Pod(
        clock, None, pending(), pending(), scheduled("n1"), events=[INSUFFICIENT], report=PodReport("n1", ("GPU-b",))
    )
    lease = await place(placement(store, clock), pod, timeout=30)
    assert pod.said[0] == (
        "Waiting for 1 GPU: you are next in line; Kubernetes says: "
        "0/1 nodes are available: 1 Insufficient nvidia.com/gpu"
    )
    assert pod.said[-1] == "Kubernetes scheduled the pod on n1; waiting for it to report its GPUs"
    assert pod.reports == [(0, "0/1 nodes are available: 1 Insufficient nvidia.com/gpu")]  # once, not every look
    assert (lease.user, lease.server, lease.gpu_uuids, lease.node) == ("alice", "", ("GPU-b",), "n1")
    assert lease.ref == "k8s:wb/wb-1a2b3c4d-alice"
    assert store.leases() == [lease]
    assert NodeUUIDs(store).known() == {"n1": ["GPU-b"]}  # the report taught the hub n1's GPU


async def test_before_the_scheduler_speaks_the_user_is_told_it_is_waited_for(store):
    clock = Clock()
    pod = Pod(clock, pending(), scheduled("n1"), report=PodReport("n1", ("GPU-b",)))
    await place(placement(store, clock), pod, timeout=30)
    assert pod.said[0] == "Waiting for 1 GPU: you are next in line; waiting for the Kubernetes scheduler"


async def test_a_second_pending_pod_is_told_who_is_ahead_and_moves_up(store):
    clock = Clock()
    here = placement(store, clock)
    first = Pod(
        clock, *[pending()] * 3, scheduled("n1"), events=[INSUFFICIENT], report=PodReport("n1", ("GPU-a",)), submitted=1
    )
    second = Pod(
        clock,
        *[pending()] * 8,
        scheduled("n2"),
        events=[INSUFFICIENT],
        report=PodReport("n2", ("GPU-c",)),
        name="wb-1a2b3c4d-bob",
        submitted=2,
    )
    a, b = await asyncio.gather(place(here, first, timeout=60), place(here, second, timeout=60, user="bob"))
    assert not any("ahead of you" in text for text in first.said)
    waits = [text for text in second.said if text.startswith("Waiting")]
    assert waits == [
        "Waiting for 1 GPU: 1 ahead of you among this hub's servers; Kubernetes says: " + INSUFFICIENT.rstrip("."),
        "Waiting for 1 GPU: you are next in line; Kubernetes says: " + INSUFFICIENT.rstrip("."),
    ]
    assert [r[0] for r in second.reports] == [1, 0]
    assert (a.node, a.gpu_uuids, b.node, b.gpu_uuids) == ("n1", ("GPU-a",), "n2", ("GPU-c",))
    assert here.waiting() == 0


async def test_past_the_queue_timeout_the_spawn_fails_with_the_schedulers_words(store):
    clock = Clock()
    here = placement(store, clock)
    pod = Pod(clock, pending(), events=["0/3 nodes are available: 3 Insufficient nvidia.com/gpu."])
    waiting: list[int] = []
    pod.watch = lambda: waiting.append(here.waiting())
    with pytest.raises(NoGPUAvailableError) as failed:
        await place(here, pod, count=2, timeout=5)
    assert str(failed.value) == (
        "Kubernetes did not place the pod for 2 GPUs within 5 seconds (0/3 nodes are available: 3 Insufficient "
        "nvidia.com/gpu); the pod was deleted. Try again later, ask for fewer GPUs, or start a CPU-only server "
        "(0 GPUs)."
    )
    assert not isinstance(failed.value, EngineJobEndedError)
    assert clock.now >= 5
    assert pod.looks <= 7
    assert set(waiting) == {1}  # it was in the hub's line while it waited
    assert here.waiting() == 0
    assert here.reservations.asking == {}
    assert store.leases() == []


async def test_the_deadline_the_template_set_wins_over_the_timeout(store):
    clock = Clock()
    here = placement(store, clock)
    pod = Pod(clock, pending())
    job = pod.job()
    with pytest.raises(NoGPUAvailableError, match="within 300 seconds"):
        await here.place("alice", "", 1, None, 300, job=replace(job, deadline=3.0))
    assert clock.now == 3  # the admission wait already used most of the queue timeout


@pytest.mark.parametrize(
    ("states", "words"),
    [
        ((pending(), None), "The pod wb/wb-1a2b3c4d-alice was deleted before the server started."),
        (
            (pending(), {**pending(), "metadata": {"deletionTimestamp": "2026-12-08T10:05:00Z"}}),
            # BUG (reported): the phase of a pod being deleted is still Pending, so the sentence said "(Pending)"
            "The pod wb/wb-1a2b3c4d-alice ended before the server started (deleted).",
        ),
        (
            (pending(), {"metadata": {}, "spec": {}, "status": {"phase": "Failed"}}),
            "The pod wb/wb-1a2b3c4d-alice ended before the server started (Failed).",
        ),
        (
            ({"metadata": {}, "spec": {"nodeName": "n1"}, "status": {"phase": "Succeeded"}},),
            "The pod wb/wb-1a2b3c4d-alice ended before the server started (Succeeded).",
        ),
    ],
)
async def test_a_pod_that_ends_while_pending_ends_the_spawn_at_once(store, states, words):
    clock = Clock()
    pod = Pod(clock, *states)
    with pytest.raises(EngineJobEndedError) as ended:
        await place(placement(store, clock), pod, timeout=30)
    assert str(ended.value) == words
    assert clock.now < 30
    assert store.leases() == []


async def test_a_pod_the_watch_never_shows_times_out_rather_than_ending(store):
    clock = Clock()
    with pytest.raises(NoGPUAvailableError, match="within 4 seconds \\(pending\\)") as failed:
        await place(placement(store, clock), Pod(clock, None), timeout=4)
    assert not isinstance(failed.value, EngineJobEndedError)


@pytest.mark.parametrize("job", [None, EngineJob("wb/x"), PodJob("")])
async def test_without_a_pod_there_is_nothing_to_place(store, job):
    with pytest.raises(NoGPUAvailableError, match="No pod was created"):
        await placement(store, Clock()).place("alice", "", 1, None, 5, job=job)


# -- once scheduled: the report, checked against the pod ----------------------------------------------------


@pytest.mark.parametrize(
    ("count", "report", "inventory", "words"),
    [
        (1, PodReport("n2", ("GPU-a",)), REAL, "it says it runs on 'n2', Kubernetes says 'n1'"),
        (1, PodReport("n1", ("GPU-a", "GPU-b")), REAL, "2 GPU(s) ['GPU-a', 'GPU-b'], but the pod asked for 1"),
        (2, PodReport("n1", ("GPU-a",)), REAL, "1 GPU(s) ['GPU-a'], but the pod asked for 2"),
        (2, PodReport("n1", ("GPU-a", "GPU-a")), REAL, "2 GPU(s) ['GPU-a', 'GPU-a'], but the pod asked for 2"),
        (1, PodReport("n1", (SIM_N2[0],)), SIM, f"{SIM_N2[0]} is not a GPU of n1"),
        (1, PodReport("n1", ("GPU-made-up",)), SIM, "GPU-made-up is not a GPU of n1"),
    ],
)
async def test_a_report_that_disagrees_with_the_pod_writes_no_lease(store, count, report, inventory, words):
    clock = Clock()
    pod = Pod(clock, scheduled("n1"), report=report)
    with pytest.raises(NoGPUAvailableError) as refused:
        await place(placement(store, clock, inventory), pod, count=count)
    assert str(refused.value) == (
        f"The pod wb/wb-1a2b3c4d-alice on n1 reported GPUs the hub cannot accept: {words}; the pod was deleted. "
        "Tell a hub admin."
    )
    assert store.leases() == []
    assert NodeUUIDs(store).known() == {}


async def test_a_simulated_pod_reporting_its_own_gpus_gets_them(store):
    clock = Clock()
    pod = Pod(clock, scheduled("n1"), report=PodReport("n1", tuple(SIM_N1)))
    lease = await place(placement(store, clock, SIM), pod, count=2)
    assert lease.gpu_uuids == tuple(SIM_N1)
    assert lease.node == "n1"
    assert NodeUUIDs(store).known() == {}  # simulated UUIDs are computed, never learned


@pytest.mark.parametrize(
    ("known", "report", "words"),
    [
        # every GPU of n1 has a name now: an unknown one is not n1's
        ({"n1": ["GPU-a", "GPU-b"]}, ("GPU-z",), "cannot accept: GPU-z is not a GPU of n1"),
        # n2's GPU reported on n1 (n1 still has a GPU without a name)
        ({"n2": ["GPU-c"]}, ("GPU-c",), "contradict what the hub knows: a pod on n1 reported GPU GPU-c, which the hub"),
        # a third name on a two-GPU node
        ({"n1": ["GPU-a"]}, ("GPU-x", "GPU-y"), "pods on n1 reported 3 different GPUs, but the node has 2"),
    ],
)
async def test_a_report_that_contradicts_what_the_hub_learned_writes_no_lease(store, known, report, words):
    for node, uuids in known.items():
        NodeUUIDs(store).accept(node, uuids, 2)
    clock = Clock()
    pod = Pod(clock, scheduled("n1"), report=PodReport("n1", report))
    with pytest.raises(NoGPUAvailableError, match=words):
        await place(placement(store, clock), pod, count=len(report))
    assert store.leases() == []
    assert NodeUUIDs(store).known() == known


async def test_gpus_leased_to_another_server_past_the_grace_write_no_second_lease(store):
    assert store.adopt("bob", "", ["GPU-b"], "k8s:wb/wb-1a2b3c4d-bob", node="n1")
    clock = Clock()
    pod = Pod(clock, scheduled("n1"), report=PodReport("n1", ("GPU-b",)))
    with pytest.raises(
        NoGPUAvailableError, match="GPU-b on n1, which the workbench ledger still shows as held by another"
    ):
        await place(placement(store, clock), pod)
    assert [(lease.user, lease.ref) for lease in store.leases()] == [("bob", "k8s:wb/wb-1a2b3c4d-bob")]
    assert any("waiting for its previous server to release it" in text for text in pod.said), pod.said
    assert clock.now >= 60, "it waited the release grace before giving up"


async def test_a_gpu_the_scheduler_gave_away_before_the_hub_released_it_goes_to_the_new_pod_once_released(store):
    """The scheduler frees a GPU when the old pod is gone; the old server's stop releases its lease a moment later."""
    assert store.adopt("bob", "", ["GPU-b"], "k8s:wb/wb-1a2b3c4d-bob", node="n1")
    clock = Clock()
    pod = Pod(clock, scheduled("n1"), report=PodReport("n1", ("GPU-b",)))
    pod.watch = lambda: store.release("bob", "", "stopped") if pod.looks == 5 else None
    lease = await place(placement(store, clock), pod)
    assert (lease.user, lease.gpu_uuids) == ("alice", ("GPU-b",))
    assert [lease.user for lease in store.leases()] == ["alice"]


async def test_a_cpu_only_pod_gets_no_lease_and_names_no_gpu(store):
    clock = Clock()
    pod = Pod(clock, scheduled("n1"), report=PodReport("n1", ("GPU-a",)))  # whatever it says
    assert await place(placement(store, clock), pod, count=0) is None
    assert store.leases() == []
    assert NodeUUIDs(store).known() == {}


@pytest.mark.parametrize(
    ("state", "words"),
    [
        (
            scheduled("n1", waiting="ErrImageNeverPull"),
            "The server's pod wb/wb-1a2b3c4d-alice on n1 cannot start: "
            "ErrImageNeverPull: the ErrImageNeverPull message.",
        ),
        (scheduled("n1", waiting="ImagePullBackOff"), "cannot start: ImagePullBackOff: the ImagePullBackOff message."),
        (scheduled("n1", waiting="CrashLoopBackOff"), "cannot start: CrashLoopBackOff: the CrashLoopBackOff message."),
        (
            scheduled("n1", terminated={"exitCode": 1, "reason": "Error"}),
            "cannot start: the container exited with code 1 (Error).",
        ),
        (None, "The server's pod wb/wb-1a2b3c4d-alice on n1 cannot start: the pod was deleted."),
    ],
)
async def test_a_pod_that_cannot_start_ends_the_spawn_with_kubernetes_reason(store, state, words):
    clock = Clock()
    pod = Pod(clock, scheduled("n1"), scheduled("n1", waiting="ContainerCreating"), state)  # never reports
    with pytest.raises(EngineJobEndedError, match=words.replace("(", r"\(").replace(")", r"\)")):
        await place(placement(store, clock), pod)
    assert clock.now < 5
    assert store.leases() == []


async def test_a_pod_that_never_reports_fails_after_the_report_timeout(store):
    clock = Clock()
    pod = Pod(clock, scheduled("n1", waiting="ContainerCreating"))
    with pytest.raises(NoGPUAvailableError) as failed:
        await place(placement(store, clock), pod, timeout=60)
    assert str(failed.value).startswith(
        "The server in pod wb/wb-1a2b3c4d-alice on n1 did not report its GPUs within 5 seconds; the pod was deleted."
    )
    assert "can the pod reach the hub's API?" in str(failed.value)
    assert 5 <= clock.now <= 8
    assert store.leases() == []


@pytest.mark.parametrize(
    ("data", "report"),
    [
        ({"node": "n1", "gpus": ["GPU-a"]}, PodReport("n1", ("GPU-a",))),
        ({"node": "n1", "gpus": []}, PodReport("n1", ())),
        (None, None),
        ({"node": "", "gpus": []}, None),
        ({"node": "n1"}, None),
        ({"node": "n1", "gpus": "GPU-a"}, None),
        ({"node": "n1", "gpus": [""]}, None),
        ({"node": 7, "gpus": []}, None),
    ],
)
def test_what_a_pod_reported_is_read_or_ignored(data, report):
    assert PodReport.from_json(data) == report


@pytest.mark.parametrize(
    ("events", "words"),
    [
        ([], ""),
        ([{"reason": "Scheduled", "message": "Successfully assigned"}], ""),
        (
            [
                {"reason": "FailedScheduling", "message": "0/2 nodes are available: 2 node(s) didn't match selector."},
                {"reason": "FailedScheduling", "message": INSUFFICIENT},
                {"reason": "Pulling", "message": "Pulling image"},
            ],
            INSUFFICIENT.rstrip("."),  # the latest reason
        ),
    ],
)
def test_the_schedulers_latest_words(events, words):
    assert scheduler_words(events) == words


def test_a_pod_starting_normally_has_no_trouble():
    assert container_trouble(scheduled("n1", waiting="ContainerCreating")) == ""
    assert container_trouble(scheduled("n1")) == ""
    assert container_trouble({}) == ""


# -- reservations: held back before a pod exists -------------------------------------------------------------


def reserve(store, group: str, gpus: int, window: str = "2026-12-08 10:00-12:00") -> None:
    ReservationBook(store).create(
        Reservation(group, gpus, parse_window(window), grace_minutes=15),
        {"H200-141GB": 4},
        datetime(2026, 12, 8, 9, 0, tzinfo=UTC),
        UTC,
    )


def ticking(clock: Clock, free: list[str]):
    def free_gpus(inventory: DeviceInventory) -> list[str]:
        clock.now += 1
        return list(free)

    return free_gpus


@pytest.mark.parametrize(
    ("reserved", "free", "why"),
    [
        (
            4,
            [d.uuid for d in REAL.devices],
            "4 free in the cluster, but 4 of 4 GPUs reserved for ml-course until 12:00",
        ),
        (2, [], "0 free in the cluster, but 2 of 4 GPUs reserved for ml-course until 12:00"),
    ],
)
async def test_a_non_member_waits_while_no_unreserved_gpu_is_free_then_gives_up(store, reserved, free, why):
    reserve(store, "ml-course", reserved)
    clock = Clock()
    here = placement(store, clock, free=ticking(clock, free))
    said: list[str] = []
    with pytest.raises(NoGPUAvailableError) as failed:
        await here.admit_to_queue("alice/", 1, None, ["other"], deadline=3, describe=said.append)
    assert said == [f"Waiting for 1 GPU outside reserved ones: {why}"]  # said once, not every look
    assert str(failed.value) == (
        f"No 1 GPU outside reserved ones came free in time ({why}); no pod was created. Try again later, ask for "
        "fewer GPUs, or start a CPU-only server (0 GPUs)."
    )
    assert clock.now == 3
    assert here.reservations.asking == {}


async def test_a_member_and_a_cpu_only_server_are_admitted_at_once_and_counted_until_scheduled(store):
    reserve(store, "ml-course", 4)
    clock = Clock()
    here = placement(store, clock, free=ticking(clock, [d.uuid for d in REAL.devices]))
    await here.admit_to_queue("stud/", 2, None, ["ml-course"], deadline=0)
    await here.admit_to_queue("alice/", 0, None, ["other"], deadline=0)
    assert here.reservations.asking["stud/"] == (frozenset({"ml-course"}), 2, None)
    assert here.waiting_by_group() == {"ml-course": 2, "other": 0}
    # Once the pod exists, it counts under its own name while it is pending; then nothing is left.
    seen: list[dict[str, int]] = []
    pod = Pod(clock, pending(), pending(), scheduled("n1"), report=PodReport("n1", ("GPU-a", "GPU-b")), name="stud")
    pod.watch = lambda: seen.append(here.waiting_by_group())
    job = pod.job()
    here.withdraw("alice/")
    lease = await here.place("stud", "", 2, None, 30, groups=["ml-course"], job=replace(job, admitted="stud/"))
    assert seen[0] == {"ml-course": 2}
    assert set(here.reservations.asking) == set()
    assert lease.groups == ("ml-course",)


async def test_an_unanswering_api_is_waited_for_and_named(store):
    reserve(store, "ml-course", 2)
    clock = Clock()

    def down(inventory):
        clock.now += 1
        raise KubernetesUnavailableError("the API server did not answer (timeout)")

    said: list[str] = []
    with pytest.raises(NoGPUAvailableError, match="the Kubernetes API did not answer"):
        await placement(store, clock, free=down).admit_to_queue(
            "alice/", 1, None, ["other"], deadline=2, describe=said.append
        )
    assert said == [
        "Waiting for 1 GPU outside reserved ones: the Kubernetes API did not answer "
        "(the API server did not answer (timeout))"
    ]


async def test_with_enough_free_gpus_beside_the_reservation_a_non_member_goes_at_once(store):
    reserve(store, "ml-course", 2)
    clock = Clock()
    here = placement(store, clock, free=ticking(clock, [d.uuid for d in REAL.devices]))
    await here.admit_to_queue("alice/", 2, None, ["other"], deadline=0)
    assert "alice/" in here.reservations.asking
    # A second non-member must wait: alice's two admitted GPUs and the two kept leave nothing.
    with pytest.raises(NoGPUAvailableError, match="2 free in the cluster, but 2 of 4 GPUs reserved for ml-course"):
        await here.admit_to_queue("bob/", 1, None, ["other"], deadline=2)
    here.withdraw("alice/")  # alice's pod could not be created after all
    await here.admit_to_queue("bob/", 1, None, ["other"], deadline=clock.now)
    assert set(here.reservations.asking) == {"bob/"}
