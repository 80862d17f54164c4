"""The gpu-kubernetes backend through the real hub, proxy and browser, on the real test cluster.

One hub on this host (``WORKBENCH_BACKEND=kubernetes``, the cluster's
kubeconfig) spawns pods of the real single-user image; the scheduler places
them on the cluster's node, the stand-in device plugin hands out simulated
GPU UUIDs, and each pod's start-up reports them. The conformance suite
(``tests/conformance``) runs the contract's scenarios on this backend too;
what is here is what only Kubernetes has: the pod's lock-down and GPU
request, the scheduler's words while a pod waits, pods outside the
workbench, bad input that must create nothing, two hubs on one cluster, and
the lab in Chromium.
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.conftest import hub_pool, wait_until
from tests.kubernetes.kube import (
    create_namespace,
    delete_namespace,
    delete_pods_of,
    hub_env,
    pod_container,
    pod_container_env,
    pods,
    pods_of,
)
from tests.lab_browser import wait_for_lab
from workbench_spawner.backends.kubernetes import cluster

pytestmark = [pytest.mark.kubernetes, pytest.mark.integration]


def lease_rows(hub) -> dict[str, tuple[list[str], str, str]]:
    """user -> (GPU UUIDs, node, ref) from the hub's ledger."""
    import sqlite3

    with sqlite3.connect(hub.data_dir / "workbench.sqlite") as db:
        rows = db.execute("SELECT user, gpu_uuid, node, ref FROM gpu_leases ORDER BY gpu_uuid").fetchall()
    out: dict[str, tuple[list[str], str, str]] = {}
    for user, gpu, node, ref in rows:
        uuids, _, _ = out.get(user, ([], node, ref))
        out[user] = ([*uuids, gpu], node, ref)
    return out


def the_pod(namespace: str, user: str) -> dict:
    live = [p for p in pods_of(namespace, user) if not p["metadata"].get("deletionTimestamp")]
    assert len(live) == 1, f"{user} has {len(live)} pods"
    return live[0]


def progress(hub, user: str, until: str, timeout: float) -> list[str]:
    """The spawn's progress messages up to one containing ``until``, once the spawn is pending."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        messages = hub.progress_messages(user, until=until, timeout=deadline - time.monotonic())
        if messages:
            return messages
        time.sleep(0.1)  # the POST has not made the spawn pending yet
    return []


# The kubelet confirms a pod's deletion in 8-17 s here, past 60 s while CI's other lane loads the host.
STOP_TIMEOUT = 180


def stop(hub, user: str) -> None:
    r = hub.api("DELETE", f"/users/{user}/server")
    assert r.status_code in (202, 204), r.text
    hub.wait_stopped(user, STOP_TIMEOUT)


@pytest.fixture(scope="module")
def k8s_hub(k8s_cluster, singleuser_image, tmp_path_factory):
    """(hub, namespace): one gpu-kubernetes hub for the module, its own namespace, every GPU of the cluster."""
    namespace = create_namespace("wbt-hub")
    env = {
        **hub_env(k8s_cluster, namespace, singleuser_image),
        "WORKBENCH_DEFAULT_MAX_GPUS": "2",
        "WORKBENCH_QUEUE_TIMEOUT": "240",
        "WORKBENCH_ADMIN_USERS": "admin,k8sbrowser",
        # Small sizes: the node has 2 cores and a pod's limits are also its requests.
        "WORKBENCH_PROFILES": "small*:0.25:1G,medium:0.5:2G",
    }
    try:
        with hub_pool(tmp_path_factory.mktemp("k8s-hub")) as start:
            yield start(env), namespace
    finally:
        delete_namespace(namespace)


@pytest.fixture
def users(k8s_hub):
    """users(*names) -> fresh user names on the module's hub; their servers and pods are gone afterwards."""
    hub, namespace = k8s_hub
    made: list[str] = []

    def make(*names: str) -> list[str]:
        real = [f"{n}{uuid.uuid4().hex[:5]}" for n in names]
        hub.create_users(*real)
        made.extend(real)
        return real

    yield make
    for user in made:
        if hub.server(user) is not None:
            hub.api("DELETE", f"/users/{user}/server")
    for user in made:
        hub.wait_stopped(user, STOP_TIMEOUT)
    delete_pods_of(namespace, *made)


def test_a_pod_asks_for_its_gpu_is_locked_down_and_reports_what_the_device_plugin_gave_it(k8s_hub, k8s_cluster, users):
    hub, namespace = k8s_hub
    (alice,) = users("alice")
    # Her quota's session length becomes the pod's activeDeadlineSeconds: Kubernetes ends it then.
    quota = {"max_gpus": 2, "gpu_hours_per_week": None, "allowed_models": None, "max_session_hours": 2}
    r = requests.put(
        f"{hub.url}/services/workbench/api/quotas/users/{alice}",
        json=quota,
        headers={"Authorization": f"token {hub.token}"},
        timeout=30,
    )
    assert r.status_code in (200, 201), r.text
    assert hub.spawn(alice, gpus=1, profile="medium").status_code in (201, 202)
    hub.wait_ready(alice, 180)
    (leased, node, ref), pod = lease_rows(hub)[alice], the_pod(namespace, alice)
    name = pod["metadata"]["name"]
    assert ref == f"k8s:{namespace}/{name}"
    assert node == pod["spec"]["nodeName"] == k8s_cluster.node
    assert len(leased) == 1
    assert leased[0] in k8s_cluster.gpu_uuids
    # What the device plugin gave the container is the lease, and the server names it.
    env = pod_container_env(pod)
    assert env["NVIDIA_VISIBLE_DEVICES"] == leased[0]
    assert pod["metadata"]["annotations"]["workbench.gpus"] == leased[0]
    # The GPU monitor in the pod (through the proxy) shows exactly that GPU.
    token = hub.user_token(alice)
    metrics = requests.get(
        f"{hub.url}/user/{alice}/api/gpu/metrics", headers={"Authorization": f"token {token}"}, timeout=30
    )
    assert metrics.status_code == 200, metrics.text
    assert [g["uuid"] for g in metrics.json()["gpus"]] == leased
    assert metrics.json()["source"] == "simulated"

    spec = pod["spec"]
    assert spec["activeDeadlineSeconds"] == 2 * 3600
    (container,) = spec["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # The resource profile she picked sizes the pod, and Kubernetes holds it to that.
    assert container["resources"]["limits"]["cpu"] == "500m"
    assert container["resources"]["limits"]["memory"] in ("2Gi", str(2 << 30))
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == 1000
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False
    assert not any(v.get("hostPath") for v in spec.get("volumes") or [])
    labels = pod["metadata"]["labels"]
    assert labels["workbench.user"] == alice
    assert len(labels["workbench.hub"]) == 8
    assert name.startswith(f"wb-{labels['workbench.hub']}-")
    # The container really runs as the image's user, with no capability.
    status = cluster_exec(pod, "cat /proc/1/status")
    assert "Uid:\t1000" in status
    assert "CapEff:\t0000000000000000" in status
    # Its home is a claim of its own, bound, mounted at the image's home.
    (home,) = [v for v in spec["volumes"] if v["name"] == "workbench-home"]
    claim = home["persistentVolumeClaim"]["claimName"]
    assert claim == f"wb-{labels['workbench.hub']}-home-{alice}"
    phase = cluster.blocking(lambda api: api.read_namespaced_persistent_volume_claim(claim, namespace))
    assert phase.status.phase == "Bound"
    # The hub keeps the namespace's NetworkPolicy for its pods: reached only from the hub's address.
    policy = cluster.blocking(
        lambda api: _network_policy(api, namespace, f"workbench-singleuser-{labels['workbench.hub']}")
    )
    assert policy.spec.pod_selector.match_labels == {"workbench.hub": labels["workbench.hub"]}
    assert [p.ip_block.cidr for p in policy.spec.ingress[0]._from] == ["172.17.0.1/32"]

    stop(hub, alice)
    assert alice not in lease_rows(hub)
    wait_until(lambda: not pods_of(namespace, alice), 60, "the stopped server's pod to be deleted")


def cluster_exec(pod: dict, command: str) -> str:
    import subprocess

    return subprocess.run(
        ["docker", "exec", pod_container(pod), "sh", "-c", command], capture_output=True, text=True, check=True
    ).stdout


async def _network_policy(api, namespace: str, name: str):
    from kubernetes_asyncio.client import NetworkingV1Api

    return await NetworkingV1Api(api.api_client).read_namespaced_network_policy(name, namespace)


def test_with_every_gpu_held_the_next_spawn_shows_the_schedulers_words_and_starts_when_one_stops(
    k8s_hub, k8s_cluster, users
):
    hub, namespace = k8s_hub
    count = len(k8s_cluster.gpu_uuids)
    holders = users(*[f"holder{i}" for i in range(count)])
    for user in holders:
        assert hub.spawn(user, gpus=1).status_code in (201, 202)
    for user in holders:
        hub.wait_ready(user, 240)
    rows = lease_rows(hub)
    given = [pod_container_env(the_pod(namespace, u))["NVIDIA_VISIBLE_DEVICES"] for u in holders]
    assert sorted(given) == sorted(k8s_cluster.gpu_uuids), "every GPU went to exactly one pod"
    assert [rows[u][0] for u in holders] == [[g] for g in given], "each lease is what its pod was given"

    (late,) = users("late")
    with ThreadPoolExecutor(1) as pool:
        spawn = pool.submit(hub.spawn, late, gpus=1)
        words = progress(hub, late, "Insufficient nvidia.com/gpu", 90)
        assert spawn.result().status_code == 202
    assert any("Insufficient nvidia.com/gpu" in m and "Kubernetes says" in m for m in words), words
    assert any("next in line" in m for m in words), words
    pending = the_pod(namespace, late)
    assert not pending["spec"].get("nodeName")
    assert pending["status"]["phase"] == "Pending"
    assert late not in lease_rows(hub)

    freed = rows[holders[0]][0]
    stop(hub, holders[0])
    hub.wait_ready(late, 180)
    assert lease_rows(hub)[late][0] == freed, "the waiting server got the GPU that came free"
    assert pod_container_env(the_pod(namespace, late))["NVIDIA_VISIBLE_DEVICES"] == freed[0]


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"gpus": -1}, "gpus"),
        ({"gpus": 1, "gpu_model": "A999-1GB"}, "A999-1GB"),
        ({"gpus": 1, "profile": "enormous"}, "enormous"),
        ({"gpus": 3}, "allows 2 at once"),
        # A MIG profile no node advertises (the node has 1g.18gb and 3g.71gb slices).
        ({"gpus": 1, "gpu_profile": "2g.35gb"}, "no MIG slices of '2g.35gb'"),
    ],
    ids=["negative-gpus", "unknown-model", "unknown-profile", "over-quota", "unadvertised-mig-profile"],
)
def test_bad_input_and_a_quota_refusal_are_4xx_sentences_that_create_nothing(k8s_hub, users, options, words):
    hub, namespace = k8s_hub
    (user,) = users("refused")
    r = hub.spawn(user, **options)
    assert 400 <= r.status_code < 500, r.text
    assert words in r.json()["message"], r.json()
    assert hub.server(user) is None
    assert user not in lease_rows(hub)
    assert pods_of(namespace, user) == []
    claims = cluster.blocking(lambda api: api.list_namespaced_persistent_volume_claim(namespace))
    assert not [c for c in claims.items if c.metadata.name.endswith(f"-home-{user}")], "no home was made either"


def test_a_pod_that_waits_past_the_queue_timeout_is_deleted_and_pods_outside_the_workbench_count(
    k8s_cluster, singleuser_image, tmp_path
):
    """GPUs held by a pod that is not the workbench's: the spawn waits with the scheduler's words, then ends."""
    namespace = create_namespace("wbt-timeout")
    outside = {
        "metadata": {"name": "training-job", "namespace": namespace},
        "spec": {
            "containers": [
                {
                    "name": "train",
                    "image": "workbench/k8s-busybox:test",
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                    "resources": {"limits": {"nvidia.com/gpu": str(len(k8s_cluster.gpu_uuids))}},
                }
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }
    try:
        cluster.blocking(lambda api: api.create_namespaced_pod(namespace, outside))
        wait_until(
            lambda: [p for p in pods(namespace) if p["status"].get("phase") == "Running"],
            60,
            "the outside pod to hold every GPU",
        )
        with hub_pool(tmp_path) as start:
            hub = start({**hub_env(k8s_cluster, namespace, singleuser_image), "WORKBENCH_QUEUE_TIMEOUT": "12"})
            user = "waiter"
            hub.create_users(user)
            fleet = requests.get(
                f"{hub.url}/services/workbench/api/gpus", headers={"Authorization": f"token {hub.token}"}, timeout=30
            )
            assert fleet.status_code == 200, fleet.text
            rows = [r for r in fleet.json()["gpus"] if not r["mig"]]
            slices = [r for r in fleet.json()["gpus"] if r["mig"]]
            # The fleet view counts the outside pod's GPUs on the node, though the ledger holds none.
            assert rows, rows
            assert all(r["kubernetes"]["node_gpus_outside_workbench"] == len(rows) for r in rows), rows
            assert all(r["kubernetes"]["held_outside_workbench"] for r in rows), rows
            # It holds whole GPUs only: the node's MIG slices are free.
            assert all(r["kubernetes"]["held_outside_workbench"] is False for r in slices), slices
            metrics = requests.get(
                f"{hub.url}/services/workbench/metrics", headers={"Authorization": f"token {hub.token}"}, timeout=30
            ).text
            held = [line for line in metrics.splitlines() if line.startswith("workbench_gpu_held_outside{")]
            held = [line for line in held if any(f'"{r["uuid"]}"' in line for r in rows)]
            assert len(held) == len(rows), held
            assert all(line.endswith(" 1.0") for line in held), held
            assert all(f'Hostname="{k8s_cluster.node}"' in line for line in held), held
            with ThreadPoolExecutor(1) as pool:
                spawn = pool.submit(hub.spawn, user, gpus=1)
                messages = progress(hub, user, "the pod was deleted", 60)
                spawn.result()
            # The scheduler's words while it waits (on a fresh namespace the first may be about the home claim
            # still binding; the GPU case's words are the test above's), and in the final sentence.
            assert any("Kubernetes says: 0/1 nodes are available" in m for m in messages), messages
            assert "the pod was deleted" in messages[-1], messages
            assert "0/1 nodes are available" in messages[-1], messages
            wait_until(lambda: not pods_of(namespace, user), 60, "the timed-out pod to be deleted")
            assert hub.server(user) is None
            assert lease_rows(hub) == {}
    finally:
        delete_namespace(namespace)


def test_two_hubs_on_one_namespace_leave_each_others_pods_alone(k8s_cluster, singleuser_image, tmp_path):
    namespace = create_namespace("wbt-two")
    try:
        with hub_pool(tmp_path) as start:
            env = hub_env(k8s_cluster, namespace, singleuser_image)
            first, second = start(env), start(env)
            for hub in (first, second):
                hub.create_users("alice")
                assert hub.spawn("alice", gpus=1).status_code in (201, 202)
            for hub in (first, second):
                hub.wait_ready("alice", 180)
            both = {p["metadata"]["labels"]["workbench.hub"]: p for p in pods_of(namespace, "alice")}
            assert len(both) == 2, "each hub has its own pod for the same user name"
            gpus = {pod_container_env(p)["NVIDIA_VISIBLE_DEVICES"] for p in both.values()}
            assert len(gpus) == 2, "the scheduler gave them different GPUs"

            # The second hub restarts: it reconciles only its own pods.
            second.stop()
            second.start()

            def listed() -> bool:
                return second.server("alice") is not None

            wait_until(listed, 120, "the restarted hub to list its server", second.log)
            time.sleep(3)  # a reconcile that wrongly deleted the first hub's pod would have by now
            assert {p["metadata"]["labels"]["workbench.hub"] for p in pods_of(namespace, "alice")} == set(both)
            # Stopping on one hub ends its pod only.
            stop(second, "alice")
            wait_until(lambda: len(pods_of(namespace, "alice")) == 1, 60, "the second hub's pod to go")
            assert first.server("alice")["ready"]
            assert lease_rows(first)["alice"][0]
            stop(first, "alice")
    finally:
        delete_namespace(namespace)


@pytest.mark.browser
def test_a_person_logs_in_spawns_one_gpu_and_the_status_bar_shows_the_pods_gpu(k8s_hub, chromium_browser):
    from playwright.sync_api import expect

    from tests.browser.test_login_to_lab import log_in, sign_up

    hub, namespace = k8s_hub
    user = "k8sbrowser"
    page = chromium_browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(60_000)
    try:
        assert "The signup was successful!" in sign_up(page, hub.url, user)
        log_in(page, hub.url, user)
        page.wait_for_url("**/hub/spawn**")
        page.locator("#workbench-gpus").fill("1")
        page.click("form#spawn_form [type=submit]")
        # A pod's new veth on docker0 is a network change to Chromium on this host (wait_for_lab reloads).
        wait_for_lab(page, hub.url, user, log=hub.log)
        status = page.locator(".jp-WorkbenchGPU-status .jp-WorkbenchGPU-gpu")
        expect(status).to_have_count(1, timeout=90_000)
        uuid_shown = status.get_attribute("data-uuid")
        (leased, node, ref) = lease_rows(hub)[user]
        pod = the_pod(namespace, user)
        # JupyterLab runs in the user's pod, and its status bar shows the GPU the device plugin gave that pod.
        assert ref == f"k8s:{namespace}/{pod['metadata']['name']}"
        assert [uuid_shown] == leased == [pod_container_env(pod)["NVIDIA_VISIBLE_DEVICES"]]
        assert uuid_shown.startswith(f"GPU-sim-{node}-")
    finally:
        page.close()
        if hub.server(user) is not None:
            stop(hub, user)
        delete_pods_of(namespace, user)
