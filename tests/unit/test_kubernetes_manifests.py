"""What the workbench puts in and around every user pod, as tables: the lock-down check of the final pod
(one sentence per weakness, init containers too), the NetworkPolicy like Zero to JupyterHub's, the node
selector a GPU model becomes, and KubeSpawner's traits each start sets (GPUs, labels, home, deadline, image)
with the lock-down in its ``modify_pod_hook``. (The same objects on a real API server: tests/kubernetes.)"""

from __future__ import annotations

import copy
import ipaddress
from dataclasses import replace
from types import SimpleNamespace

import pytest
from jupyterhub.spawner import SpawnException
from traitlets.config import Config

from workbench_spawner.backends.kubernetes.inventory import GFD_MEMORY, GFD_PRODUCT
from workbench_spawner.backends.kubernetes.manifests import (
    CONTAINER_SECURITY,
    LABEL_HUB,
    POD_SECURITY,
    PRIVATE_RANGES,
    lockdown_problems,
    model_selector,
    network_policy,
)
from workbench_spawner.backends.kubernetes.pod_objects import PodShape, locked_down, pod_traits, start_report_env
from workbench_spawner.form.options import SpawnRequest

# The pod as KubernetesGPUSpawner builds it (its defaults), reduced to what the check reads.
COMPLIANT = {
    "metadata": {"name": "wb-1a2b3c4d-alice"},
    "spec": {
        "automountServiceAccountToken": False,
        "securityContext": {"runAsUser": 1000, "fsGroup": 100, **copy.deepcopy(POD_SECURITY)},
        "containers": [{"name": "notebook", "securityContext": copy.deepcopy(CONTAINER_SECURITY)}],
        "volumes": [{"name": "workbench-home", "persistentVolumeClaim": {"claimName": "wb-1a2b3c4d-home-alice"}}],
    },
}


def changed(change) -> dict:
    pod = copy.deepcopy(COMPLIANT)
    change(pod["spec"], pod["spec"]["containers"][0]["securityContext"])
    return pod


def drop(mapping: dict, key: str) -> None:
    del mapping[key]


HOST_PATH = {"name": "nvidia", "hostPath": {"path": "/usr/lib/nvidia"}}
ROOT_INIT = {
    "name": "fix-perms",
    "securityContext": {**copy.deepcopy(CONTAINER_SECURITY), "privileged": True},
}


def test_the_spawners_own_pod_passes():
    assert lockdown_problems(COMPLIANT) == []
    # runAsNonRoot and seccomp on the pod are inherited by a container that does not set them
    inherited = changed(lambda spec, sec: drop(sec, "runAsNonRoot"))
    assert lockdown_problems(inherited) == []


@pytest.mark.parametrize(
    ("change", "sentence"),
    [
        (lambda spec, sec: spec.update(hostNetwork=True), "the pod would share the host's network (hostNetwork: true)"),
        (lambda spec, sec: spec.update(hostPID=True), "the pod would share the host's PIDs (hostPID: true)"),
        (lambda spec, sec: spec.update(hostIPC=True), "the pod would share host IPC (hostIPC: true)"),
        (
            lambda spec, sec: drop(spec, "automountServiceAccountToken"),
            "the pod would get a service-account token (automountServiceAccountToken is not false)",
        ),
        (
            lambda spec, sec: spec.update(automountServiceAccountToken=True),
            "the pod would get a service-account token (automountServiceAccountToken is not false)",
        ),
        (lambda spec, sec: sec.update(privileged=True), "container 'notebook' would be privileged"),
        (
            lambda spec, sec: drop(sec, "allowPrivilegeEscalation"),
            "container 'notebook' could gain privileges (allowPrivilegeEscalation is not false)",
        ),
        (
            lambda spec, sec: sec.update(allowPrivilegeEscalation=True),
            "container 'notebook' could gain privileges (allowPrivilegeEscalation is not false)",
        ),
        (
            lambda spec, sec: (drop(sec, "runAsNonRoot"), drop(spec["securityContext"], "runAsNonRoot")),
            "container 'notebook' could run as root (runAsNonRoot is not true, or runAsUser is 0)",
        ),
        (
            lambda spec, sec: sec.update(runAsNonRoot=False),  # the container's own word beats the pod's
            "container 'notebook' could run as root (runAsNonRoot is not true, or runAsUser is 0)",
        ),
        (
            lambda spec, sec: sec.update(runAsUser=0),
            "container 'notebook' could run as root (runAsNonRoot is not true, or runAsUser is 0)",
        ),
        (
            lambda spec, sec: spec["securityContext"].update(runAsUser=0),
            "container 'notebook' could run as root (runAsNonRoot is not true, or runAsUser is 0)",
        ),
        (
            lambda spec, sec: sec.update(capabilities={"drop": ["NET_RAW"]}),
            "container 'notebook' keeps Linux capabilities (capabilities.drop lacks ALL)",
        ),
        (
            lambda spec, sec: drop(sec, "capabilities"),
            "container 'notebook' keeps Linux capabilities (capabilities.drop lacks ALL)",
        ),
        (
            lambda spec, sec: sec.update(capabilities={"drop": ["ALL"], "add": ["NET_ADMIN", "SYS_PTRACE"]}),
            "container 'notebook' would add capabilities NET_ADMIN, SYS_PTRACE",
        ),
        (
            lambda spec, sec: drop(spec["securityContext"], "seccompProfile"),
            "container 'notebook' would run without a seccomp profile (RuntimeDefault)",
        ),
        (
            lambda spec, sec: sec.update(seccompProfile={"type": "Unconfined"}),  # overrides the pod's
            "container 'notebook' would run without a seccomp profile (RuntimeDefault)",
        ),
        (
            lambda spec, sec: spec["volumes"].append(HOST_PATH),
            "volume 'nvidia' mounts the node's /usr/lib/nvidia (hostPath); list it in "
            "c.KubernetesGPUSpawner.allowed_host_paths if every student may have it",
        ),
        (
            lambda spec, sec: spec.update(initContainers=[ROOT_INIT]),
            "container 'fix-perms' would be privileged",
        ),
    ],
)
def test_each_weakness_of_the_final_pod_is_one_sentence(change, sentence):
    assert lockdown_problems(changed(change)) == [sentence]


def test_a_sidecar_a_site_adds_is_checked_and_inherits_only_what_the_pod_sets():
    # The pod's runAsNonRoot and seccomp cover a bare sidecar; escalation and capabilities are per container.
    pod = changed(lambda spec, sec: spec["containers"].append({"name": "sidecar"}))
    assert lockdown_problems(pod) == [
        "container 'sidecar' could gain privileges (allowPrivilegeEscalation is not false)",
        "container 'sidecar' keeps Linux capabilities (capabilities.drop lacks ALL)",
    ]


def test_an_allow_listed_host_path_passes_and_others_still_fail():
    pod = changed(lambda spec, sec: spec["volumes"].extend([HOST_PATH, {"name": "x", "hostPath": {"path": "/"}}]))
    assert lockdown_problems(pod, ["/usr/lib/nvidia"]) == [
        "volume 'x' mounts the node's / (hostPath); list it in c.KubernetesGPUSpawner.allowed_host_paths if "
        "every student may have it"
    ]
    assert len(lockdown_problems(pod)) == 2
    assert lockdown_problems(changed(lambda spec, sec: spec["volumes"].append(HOST_PATH)), ["/usr/lib/nvidia"]) == []


def test_a_localhost_seccomp_profile_is_a_profile():
    pod = changed(lambda spec, sec: sec.update(seccompProfile={"type": "Localhost", "localhostProfile": "p.json"}))
    assert lockdown_problems(pod) == []


def test_every_weakness_at_once_is_every_sentence():
    pod = {"spec": {"hostNetwork": True, "containers": [{"name": "a"}], "initContainers": [{"name": "i"}]}}
    problems = lockdown_problems(pod)
    assert len(problems) == 2 + 2 * 4  # hostNetwork, token; four per container (escalation, root, caps, seccomp)
    assert [p.split("'")[1] for p in problems if p.startswith("container")] == ["i"] * 4 + ["a"] * 4


# -- the NetworkPolicy ---------------------------------------------------------------------------------------


def egress_blocks(policy: dict) -> list[dict]:
    return [peer["ipBlock"] for rule in policy["spec"]["egress"] for peer in rule.get("to", []) if "ipBlock" in peer]


def test_with_the_hub_outside_only_its_addresses_reach_pods_and_pods_reach_it():
    policy = network_policy("wb", "1a2b3c4d", ["172.17.0.1/32"])
    assert policy["metadata"]["name"] == "workbench-singleuser-1a2b3c4d"
    assert policy["metadata"]["namespace"] == "wb"
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {LABEL_HUB: "1a2b3c4d"}}  # this hub's pods, no other's
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["ingress"] == [{"from": [{"ipBlock": {"cidr": "172.17.0.1/32"}}]}]
    assert spec["egress"][0] == {"to": [{"ipBlock": {"cidr": "172.17.0.1/32"}}]}
    dns = [rule for rule in spec["egress"] if "to" not in rule]
    assert dns == [{"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}]


def test_in_the_cluster_labelled_pods_reach_user_pods():
    spec = network_policy("wb", "1a2b3c4d")["spec"]
    assert spec["ingress"] == [
        {"from": [{"podSelector": {"matchLabels": {"hub.jupyter.org/network-access-singleuser": "true"}}}]}
    ]
    assert not any("ipBlock" in peer for rule in spec["ingress"] for peer in rule["from"])
    # Egress to the hub pod itself (its labels under KubeSpawner and z2jh), not to every pod allowed to reach it.
    assert spec["egress"][0]["to"][0]["podSelector"]["matchLabels"] == {"app": "jupyterhub", "component": "hub"}


@pytest.mark.parametrize("cidrs", [(), ("172.17.0.1/32",), ("10.1.0.0/16", "10.2.0.5/32")])
def test_the_internet_is_open_and_no_private_range_is(cidrs):
    blocks = egress_blocks(network_policy("wb", "1a2b3c4d", cidrs))
    internet = [b for b in blocks if b["cidr"] == "0.0.0.0/0"]
    assert len(internet) == 1
    assert sorted(internet[0]["except"]) == sorted(PRIVATE_RANGES)
    for private in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.169.254/32", "100.64.0.0/10"):
        assert any(ipaddress.ip_network(private).subnet_of(ipaddress.ip_network(r)) for r in internet[0]["except"])
    # besides the internet, only the hub's own addresses are reachable by address
    assert sorted(b["cidr"] for b in blocks if b["cidr"] != "0.0.0.0/0") == sorted(cidrs)


# -- a GPU model as a node selector ----------------------------------------------------------------------------

T4 = {GFD_PRODUCT: "Tesla-T4", GFD_MEMORY: "15360"}
H200 = {GFD_PRODUCT: "NVIDIA-H200", GFD_MEMORY: "144384"}
L40S = {GFD_PRODUCT: "NVIDIA-L40S"}


@pytest.mark.parametrize(
    ("model", "selector"),
    [
        (None, {}),
        ("", {}),
        ("H200-141GB", {GFD_PRODUCT: "NVIDIA-H200", GFD_MEMORY: "144384"}),
        ("h200-141gb", {GFD_PRODUCT: "NVIDIA-H200", GFD_MEMORY: "144384"}),  # as a user may type it
        ("T4-15GB", {GFD_PRODUCT: "Tesla-T4", GFD_MEMORY: "15360"}),
        ("L40S", {GFD_PRODUCT: "NVIDIA-L40S"}),  # a node without the memory label: the product alone
        ("A100-40GB", {GFD_PRODUCT: "NVIDIA-A100-40GB"}),  # no node has it: a value none carries
    ],
)
def test_a_model_selects_the_labels_of_nodes_with_that_model(model, selector):
    nodes = [{}, T4, H200, L40S]
    assert model_selector(model, nodes, GFD_PRODUCT, GFD_MEMORY) == selector


def test_a_model_no_node_has_matches_no_node():
    nodes = [T4, H200, L40S]
    selector = model_selector("A100-40GB", nodes, GFD_PRODUCT, GFD_MEMORY)
    assert not any(all(labels.get(k) == v for k, v in selector.items()) for labels in nodes)


# -- the pod through KubeSpawner's traits and modify_pod_hook ----------------------------------------------------

SHAPE = PodShape(hub="1a2b3c4d", user="alice", server="", pvc_name="wb-1a2b3c4d-home-alice")


def test_each_start_adds_the_workbenchs_part_to_the_sites_traits():
    site = {
        "extra_resource_limits": {"example.com/fpga": "1"},
        "node_selector": {"pool": "gpu"},
        "extra_labels": {"team": "ml"},
        "extra_annotations": {"owner": "it"},
        "volumes": [{"name": "scratch", "emptyDir": {}}],
        "volume_mounts": [{"name": "scratch", "mountPath": "/scratch"}],
        "extra_pod_config": {"priorityClassName": "students"},
        "image": "site/singleuser:1",
    }
    shape = replace(
        SHAPE, gpus=2, model_selector={GFD_PRODUCT: "NVIDIA-H200"}, session_hours=1.5, datasets_claim="datasets"
    )
    traits = pod_traits(site, shape)
    assert traits["extra_resource_limits"] == {"example.com/fpga": "1", "nvidia.com/gpu": "2"}
    assert traits["node_selector"] == {"pool": "gpu", GFD_PRODUCT: "NVIDIA-H200"}
    assert traits["extra_labels"] == {
        "team": "ml",
        LABEL_HUB: "1a2b3c4d",
        "workbench.user": "alice",
        "workbench.server": "default",
    }
    assert traits["extra_annotations"] == {"owner": "it", "workbench.user": "alice", "workbench.server": ""}
    assert [v["name"] for v in traits["volumes"]] == ["scratch", "workbench-home", "workbench-datasets"]
    assert traits["volumes"][1]["persistentVolumeClaim"] == {"claimName": "wb-1a2b3c4d-home-alice"}
    assert traits["volumes"][2]["persistentVolumeClaim"] == {"claimName": "datasets", "readOnly": True}
    assert [(m["name"], m["mountPath"]) for m in traits["volume_mounts"]] == [
        ("scratch", "/scratch"),
        ("workbench-home", "/home/jovyan"),
        ("workbench-datasets", "/datasets"),
    ]
    assert traits["extra_pod_config"] == {"priorityClassName": "students", "activeDeadlineSeconds": 5400}
    assert traits["image"] == "site/singleuser:1", "no pick: the configured image"
    assert site["extra_pod_config"] == {"priorityClassName": "students"}, "the site's values are never changed"


@pytest.mark.parametrize(
    ("shape", "limits"),
    [
        (SHAPE, {}),
        (replace(SHAPE, gpus=1), {"nvidia.com/gpu": "1"}),
        (replace(SHAPE, gpus=1, gpu_profile="1g.18gb"), {"nvidia.com/mig-1g.18gb": "1"}),
        (replace(SHAPE, gpus=1, gpu_resource="nvidia.com/gpu.shared"), {"nvidia.com/gpu.shared": "1"}),
    ],
    ids=["cpu-only", "whole-gpu", "mig-slice", "renamed-resource"],
)
def test_the_gpus_are_the_pods_extra_resource_limits(shape, limits):
    assert pod_traits({}, shape)["extra_resource_limits"] == limits


def test_a_picked_image_a_dict_of_volumes_and_names_with_braces_reach_kubespawner_as_they_are():
    site = {"volumes": {"a-scratch": {"name": "scratch", "emptyDir": {}}}, "volume_mounts": {}, "image": "site:1"}
    traits = pod_traits(site, replace(SHAPE, user="{bob}", server="lab{1}", image="site:2"))
    assert traits["image"] == "site:2"
    assert sorted(traits["volumes"]) == ["a-scratch", "workbench-home"]  # KubeSpawner sorts a dict by key
    assert sorted(traits["volume_mounts"]) == ["workbench-home"]
    # KubeSpawner formats annotations as templates: braces are doubled so the exact name arrives.
    assert traits["extra_annotations"] == {"workbench.user": "{{bob}}", "workbench.server": "lab{{1}}"}
    assert traits["extra_pod_config"] == {}, "no session limit: no deadline"


def test_a_cpu_pod_is_told_it_has_no_gpu_and_every_pod_reports_its_node():
    cpu, gpu = start_report_env(0), start_report_env(1)
    assert cpu["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert "NVIDIA_VISIBLE_DEVICES" not in gpu
    assert gpu["WORKBENCH_NODE_NAME"] == {"valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    assert gpu["WORKBENCH_START_REPORT"] == "1"


async def test_the_lockdown_is_checked_after_the_sites_own_modify_pod_hook():
    seen: list[str] = []

    def site_hook(spawner, pod):
        seen.append("site")
        pod["spec"]["hostNetwork"] = True
        return pod

    class Spawner:
        def check_lockdown(self, pod):
            seen.append("check")
            problems = lockdown_problems(pod)
            if problems:
                raise ValueError(problems[0])

    with pytest.raises(ValueError, match="hostNetwork"):
        await locked_down(site_hook)(Spawner(), copy.deepcopy(COMPLIANT))
    assert seen == ["site", "check"]
    assert await locked_down(None)(Spawner(), copy.deepcopy(COMPLIANT)) == COMPLIANT


@pytest.fixture
def kube_spawner(monkeypatch, tmp_path):
    """A KubernetesGPUSpawner as the hub makes it, with no cluster (KubeSpawner's config loading skipped)."""
    import kubespawner.spawner

    from workbench_spawner.backends.kubernetes.spawner import KubernetesGPUSpawner

    monkeypatch.setattr(kubespawner.spawner, "load_config", lambda **kwargs: None)

    def make(config=None, user: str = "alice") -> KubernetesGPUSpawner:
        return KubernetesGPUSpawner(
            config=config or Config(),
            user=SimpleNamespace(name=user, id=7, url=f"/user/{user}/", escaped_name=user),
            hub=SimpleNamespace(public_host="", api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/", url="/hub/"),
            orm_spawner=SimpleNamespace(name="", server=None),
            gpu_db_url=f"sqlite:///{tmp_path / 'wb.sqlite'}",
        )

    return make


async def test_kubespawner_builds_the_shaped_pod_and_its_hook_refuses_a_weakened_one(kube_spawner):
    config = Config()
    config.KubernetesGPUSpawner.image = "site/singleuser:1"
    config.KubernetesGPUSpawner.offered_images = ["site/singleuser:1", "site/singleuser:2"]
    spawner = kube_spawner(config)
    spawner.gpu_request = SpawnRequest(gpus=1, image="site/singleuser:2")
    spawner.apply_gpu_request(spawner.gpu_request)
    spawner.shape_pod(replace(SHAPE, gpus=1, session_hours=2, image="site/singleuser:2"))
    pod = await spawner.modify_pod_hook(spawner, await spawner.get_pod_manifest())
    manifest = spawner.api.api_client.sanitize_for_serialization(pod)
    spec = manifest["spec"]
    (container,) = spec["containers"]
    assert container["image"] == "site/singleuser:2"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert spec["activeDeadlineSeconds"] == 7200
    assert manifest["metadata"]["labels"][LABEL_HUB] == "1a2b3c4d"
    env = {e["name"]: e for e in container["env"]}
    assert env["WORKBENCH_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert "NVIDIA_VISIBLE_DEVICES" not in env
    assert lockdown_problems(manifest) == []
    # The next start without a pick runs the configured image again.
    spawner.apply_gpu_request(SpawnRequest(gpus=0))
    assert spawner.image == "site/singleuser:1"

    weakened = Config()
    weakened.KubernetesGPUSpawner.extra_pod_config = {"hostPID": True}
    spawner = kube_spawner(weakened, user="bob")
    spawner.gpu_request = SpawnRequest(gpus=0)
    spawner.shape_pod(replace(SHAPE, user="bob"))
    with pytest.raises(SpawnException) as refused:
        await spawner.modify_pod_hook(spawner, await spawner.get_pod_manifest())
    assert refused.value.status_code == 500
    assert (
        "The hub's Kubernetes settings would weaken the user pod's lock-down: the pod would share the host's PIDs "
        "(hostPID: true). Nothing was created; tell a hub admin."
    ) in str(refused.value)
