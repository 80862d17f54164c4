"""Every way a server ends has a sentence: the engines' facts mapped to endings, table by table.

One table per backend (Docker's ``docker inspect``, a pod's status and its node, Slurm's final job line),
then the policy's rule for telling the student: the service's announcement stands, every other end posts
its own notice once, a failed start posts none, and the ledger row keeps the sentence.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from sqlalchemy import select

from workbench_devices import DeviceInventory, parse_simulated_spec
from workbench_spawner.backends.docker.ending import container_ending
from workbench_spawner.backends.kubernetes.cluster import NodeState, quantity, ready_condition_text
from workbench_spawner.backends.kubernetes.ending import pod_ending
from workbench_spawner.backends.slurm.ending import job_ending
from workbench_spawner.ledger import endings, reasons
from workbench_spawner.ledger.endings import Ending, gib, log_tail
from workbench_spawner.ledger.notices import NoticeBook
from workbench_spawner.ledger.store import AllocationStore, UsageRow
from workbench_spawner.mixin import GPUSpawnerMixin
from workbench_spawner.policy.gpu_policy import GPUPolicy
from workbench_spawner.policy.settings import PolicySettings
from workbench_spawner.rules.profiles import parse_profiles

GiB = 1 << 30


# -- the sentences ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ending", "reason", "ledger", "words"),
    [
        (endings.stopped_by_user(), reasons.STOPPED_BY_USER, "stopped by the user", "You stopped this server."),
        (endings.stopped_by_admin("prof"), reasons.STOPPED_BY_ADMIN, "stopped by an admin: prof", "An admin (prof)"),
        (endings.stopped_by_admin(), reasons.STOPPED_BY_ADMIN, "stopped by an admin", "An admin stopped"),
        (endings.stopped_by_culler(3600), reasons.STOPPED_BY_CULLER, "stopped by the idle culler: 60 minutes",
         "after 60 minutes without activity"),
        (endings.stopped_by_service("backup"), reasons.STOPPED_BY_SERVICE, "stopped by a service: backup", "backup"),
        (endings.stopped_by_hub(), reasons.STOPPED, "stopped", "shutting down or restarting"),
        (endings.server_exited(1), reasons.SERVER_EXITED, "server exited: exit code 1", "exit code 1"),
        (endings.server_exited(-9), reasons.SERVER_EXITED, "server exited: killed by SIGKILL, exit code -9",
         "This server exited on its own (killed by SIGKILL, exit code -9)."),
        (endings.server_exited(), reasons.SERVER_EXITED, "server exited", "This server exited on its own."),
        (endings.server_exited_after_restart(), reasons.SERVER_EXITED, "server exited: exit code unknown",
         "This server's process ended. The hub re-attached to it after a restart, so its exit code is unknown."),
        (endings.gpus_leased_elsewhere(["GPU-1"]), reasons.STOPPED, "stopped: GPUs leased to another server",
         "The hub stopped this server after a restart: its GPUs (GPU-1) are leased to another server now."),
        (endings.stopped_by_hub(admin="ada"), reasons.STOPPED_BY_ADMIN, "stopped by an admin: ada, hub shutdown",
         "An admin (ada) shut the hub down and stopped its servers."),
        (endings.stopped_by_hub(service="ops"), reasons.STOPPED_BY_SERVICE, "stopped by a service: ops, hub shutdown",
         "The hub service ops shut the hub down and stopped its servers."),
        (endings.out_of_memory(16 * GiB), reasons.OUT_OF_MEMORY, "out of memory: 16 GiB limit",
         "ran out of memory: it reached its limit of 16 GiB"),
        (endings.node_failed("wbnode1", "Not responding", "Slurm"), reasons.NODE_FAILED, "node failed: wbnode1",
         "The node wbnode1 this server ran on failed (Slurm: Not responding)."),
        (endings.pod_deleted(), reasons.POD_DELETED, "pod deleted outside the hub", "deleted outside the hub"),
        (endings.evicted("The node was low on resource: memory."), reasons.EVICTED,
         "evicted: The node was low on resource: memory.", "Kubernetes evicted this server: The node was low"),
        (endings.job_cancelled("42"), reasons.JOB_CANCELLED, "job cancelled outside the hub: 42",
         "The Slurm job 42 running this server was cancelled outside the hub."),
        (endings.job_timed_out("42", "1:00:00"), reasons.JOB_TIMED_OUT, "job time limit reached: 42",
         "reached its time limit (1:00:00)"),
        (endings.layout_changed(), reasons.LAYOUT_CHANGED, "MIG layout changed", "MIG layout changed"),
    ],
)  # fmt: skip
def test_each_end_has_a_ledger_reason_and_a_sentence(ending, reason, ledger, words):
    assert ending.reason == reason
    assert ending.ledger_reason == ledger
    assert words in ending.message
    assert ending.message.endswith(".")
    assert len(ending.kind) <= 32
    assert ending.kind.startswith("end:")
    assert reasons.reason_kind(ending.ledger_reason) == reason  # usage reports group it under its reason


@pytest.mark.parametrize(
    ("value", "text"), [(16 * GiB, "16 GiB"), (GiB + GiB // 2, "1.5 GiB"), (512 << 20, "512 MiB"), (1, "1 MiB")]
)
def test_memory_reads_as_a_person_writes_it(value, text):
    assert gib(value) == text


def test_a_log_tail_keeps_the_last_lines_and_hides_tokens():
    log = "\n".join(f"line {i}" for i in range(20)) + "\n\nhttp://127.0.0.1:8888/lab?token=abc123secret\n"
    log += "JUPYTERHUB_API_TOKEN=deadbeef crashed\n" + "x" * 500
    tail = log_tail(log)
    lines = tail.splitlines()
    assert len(lines) == 8
    assert lines[0] == "line 15"
    assert "abc123secret" not in tail
    assert "deadbeef" not in tail
    assert "token=[hidden]" in tail
    assert max(len(line) for line in lines) <= 200


def test_a_server_that_exited_shows_the_last_lines_of_its_log():
    ending = endings.server_exited(1, "starting\nTraceback (most recent call last):\nImportError: no module x\n")
    assert ending.hint.startswith("The last lines of its log:\n")
    assert "ImportError: no module x" in ending.hint
    assert endings.server_exited(None).message == "This server exited on its own."


# -- Docker ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("inspected", "log", "reason", "words"),
    [
        ({"State": {"OOMKilled": True, "ExitCode": 137}, "HostConfig": {"Memory": 256 << 20}}, b"",
         reasons.OUT_OF_MEMORY, "reached its limit of 256 MiB"),
        ({"State": {"OOMKilled": True, "ExitCode": 137}, "HostConfig": {"Memory": 0}}, b"",
         reasons.OUT_OF_MEMORY, "ran out of memory."),
        ({"State": {"OOMKilled": False, "ExitCode": 1}}, b"boom\nValueError: bad config\n",
         reasons.SERVER_EXITED, "(exit code 1)"),
        ({"State": {"OOMKilled": False, "ExitCode": 137}}, b"", reasons.SERVER_EXITED,
         "(killed by SIGKILL, exit code 137)"),
        ({}, b"", reasons.SERVER_EXITED, "exited on its own."),
    ],
)  # fmt: skip
def test_docker_facts_map_to_endings(inspected, log, reason, words):
    ending = container_ending(inspected, log)
    assert ending.reason == reason
    assert words in ending.message
    if log:
        assert "ValueError: bad config" in ending.hint


# -- Kubernetes --------------------------------------------------------------------------------------


def pod(phase="Running", reason="", message="", terminated=None, deleting=False, node="node-a", limit="268435456"):
    status = {"phase": phase, "reason": reason, "message": message}
    if terminated:
        status["containerStatuses"] = [{"name": "notebook", "state": {"terminated": terminated}}]
    return {
        "metadata": {"name": "jupyter-ann", **({"deletionTimestamp": "2026-12-06T10:00:00Z"} if deleting else {})},
        "spec": {"nodeName": node, "containers": [{"name": "notebook", "resources": {"limits": {"memory": limit}}}]},
        "status": status,
    }


@pytest.mark.parametrize(
    ("last_seen", "gone", "node", "condition", "reason", "words"),
    [
        (pod("Failed", terminated={"reason": "OOMKilled", "exitCode": 137}), False, NodeState.READY, "",
         reasons.OUT_OF_MEMORY, "reached its limit of 256 MiB"),
        (pod("Failed", "Evicted", "The node was low on resource: memory."), False, NodeState.READY, "",
         reasons.EVICTED, "Kubernetes evicted this server: The node was low on resource: memory"),
        (pod(deleting=True), False, NodeState.NOT_READY, "Ready=Unknown: Kubelet stopped posting node status.",
         reasons.NODE_FAILED, "The node node-a this server ran on failed (Kubernetes: Ready=Unknown: Kubelet"),
        (pod(), True, NodeState.GONE, "the node is gone from the cluster", reasons.NODE_FAILED,
         "node-a this server ran on failed"),
        (pod(), True, NodeState.READY, "", reasons.POD_DELETED, "deleted outside the hub"),
        (pod("Failed", terminated={"reason": "Error", "exitCode": 2}), False, NodeState.UNKNOWN, "",
         reasons.SERVER_EXITED, "(exit code 2)"),
    ],
)  # fmt: skip
def test_kubernetes_facts_map_to_endings(last_seen, gone, node, condition, reason, words):
    ending = pod_ending(last_seen, gone, node, condition)
    assert ending is not None
    assert ending.reason == reason
    assert words in ending.message


def test_a_running_pod_that_says_nothing_has_no_ending_of_its_own():
    assert pod_ending(pod(), False, NodeState.READY) is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [("268435456", 256 << 20), ("16Gi", 16 * GiB), ("512M", 512 * 10**6), ("1.5Gi", GiB + GiB // 2), ("", None),
     ("lots", None), (None, None)],
)  # fmt: skip
def test_memory_quantities(value, expected):
    assert quantity(value) == expected


def test_a_not_ready_node_is_described_by_its_ready_condition():
    node = {"status": {"conditions": [{"type": "Ready", "status": "Unknown", "message": "Kubelet stopped posting."}]}}
    assert ready_condition_text(node) == "Ready=Unknown: Kubelet stopped posting."
    assert ready_condition_text({"status": {}}) == "no Ready condition"


# -- Slurm -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "hub_cancelled", "reason", "words"),
    [
        ("NODE_FAIL 1:00:00 wbnode1", False, reasons.NODE_FAILED,
         "The node wbnode1 this server ran on failed (Slurm: down, not responding (Not responding))."),
        ("BOOT_FAIL 1:00:00 wbnode1", False, reasons.NODE_FAILED, "wbnode1"),
        ("OUT_OF_MEMORY 1:00:00 wbnode1", False, reasons.OUT_OF_MEMORY, "ran out of memory"),
        ("PREEMPTED 1:00:00 wbnode1", False, reasons.EVICTED, "Slurm evicted this server"),
        ("CANCELLED 1:00:00 wbnode1", False, reasons.JOB_CANCELLED, "The Slurm job 42 running this server was "
         "cancelled outside the hub."),
        ("CANCELLED 1:00:00 wbnode1", True, reasons.STOPPED, "The hub stopped this server"),
        ("TIMEOUT 1:00:00 wbnode1", False, reasons.JOB_TIMED_OUT, "reached its time limit (1:00:00)"),
        ("TIMEOUT UNLIMITED wbnode1", False, reasons.JOB_TIMED_OUT, "reached its time limit."),
        ("FAILED 1:00:00 wbnode1", False, reasons.SERVER_EXITED, "The Slurm job 42 running this server failed."),
        ("COMPLETED 1:00:00 wbnode1", False, reasons.SERVER_EXITED, "exited on its own (exit code 0)"),
        ("REQUEUED 1:00:00 n/a", False, reasons.SERVER_EXITED, "was requeued"),
        ("NODE_FAIL", False, reasons.NODE_FAILED, "The node this server ran on failed."),
    ],
)  # fmt: skip
def test_slurm_facts_map_to_endings(status, hub_cancelled, reason, words):
    def down(node):
        return "down, not responding (Not responding)" if node == "wbnode1" else ""

    ending = job_ending("42", status, hub_cancelled, down)
    assert ending is not None
    assert ending.reason == reason
    assert words in ending.message


def test_a_slurm_line_that_says_nothing_has_no_ending():
    assert job_ending("42", "") is None
    assert job_ending("42", "RUNNING 1:00:00 wbnode1") is None


# -- telling the student: the policy ------------------------------------------------------------------

T0 = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)


@pytest.fixture
def policy(tmp_path):
    url = f"sqlite:///{tmp_path / 'gpu.sqlite'}"
    settings = PolicySettings(url, DeviceInventory("simulated", parse_simulated_spec("2"), "test"), node="node-a")
    return GPUPolicy(settings, AllocationStore(url))


def lease(policy: GPUPolicy, user: str):
    return policy.store.allocate(user, "", 1, [d.uuid for d in policy.inventory.devices])


def rows(store: AllocationStore) -> list[UsageRow]:
    with store.reads()() as session:
        return list(session.scalars(select(UsageRow).order_by(UsageRow.id)))


def test_an_end_is_kept_in_the_ledger_and_told_once(policy):
    lease(policy, "ann")
    policy.end_server("ann", "", endings.node_failed("wbnode1", "Not responding", "Slurm"))
    # The poll that saw it too, with less to say: the first sentence stands.
    policy.end_server("ann", "", endings.server_exited(1), started=T0 - timedelta(hours=1))
    (row,) = rows(policy.store)
    assert row.reason == "node failed: wbnode1"
    assert row.message.startswith("The node wbnode1 this server ran on failed")
    told = NoticeBook(policy.store).last_done("ann", "")
    assert told is not None
    assert told.message == row.message
    assert told.kind == "end:node-failed"


def test_the_services_announcement_stands_over_the_spawners_own_reason(policy):
    lease(policy, "ben")
    NoticeBook(policy.store).done(
        "ben", "", kind="idle", message="Your server was stopped: idle GPU reclaimed after 30 minutes.",
        reason="reclaimed: GPU idle 30 min",
    )  # fmt: skip
    policy.end_server("ben", "", endings.stopped_by_service("workbench"))
    (row,) = rows(policy.store)
    assert row.reason == "reclaimed: GPU idle 30 min"
    assert "idle GPU reclaimed after 30 minutes" in row.message
    assert NoticeBook(policy.store).last_done("ben", "").kind == "idle"


def test_a_cpu_only_server_is_told_why_it_ended_without_a_lease(policy):
    policy.end_server("cat", "", endings.out_of_memory(2 * GiB), started=T0)
    told = NoticeBook(policy.store).last_done("cat", "")
    assert told is not None
    assert "reached its limit of 2 GiB" in told.message
    assert rows(policy.store) == []  # no GPU, no ledger row


@pytest.mark.parametrize("reason", [reasons.START_FAILED, reasons.START_CANCELLED, reasons.REPLACED])
def test_a_failed_or_replaced_start_posts_no_stop_box(policy, reason):
    lease(policy, "dan")
    policy.end_server("dan", "", Ending(reason, "ignored"))
    assert rows(policy.store)[0].reason == reason
    assert NoticeBook(policy.store).last_done("dan", "") is None


def test_the_reconciler_ends_only_the_lease_it_read(policy):
    first = lease(policy, "eve")
    policy.end_server("eve", "", endings.pod_deleted(), since=first.since - timedelta(seconds=5))
    assert policy.store.lease_of("eve", "") is not None  # another lease than the one read: left alone
    policy.end_server("eve", "", endings.pod_deleted(), since=first.since)
    assert policy.store.lease_of("eve", "") is None
    assert rows(policy.store)[0].reason == reasons.POD_DELETED


# -- out of memory names the profile that offers more ------------------------------------------------


@pytest.mark.parametrize(
    ("limit", "mem_limit", "offer"),
    [
        (8 * GiB, None, "start with the profile Large (32 GiB of memory)"),
        (None, 8 * GiB, "start with the profile Large (32 GiB of memory)"),
        (32 * GiB, None, None),
        (2 * GiB, None, "start with the profile Small (8 GiB of memory)"),
    ],
)
def test_out_of_memory_names_the_limit_and_the_profile_that_offers_more(limit, mem_limit, offer):
    profiles = parse_profiles(
        [
            {"slug": "small", "display_name": "Small", "mem_limit": "8G"},
            {"slug": "large", "display_name": "Large", "mem_limit": "32G"},
        ]
    )
    spawner = SimpleNamespace(mem_limit=mem_limit, gpu_profiles=profiles)
    ending = GPUSpawnerMixin.with_larger_profile(spawner, endings.out_of_memory(limit))
    shown = limit or mem_limit
    assert f"reached its limit of {gib(shown)}" in ending.message
    if offer:
        assert offer in ending.hint
    else:
        assert ending.hint == "Load less data at once, or choose a profile with more memory."
