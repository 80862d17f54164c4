"""MIG slices through the real hub and proxy on the local backend: seven students on one simulated H200."""

from __future__ import annotations

import pytest

from tests.conftest import process_env

pytestmark = pytest.mark.integration

H200_SLICES = "1xH200-141GB:mig=7x1g.18gb"
SLICE_UUIDS = [f"MIG-sim-00-h200-141gb-{i}-1g.18gb" for i in range(7)]


def pinned(hub, user: str) -> dict[str, str]:
    env = process_env(int(hub.server(user)["state"]["pid"]))
    return {key: env.get(key, "") for key in ("WORKBENCH_GPUS", "CUDA_VISIBLE_DEVICES")}


def test_seven_students_get_seven_slices_and_an_eighth_gets_the_first_freed(running_hub):
    hub = running_hub(
        {"WORKBENCH_SIMULATED_GPUS": H200_SLICES, "WORKBENCH_QUEUE_TIMEOUT": "120"},
        ["--GPUSpawnerMixin.gpu_queue_recheck_interval=0.5"],
    )
    students = [f"s{i}" for i in range(8)]
    hub.create_users(*students)
    for i, user in enumerate(students[:7]):
        # Half name the profile; on a hub of slices only, the others get one all the same.
        options = {"gpus": 1, "gpu_profile": "1g.18gb"} if i % 2 else {"gpus": 1}
        assert hub.spawn(user, **options).status_code in (201, 202)
    for user in students[:7]:
        hub.wait_ready(user, 180)
    envs = {user: pinned(hub, user) for user in students[:7]}
    got = [envs[user]["WORKBENCH_GPUS"] for user in students[:7]]
    assert sorted(got) == SLICE_UUIDS, "seven distinct slices, one each"
    assert all(env["CUDA_VISIBLE_DEVICES"] == env["WORKBENCH_GPUS"] for env in envs.values()), envs

    # api/gpus lists each slice with its profile and parent, and who holds it.
    gpus = hub.service("GET", "api/gpus").json()
    rows = gpus["gpus"] if isinstance(gpus, dict) else gpus
    assert [(r["uuid"], r["profile"], r["parent_uuid"], r["mig"]) for r in rows] == [
        (uuid, "1g.18gb", "GPU-sim-00-h200-141gb", True) for uuid in SLICE_UUIDS
    ]
    assert all(len(r["holders"]) == 1 and r["share"] == round(1 / 7, 4) for r in rows)

    # The eighth waits in line, then gets exactly the slice that was given back.
    assert hub.spawn("s7", gpus=1, gpu_profile="1g.18gb").status_code == 202
    waiting = hub.progress_messages("s7", until="next in line")[-1]
    assert "Waiting for 1 1g.18gb slice to become free (you are next in line)" in waiting, waiting
    freed = envs["s3"]["WORKBENCH_GPUS"]
    assert hub.api("DELETE", "/users/s3/server").status_code in (202, 204)
    hub.wait_ready("s7", 120)
    assert pinned(hub, "s7") == {"WORKBENCH_GPUS": freed, "CUDA_VISIBLE_DEVICES": freed}
    assert hub.leases()["s7"] == [freed]


@pytest.mark.parametrize(
    ("options", "status", "words"),
    [
        (
            {"gpus": 1, "gpu_model": "H100-80GB"},
            403,
            "group students allows no whole GPUs",
        ),
        (
            {"gpus": 1, "gpu_profile": "2g.35gb"},
            400,
            "this hub has no MIG slices of '2g.35gb'; it has: 1g.18gb (7 on H200-141GB)",
        ),
    ],
)
def test_a_quota_of_slices_only_refuses_a_whole_gpu_in_words(running_hub, options, status, words):
    hub = running_hub({"WORKBENCH_SIMULATED_GPUS": f"{H200_SLICES},1xH100-80GB"})
    hub.create_users("ann")
    assert hub.api("POST", "/groups/students", json={"users": ["ann"]}).status_code in (201, 409)
    quota = {"max_gpus": 1, "whole_gpus": False, "allowed_profiles": ["1g.18gb"]}
    assert hub.service("PUT", "api/quotas/groups/students", json=quota).status_code == 200
    r = hub.spawn("ann", **options)
    assert r.status_code == status, r.text
    assert words in r.json()["message"], r.text
    assert hub.server("ann") is None
    assert hub.leases() == {}
    # What the quota allows starts: a slice, chosen for her.
    assert hub.spawn("ann", gpus=1).status_code in (201, 202)
    hub.wait_ready("ann", 120)
    assert pinned(hub, "ann")["WORKBENCH_GPUS"] in SLICE_UUIDS
