"""What the workbench puts in and around every user pod, as tables: the lock-down check of the final pod
(one sentence per weakness, init containers too), the NetworkPolicy like Zero to JupyterHub's, and the
node selector a GPU model becomes. (The same objects on a real API server: tests/kubernetes.)"""

from __future__ import annotations

import copy
import ipaddress

import pytest

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
    "change, sentence",
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
    assert policy["metadata"]["name"] == "workbench-singleuser-1a2b3c4d" and policy["metadata"]["namespace"] == "wb"
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
    assert len(internet) == 1 and sorted(internet[0]["except"]) == sorted(PRIVATE_RANGES)
    for private in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.169.254/32", "100.64.0.0/10"):
        assert any(ipaddress.ip_network(private).subnet_of(ipaddress.ip_network(r)) for r in internet[0]["except"])
    # besides the internet, only the hub's own addresses are reachable by address
    assert sorted(b["cidr"] for b in blocks if b["cidr"] != "0.0.0.0/0") == sorted(cidrs)


# -- a GPU model as a node selector ----------------------------------------------------------------------------

T4 = {GFD_PRODUCT: "Tesla-T4", GFD_MEMORY: "15360"}
H200 = {GFD_PRODUCT: "NVIDIA-H200", GFD_MEMORY: "144384"}
L40S = {GFD_PRODUCT: "NVIDIA-L40S"}


@pytest.mark.parametrize(
    "model, selector",
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
