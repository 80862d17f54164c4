"""Table tests for the Slurm backend's rules: parsing Slurm's records, the sbatch mapping, the progress words."""

from __future__ import annotations

import json

import pytest
from traitlets.config import Config

from workbench_hub.configurer import ConfigError
from workbench_spawner.backends.slurm.config import update_slurm
from workbench_spawner.backends.slurm.inventory import cluster_inventory
from workbench_spawner.backends.slurm.job_states import is_hopeless, pending_message, queue_position
from workbench_spawner.backends.slurm.node_report import NodeReport
from workbench_spawner.backends.slurm.records import (
    SlurmJob,
    SlurmNode,
    expand_ranges,
    parse_gres,
    parse_index_list,
    parse_sinfo_json,
    parse_squeue_json,
)
from workbench_spawner.backends.slurm.sbatch import gres_for, sbatch_failure, sbatch_options, time_limit
from workbench_spawner.backends.slurm.tags import job_tag, parse_tag, parse_tag_with_hub


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", [0]),
        ("0-1", [0, 1]),
        ("0-1,3", [0, 1, 3]),
        ("N/A", []),
        ("", []),
        ("2,5-6", [2, 5, 6]),
    ],
)
def test_index_lists(text, expected):
    assert parse_index_list(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3", ["3"]),
        ("0-2,7", ["0", "1", "2", "7"]),
        ("01-03,07", ["01", "02", "03", "07"]),  # node names keep their zero padding
        ("08-10", ["08", "09", "10"]),
        ("a,b", ["a", "b"]),
    ],
)
def test_slurm_range_lists(text, expected):
    assert expand_ranges(text) == expected


@pytest.mark.parametrize(
    ("gres", "expected"),
    [
        ("gpu:h100-80gb:2", [("h100-80gb", 2, [])]),
        ("gpu:h100-80gb:2(IDX:0-1)", [("h100-80gb", 2, [0, 1])]),
        ("gpu:h100-80gb:0(IDX:N/A)", [("h100-80gb", 0, [])]),
        ("gpu:2", [("", 2, [])]),
        ("gpu:a100:1(IDX:3),shard:a100:4", [("a100", 1, [3])]),
        (["gpu:h100-80gb:1(IDX:1)"], [("h100-80gb", 1, [1])]),
        ("(null)", []),
    ],
)
def test_gres_strings(gres, expected):
    assert parse_gres(gres) == expected


@pytest.mark.parametrize(
    ("user", "server"),
    [("alice", ""), ("bob", "train"), ("a/b c", "x/y"), ("é", ""), ("abcdef12:x", "y:z"), ("0a1b2c3d", "")],
)
@pytest.mark.parametrize("hub", ["", "0a1b2c3d"])
def test_the_tag_round_trips_any_name(user, server, hub):
    assert parse_tag(job_tag(user, server, hub)) == (user, server)
    assert parse_tag_with_hub(job_tag(user, server, hub)) == (hub, user, server)


@pytest.mark.parametrize(
    ("comment", "ours"),
    [
        ("workbench:0a1b2c3d:alice/", True),  # this hub's
        ("workbench:alice/", True),  # a tag from before hub ids: every hub's
        ("workbench:ffff0000:alice/", False),  # another hub's on the same cluster
        ("", False),
        ("something", False),
    ],
)
def test_a_job_belongs_to_the_hub_that_tagged_it(comment, ours):
    assert SlurmJob("1", "RUNNING", comment=comment).belongs_to("0a1b2c3d") is ours


@pytest.mark.parametrize(
    "comment",
    ["", None, "something else", "workbench:", "workbench:/x", "workbench:0a1b2c3d:", "workbench:0a1b2c3d:/x"],
)
def test_jobs_without_our_tag_are_not_ours(comment):
    assert parse_tag(comment) is None


@pytest.mark.parametrize(
    ("reason", "hopeless"),
    [
        ("PartitionConfig", True),
        ("InvalidQOS", True),
        ("QOSMaxWallDurationPerJobLimit", True),
        ("Resources", False),
        ("Priority", False),
        # A drained or rebooting node comes back: wait for it rather than cancel.
        ("ReqNodeNotAvail, UnavailableNodes:wbnode2", False),
    ],
)
def test_only_reasons_no_wait_can_fix_cancel_at_once(reason, hopeless):
    assert is_hopeless(reason) is hopeless


@pytest.mark.parametrize(
    ("stderr", "status", "words"),
    [
        (
            "sbatch: error: Batch job submission failed: Invalid partition name specified",
            400,
            "Slurm refused the job: sbatch: error: Batch job submission failed: Invalid partition name specified.",
        ),
        (
            "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)",
            503,
            "Slurm's controller did not answer, so no job was submitted",
        ),
        ("sbatch: error: slurm_receive_msg: Socket timed out on send/recv operation", 503, "did not answer"),
        ("", 400, "Slurm refused the job: no message."),
    ],
)
def test_a_failed_sbatch_says_whose_fault_it_is(stderr, status, words):
    got_status, message = sbatch_failure(stderr)
    assert got_status == status
    assert words in message
    assert message.endswith(".")


SQUEUE = json.dumps(
    {
        "jobs": [
            {
                "job_id": 7,
                "job_state": "RUNNING",
                "state_reason": "None",
                "batch_host": "wbnode2",
                "nodes": "wbnode2",
                "user_name": "alice",
                "comment": "workbench:alice/",
                "gres_detail": ["gpu:h100-80gb:1(IDX:1)"],
                "tres_per_node": "gres:gpu:h100-80gb:1",
                "priority": 10,
                "submit_time": 100,
                "partition": "gpu",
                "start_time": 160,
            },
            {
                "job_id": 8,
                "job_state": "PENDING",
                "state_reason": "Resources",
                "batch_host": "",
                "nodes": "",
                "user_name": "bob",
                "comment": "",
                "gres_detail": [],
                "tres_per_node": "gres:gpu:2",
                "priority": 10,
                "submit_time": 101,
                "partition": "gpu",
            },
            {
                "job_id": 9,
                "job_state": "PENDING",
                "state_reason": "Priority",
                "user_name": "carol",
                "comment": "workbench:carol/",
                "gres_detail": [],
                "tres_per_node": "gres:gpu:1",
                "priority": 10,
                "submit_time": 102,
                "partition": "gpu",
            },
        ]
    }
)


def test_squeue_json_gives_node_indices_and_tag():
    jobs = parse_squeue_json(SQUEUE)
    assert jobs[0] == SlurmJob(
        "7", "RUNNING", "None", "wbnode2", "alice", "workbench:alice/", (1,), 1, 10, 100, "gpu", start_time=160
    )
    assert jobs[0].running
    assert jobs[0].tag == ("alice", "")
    assert jobs[1].pending
    assert jobs[1].gpus_requested == 2
    assert jobs[1].tag is None
    # Position: same priority, earlier submit is ahead; the running job is not in line.
    assert queue_position(jobs, "9") == 1
    assert queue_position(jobs, "8") == 0


def test_sinfo_json_gives_gres_and_used_indices():
    nodes = parse_sinfo_json(
        json.dumps(
            {
                "nodes": [
                    {
                        "name": "wbnode2",
                        "address": "10.77.0.2",
                        "state": "mixed",
                        "state_flags": [],
                        "gres": "gpu:h100-80gb:2",
                        "gres_used": "gpu:h100-80gb:1(IDX:1)",
                        "partitions": ["gpu"],
                    },
                    {
                        "name": "wbnode1",
                        "address": "10.77.0.1",
                        "state": "idle",
                        "state_flags": ["DRAIN"],
                        "gres": "gpu:h100-80gb:2",
                        "gres_used": "gpu:h100-80gb:0(IDX:N/A)",
                        "partitions": ["gpu", "debug"],
                    },
                ]
            }
        )
    )
    assert [n.name for n in nodes] == ["wbnode1", "wbnode2"]
    assert nodes[1] == SlurmNode(
        "wbnode2", "10.77.0.2", "MIXED", "h100-80gb", 2, (1,), ("gpu",), gres=(("h100-80gb", 2),)
    )
    assert not nodes[0].usable
    assert nodes[1].usable


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        (dict(gpus=1), ["--gres=gpu:1"]),
        (dict(gpus=2, model="H100-80GB"), ["--gres=gpu:h100-80gb:2"]),
        (dict(gpus=0, cpus=2.5, mem_bytes=8 * 1024**3), ["--cpus-per-task=3", "--mem=8192M"]),
        (dict(gpus=1, session_hours=1.5), ["--gres=gpu:1", "--time=0-01:30:00"]),
        (
            dict(gpus=1, partition="gpu", account="cs101", qos="students"),
            ["--gres=gpu:1", "--partition=gpu", "--account=cs101", "--qos=students"],
        ),
        (dict(gpus=0, extra="--constraint=ib --exclude='n1,n2'"), ["--constraint=ib", "--exclude=n1,n2"]),
    ],
)
def test_sbatch_options(kwargs, expected):
    opts = sbatch_options(user="al ice", server="s", hub="0a1b2c3d", **kwargs)
    # Tagged with the hub's id; never requeued onto another node behind the hub's back.
    assert opts[:3] == ["--job-name=wb-al_ice", "--comment=workbench:0a1b2c3d:al%20ice/s", "--no-requeue"]
    assert opts[3:] == expected


@pytest.mark.parametrize(("hours", "expected"), [(None, None), (0, None), (0.001, "0-00:01:00"), (25, "1-01:00:00")])
def test_session_hours_become_a_time_limit(hours, expected):
    assert time_limit(hours) == expected


def test_no_gpus_means_no_gres():
    assert gres_for(0, "H100-80GB") is None


@pytest.mark.parametrize(
    ("reason", "ahead", "text"),
    [
        ("Resources", 0, "Waiting for 1 GPU: all 4 GPUs that fit are in use (Slurm: Resources), next in line"),
        ("Resources", 3, "Waiting for 1 GPU: all 4 GPUs that fit are in use (Slurm: Resources), 3 jobs ahead"),
        ("Priority", 1, "Waiting for 1 GPU: jobs with higher priority are ahead (Slurm: Priority), 1 job ahead"),
        ("QOSMaxGRESPerUser", 0, "your Slurm QOS allows no more GPUs at once (Slurm: QOSMaxGRESPerUser)"),
        ("SomethingNew", 0, "Slurm keeps it pending (Slurm: SomethingNew)"),
    ],
)
def test_pending_words(reason, ahead, text):
    job = SlurmJob("1", "PENDING", reason)
    assert text in pending_message(job, ahead, 4, "1 GPU")


def test_a_report_maps_slurm_indices_to_uuids():
    report = NodeReport.from_json(
        {"node": "n2", "gpus": [{"index": 0, "uuid": "A"}, {"index": 1, "uuid": "B"}], "job_gpus": ["B"]}
    )
    assert report.uuids_for([1]) == ["B"]
    assert report.uuids_for([2]) is None
    assert NodeReport.from_json({"gpus": []}) is None


def test_cluster_inventory_has_distinct_uuids_per_node():
    nodes = [SlurmNode("wbnode1", "a", "IDLE", "h100-80gb", 2), SlurmNode("wbnode2", "b", "IDLE", "h100-80gb", 2)]
    inv = cluster_inventory(nodes, "2xH100-80GB")
    assert [(d.node, d.index, d.uuid) for d in inv.devices] == [
        ("wbnode1", 0, "GPU-sim-wbnode1-00-h100-80gb"),
        ("wbnode1", 1, "GPU-sim-wbnode1-01-h100-80gb"),
        ("wbnode2", 0, "GPU-sim-wbnode2-00-h100-80gb"),
        ("wbnode2", 1, "GPU-sim-wbnode2-01-h100-80gb"),
    ]
    assert inv.source == "simulated"
    assert "simulated" in inv.message
    real = cluster_inventory(nodes[:1], "")
    assert [d.uuid for d in real.devices] == ["SLURM-wbnode1-gpu0", "SLURM-wbnode1-gpu1"]
    assert real.devices[0].model == "H100-80GB"


def test_configurer_slurm_table(tmp_path):
    c = Config()
    update_slurm(
        c,
        {
            "WORKBENCH_SLURM_PARTITION": "gpu",
            "WORKBENCH_SLURM_ACCOUNT": "cs101",
            "WORKBENCH_SLURM_QOS": "students",
            "WORKBENCH_SLURM_EXTRA_OPTIONS": "--constraint=ib",
            "WORKBENCH_SLURM_ENV": "/shared/wb-env",
            "WORKBENCH_HUB_CONNECT_IP": "head01",
            "WORKBENCH_SLURM_POLL_SECONDS": "5",
            "WORKBENCH_SLURM_PARTITIONS": "gpu, debug",
            "WORKBENCH_SLURM_MIN_UID": "500",
        },
        tmp_path,
    )
    assert c.JupyterHub.spawner_class == "gpu-slurm"
    assert c.JupyterHub.hub_ip == "0.0.0.0"
    assert c.JupyterHub.hub_connect_ip == "head01"
    s = c.SlurmGPUSpawner
    assert (s.slurm_partition, s.slurm_account, s.slurm_qos, s.slurm_extra_options) == (
        "gpu",
        "cs101",
        "students",
        "--constraint=ib",
    )
    assert s.slurm_env_prefix == "/shared/wb-env"
    assert c.Spawner.cmd == ["/shared/wb-env/bin/jupyterhub-singleuser"]
    assert c.Spawner.poll_interval == 5
    assert s.slurm_partitions == ["gpu", "debug"]
    assert s.slurm_min_uid == 500


def test_unreadable_extra_options_are_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="WORKBENCH_SLURM_EXTRA_OPTIONS cannot be read"):
        update_slurm(Config(), {"WORKBENCH_SLURM_EXTRA_OPTIONS": "--x='unclosed"}, tmp_path)


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"WORKBENCH_SLURM_MIN_UID": "-1"}, "WORKBENCH_SLURM_MIN_UID must be a non-negative whole number"),
        ({"WORKBENCH_SLURM_MIN_UID": "root"}, "WORKBENCH_SLURM_MIN_UID must be a non-negative whole number"),
    ],
)
def test_a_bad_minimum_uid_is_a_config_error(tmp_path, env, words):
    with pytest.raises(ConfigError, match=words):
        update_slurm(Config(), env, tmp_path)
