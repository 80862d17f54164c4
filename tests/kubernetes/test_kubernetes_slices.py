"""MIG slices on the Kubernetes backend, through the real hub, on the real test cluster (issue 25).

The test node advertises a GPU laid out in MIG slices as NVIDIA's device plugin does in its "mixed"
strategy: one resource per profile (``nvidia.com/mig-1g.18gb``), the slices' MIG UUIDs as device IDs
(``tests/kubernetes/device_plugin.py``). A spawn that asks ``{"gpus": 1, "gpu_profile": "1g.18gb"}``
becomes a pod asking ``nvidia.com/mig-1g.18gb: 1``; the scheduler places it, the device plugin hands it
a slice, its start-up reports the MIG UUID and the hub leases exactly that slice, charged by its share
of the GPU. With every slice of the profile held, the next spawn waits with the scheduler's own
"Insufficient nvidia.com/mig-1g.18gb"; a profile no node advertises is a 400 sentence that creates
nothing (``test_kubernetes_hub.py``'s bad-input table).
"""

from __future__ import annotations

import sqlite3
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.kubernetes import test_kubernetes_hub as hub_tests
from tests.kubernetes.kube import pod_container_env
from tests.kubernetes.test_kubernetes_hub import cluster_exec, lease_rows, progress, stop, the_pod

pytestmark = [pytest.mark.kubernetes, pytest.mark.integration]

# The hub module's fixtures: a gpu-kubernetes hub for this module (its own namespace) and fresh users on it.
k8s_hub = hub_tests.k8s_hub
users = hub_tests.users

PROFILE = "1g.18gb"
SLICE = {"gpus": 1, "gpu_profile": PROFILE}


def shares(hub) -> dict[str, float]:
    """gpu_uuid -> the share of a GPU its lease records (what GPU-hours charge)."""
    with sqlite3.connect(hub.data_dir / "workbench.sqlite") as db:
        return dict(db.execute("SELECT gpu_uuid, share FROM gpu_leases").fetchall())


def server_gpus(pod: dict) -> str:
    """WORKBENCH_GPUS as the pod's Jupyter server has it: the image's start-up sets it from the device
    plugin's NVIDIA_VISIBLE_DEVICES and execs the server, which is the container's process 1."""
    command = cluster_exec(pod, "tr '\\0' ' ' < /proc/1/cmdline")
    assert "jupyter" in command, f"process 1 of the pod is not the server: {command}"
    environ = cluster_exec(pod, "tr '\\0' '\\n' < /proc/1/environ")
    found = [line.split("=", 1)[1] for line in environ.splitlines() if line.startswith("WORKBENCH_GPUS=")]
    assert len(found) == 1, f"the server's WORKBENCH_GPUS: {found}"
    return found[0]


def test_two_users_get_distinct_slices_by_mig_uuid_and_a_third_waits_with_the_schedulers_words(
    k8s_hub, k8s_cluster, users
):
    hub, namespace = k8s_hub
    advertised = k8s_cluster.slice_uuids.get(PROFILE, [])
    if len(advertised) != 2:
        pytest.skip(f"WB_K8S_GPUS={k8s_cluster.gpu_spec} does not lay out two {PROFILE} slices")
    first, second = users("slicea", "sliceb")
    for user in (first, second):
        r = hub.spawn(user, **SLICE)
        assert r.status_code in (201, 202), r.text
    for user in (first, second):
        hub.wait_ready(user, 240)

    rows = lease_rows(hub)
    given = {}
    for user in (first, second):
        pod = the_pod(namespace, user)
        (container,) = pod["spec"]["containers"]
        limits = container["resources"]["limits"]
        assert limits[f"nvidia.com/mig-{PROFILE}"] == "1", limits
        assert "nvidia.com/gpu" not in limits, limits
        env = pod_container_env(pod)
        given[user] = env["NVIDIA_VISIBLE_DEVICES"]
        leased, node, ref = rows[user]
        assert leased == [given[user]], "the lease is the slice the device plugin gave the pod"
        assert node == k8s_cluster.node
        assert ref == f"k8s:{namespace}/{pod['metadata']['name']}"
        assert server_gpus(pod) == given[user], "WORKBENCH_GPUS holds exactly the MIG UUID"
        assert pod["metadata"]["annotations"]["workbench.gpus"] == given[user]
    assert sorted(given.values()) == sorted(advertised), "two distinct slices, the very MIG UUIDs advertised"
    held = shares(hub)
    assert all(held[u] == pytest.approx(1 / 7) for u in advertised), held  # GPU-hours by share

    (late,) = users("slicelate")
    with ThreadPoolExecutor(1) as pool:
        spawn = pool.submit(hub.spawn, late, **SLICE)
        words = progress(hub, late, f"Insufficient nvidia.com/mig-{PROFILE}", 90)
        assert spawn.result().status_code == 202
    assert any(f"Insufficient nvidia.com/mig-{PROFILE}" in m and "Kubernetes says" in m for m in words), words
    assert any(PROFILE in m for m in words if m.startswith("Waiting for")), words
    assert late not in lease_rows(hub)

    freed = given[first]
    stop(hub, first)
    hub.wait_ready(late, 180)
    assert lease_rows(hub)[late][0] == [freed], "the waiting server got the slice that came free"
    assert pod_container_env(the_pod(namespace, late))["NVIDIA_VISIBLE_DEVICES"] == freed
