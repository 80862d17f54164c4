"""The Kubernetes backend's settings and what it adds to the hub, the service and the CLI, as tables:
``WORKBENCH_*`` into config, the lock-down check of the final config, the start report a pod may send,
the fleet view's node rows and GPU annotations (the API replaced), and the extension's registration."""

from __future__ import annotations

import argparse
import re
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from traitlets.config import Config

from workbench_hub import configurer
from workbench_hub.env_values import ConfigError
from workbench_hub.service.openapi import load_document, load_fragment
from workbench_spawner.backend import HubContext, installed_backends
from workbench_spawner.backends.kubernetes import extension as kubernetes_extension
from workbench_spawner.backends.kubernetes import fleet
from workbench_spawner.backends.kubernetes.cluster import KubeNode, KubernetesUnavailableError
from workbench_spawner.backends.kubernetes.config import configure
from workbench_spawner.backends.kubernetes.inventory import NodeUUIDs, cluster_inventory
from workbench_spawner.backends.kubernetes.report_api import ROUTE, read_report
from workbench_spawner.placement.engine_report import MAX_GPUS, ReportRefusedError

IMAGE = "registry.example.org/gpu-workbench/singleuser:1.0"
OUTSIDE = {"WORKBENCH_IMAGE": IMAGE, "WORKBENCH_HUB_CONNECT_IP": "172.17.0.1"}
INSIDE = {"WORKBENCH_IMAGE": IMAGE, "KUBERNETES_SERVICE_HOST": "10.96.0.1"}


def configured(env: dict, tmp_path: Path) -> Config:
    """The config as the hub's config file builds it: its services first, then the backend's part."""
    c = Config()
    configurer.update_services(c, {})
    configure(c, env, HubContext(tmp_path, tmp_path, tmp_path / "bin"))
    return c


def service_env(c: Config) -> dict:
    (workbench,) = [s for s in c.JupyterHub.services if s["name"] == "workbench"]
    return workbench.get("environment", {})


# -- WORKBENCH_* into config ------------------------------------------------------------------------------


def test_the_hub_outside_the_cluster(tmp_path):
    c = configured(OUTSIDE, tmp_path)
    assert c.JupyterHub.spawner_class == "gpu-kubernetes"
    assert c.JupyterHub.hub_connect_ip == "172.17.0.1"
    assert c.JupyterHub.hub_ip == "172.17.0.1"
    s = c.KubernetesGPUSpawner
    assert s.image == IMAGE
    assert s.hub_ingress_cidrs == ["172.17.0.1/32"]  # the policy lets in the hub's address only
    assert s.workbench_network_policy is True
    assert (s.home_volume_size, s.datasets_claim) == ("10Gi", "")
    assert c.Spawner.poll_interval == 10
    for unset in ("namespace", "storage_class", "node_selector", "tolerations", "mem_limit", "cpu_limit"):
        assert unset not in s, f"{unset} is KubeSpawner's default unless its variable is set"
    assert "offered_images" not in s


def test_the_hub_in_the_cluster_needs_no_address(tmp_path):
    c = configured(INSIDE, tmp_path)
    assert "hub_connect_ip" not in c.JupyterHub
    assert "hub_ip" not in c.JupyterHub
    assert c.KubernetesGPUSpawner.hub_ingress_cidrs == []  # labelled pods instead of addresses


@pytest.mark.parametrize(
    ("env", "settings"),
    [
        ({"WORKBENCH_HUB_IP": "0.0.0.0"}, {"JupyterHub.hub_ip": "0.0.0.0", "JupyterHub.hub_connect_ip": "172.17.0.1"}),
        ({"WORKBENCH_K8S_NAMESPACE": "gpu-lab"}, {"KubernetesGPUSpawner.namespace": "gpu-lab"}),
        (
            {"WORKBENCH_IMAGES": "a:1, b:2"},
            {"KubernetesGPUSpawner.offered_images": ["a:1", "b:2"], "KubernetesGPUSpawner.image": IMAGE},
        ),
        ({"WORKBENCH_K8S_STORAGE_CLASS": "fast"}, {"KubernetesGPUSpawner.storage_class": "fast"}),
        ({"WORKBENCH_K8S_HOME_SIZE": "50Gi"}, {"KubernetesGPUSpawner.home_volume_size": "50Gi"}),
        ({"WORKBENCH_DATASETS_CLAIM": "datasets"}, {"KubernetesGPUSpawner.datasets_claim": "datasets"}),
        (
            {"WORKBENCH_K8S_NODE_SELECTOR": "pool=gpu, zone = a ,"},
            {"KubernetesGPUSpawner.node_selector": {"pool": "gpu", "zone": "a"}},
        ),
        (
            {"WORKBENCH_K8S_TOLERATIONS": '[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]'},
            {
                "KubernetesGPUSpawner.tolerations": [
                    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                ]
            },
        ),
        ({"WORKBENCH_K8S_TOLERATIONS": "[]"}, {"KubernetesGPUSpawner.tolerations": None}),
        (
            {"WORKBENCH_K8S_HUB_CIDRS": "172.17.0.0/16, 10.1.2.3/32"},
            {"KubernetesGPUSpawner.hub_ingress_cidrs": ["172.17.0.0/16", "10.1.2.3/32"]},
        ),
        ({"WORKBENCH_K8S_NETWORK_POLICY": "0"}, {"KubernetesGPUSpawner.workbench_network_policy": False}),
        ({"WORKBENCH_K8S_NETWORK_POLICY": "no"}, {"KubernetesGPUSpawner.workbench_network_policy": False}),
        ({"WORKBENCH_K8S_NETWORK_POLICY": "1"}, {"KubernetesGPUSpawner.workbench_network_policy": True}),
        ({"WORKBENCH_K8S_POLL_SECONDS": "3"}, {"Spawner.poll_interval": 3}),
        (
            {"WORKBENCH_MEM_LIMIT": "16G", "WORKBENCH_CPU_LIMIT": "4"},
            {"KubernetesGPUSpawner.mem_limit": "16G", "KubernetesGPUSpawner.cpu_limit": 4.0},
        ),
    ],
)
def test_configurer_kubernetes_table(tmp_path, env, settings):
    c = configured({**OUTSIDE, **env}, tmp_path)
    for dotted, value in settings.items():
        section, name = dotted.split(".")
        if value is None:
            assert name not in c[section], dotted
        else:
            assert c[section][name] == value, dotted


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({}, "the kubernetes backend needs WORKBENCH_IMAGE, the single-user image the nodes can pull"),
        ({"WORKBENCH_IMAGE": " "}, "needs WORKBENCH_IMAGE"),
        ({"WORKBENCH_IMAGE": IMAGE}, "with the hub outside the cluster needs WORKBENCH_HUB_CONNECT_IP"),
        ({**OUTSIDE, "WORKBENCH_K8S_NODE_SELECTOR": "gpu"}, "label=value pairs separated by commas; cannot read 'gpu'"),
        ({**OUTSIDE, "WORKBENCH_K8S_NODE_SELECTOR": "a=b,=c"}, "cannot read '=c'"),
        ({**OUTSIDE, "WORKBENCH_K8S_TOLERATIONS": "[{key: x}]"}, "must be a JSON list of tolerations"),
        ({**OUTSIDE, "WORKBENCH_K8S_TOLERATIONS": '{"key": "x"}'}, "must be a JSON list such as"),
        ({**OUTSIDE, "WORKBENCH_K8S_TOLERATIONS": '["x"]'}, "must be a JSON list such as"),
        (
            {**OUTSIDE, "WORKBENCH_K8S_HUB_CIDRS": "10.0.0.0/8,hub"},
            "takes CIDRs such as 172.17.0.1/32; 'hub' is not one",
        ),
        ({**INSIDE, "WORKBENCH_K8S_HUB_CIDRS": "10.0.0.0/33"}, "'10.0.0.0/33' is not one"),
        ({**OUTSIDE, "WORKBENCH_K8S_POLL_SECONDS": "-1"}, "WORKBENCH_K8S_POLL_SECONDS must be a non-negative whole"),
        ({**OUTSIDE, "WORKBENCH_K8S_POLL_SECONDS": "2.5"}, "WORKBENCH_K8S_POLL_SECONDS must be a non-negative whole"),
        ({**OUTSIDE, "WORKBENCH_CPU_LIMIT": "lots"}, "WORKBENCH_CPU_LIMIT must be a non-negative number"),
    ],
)
def test_a_bad_value_is_a_config_error(tmp_path, env, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(")):
        configured(env, tmp_path)


@pytest.mark.parametrize(
    ("env", "found"),
    [
        ({**OUTSIDE, "KUBECONFIG": "/etc/wb/kubeconfig"}, {"KUBECONFIG": "/etc/wb/kubeconfig"}),
        ({**OUTSIDE, "HOME": "/home/hub"}, {"KUBECONFIG": "/home/hub/.kube/config"}),
        (
            {**INSIDE, "KUBERNETES_SERVICE_PORT": "443", "KUBECONFIG": "/x"},
            {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"},
        ),
    ],
)
def test_the_workbench_service_finds_the_cluster_as_the_hub_does(tmp_path, env, found):
    c = configured(env, tmp_path)
    assert {k: v for k, v in service_env(c).items() if k.startswith("KUBE")} == found


def test_a_bare_address_is_written_as_the_cidr_kubernetes_takes(tmp_path):
    # BUG (reported): the check accepts "172.17.0.1" (strict=False) but keeps it as typed; an ipBlock needs
    # a prefix, so the API server refuses the NetworkPolicy at the first spawn instead of the hub at start.
    c = configured({**OUTSIDE, "WORKBENCH_K8S_HUB_CIDRS": "172.17.0.1, 10.1.0.0/16"}, tmp_path)
    assert c.KubernetesGPUSpawner.hub_ingress_cidrs == ["172.17.0.1/32", "10.1.0.0/16"]


# -- the lock-down check of the final config -------------------------------------------------------------------

DOCKER_SOCK = {"name": "docker", "hostPath": {"path": "/var/run/docker.sock"}}


def spawner_config(**settings) -> Config:
    c = Config()
    for name, value in settings.items():
        setattr(c.KubernetesGPUSpawner, name, value)
    return c


@pytest.mark.parametrize(
    ("settings", "sentence"),
    [
        ({"privileged": True}, "c.KubernetesGPUSpawner.privileged = True would make every user pod privileged"),
        (
            {"allow_privilege_escalation": True},
            "c.KubernetesGPUSpawner.allow_privilege_escalation = True lets users gain privileges",
        ),
        (
            {"automount_service_account_token": True},
            "c.KubernetesGPUSpawner.automount_service_account_token = True gives every user pod an API token",
        ),
        ({"uid": 0}, "c.KubernetesGPUSpawner.uid = 0 runs user pods as root"),
        (
            {"volumes": [DOCKER_SOCK]},
            "c.KubernetesGPUSpawner.volumes mounts the node's /var/run/docker.sock (hostPath) into every user pod; "
            "list it in c.KubernetesGPUSpawner.allowed_host_paths if that is meant",
        ),
        ({"volumes": {"docker": DOCKER_SOCK}}, "mounts the node's /var/run/docker.sock"),  # KubeSpawner's dict form
        (
            {"extra_pod_config": {"hostNetwork": True}},
            "c.KubernetesGPUSpawner.extra_pod_config sets hostNetwork, sharing the node's namespaces",
        ),
        ({"extra_pod_config": {"host_pid": True}}, "c.KubernetesGPUSpawner.extra_pod_config sets host_pid"),
        ({"extra_pod_config": {"hostIPC": True}}, "c.KubernetesGPUSpawner.extra_pod_config sets hostIPC"),
    ],
)
def test_a_setting_that_weakens_every_pod_stops_the_hub_with_one_sentence(settings, sentence):
    problems = fleet.check_config(spawner_config(**settings))
    assert len(problems) == 1
    assert sentence in problems[0]


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"privileged": False, "allow_privilege_escalation": False, "automount_service_account_token": False},
        {"uid": 1000, "extra_pod_config": {"hostNetwork": False, "priorityClassName": "students"}},
        {"volumes": [DOCKER_SOCK], "allowed_host_paths": ["/var/run/docker.sock"]},
        {"volumes": [{"name": "scratch", "emptyDir": {}}]},
    ],
)
def test_a_locked_down_config_passes(settings):
    assert fleet.check_config(spawner_config(**settings)) == []


@pytest.mark.parametrize(
    ("section", "name", "value", "words"),
    [
        ("KubeSpawner", "uid", 0, "uid = 0 runs user pods as root"),
        ("KubeSpawner", "allow_privilege_escalation", True, "allow_privilege_escalation = True"),
        ("KubeSpawner", "volumes", [DOCKER_SOCK], "mounts the node's /var/run/docker.sock"),
    ],
)
def test_settings_made_for_kubespawner_are_checked_too(section, name, value, words):
    # Zero to JupyterHub's jupyterhub_config.py writes singleuser.* values to c.KubeSpawner, which
    # KubernetesGPUSpawner inherits: the hub must refuse them at start, not fail every spawn later.
    c = Config()
    setattr(c[section], name, value)
    problems = fleet.check_config(c)
    assert len(problems) == 1
    assert words in problems[0]


def test_our_section_overrides_kubespawners_as_traitlets_does():
    c = Config()
    c.KubeSpawner.uid = 0
    c.KubernetesGPUSpawner.uid = 1000  # what the spawner runs with
    assert fleet.check_config(c) == []


# -- the start report a pod may send -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"node": "n1", "gpus": ["GPU-4f0c…", "MIG-2b1e…"]},
        {"node": "n1", "gpus": []},  # a CPU-only pod
        {"node": "n" * 256, "gpus": ["G" * 256] * MAX_GPUS},
    ],
)
def test_a_good_start_report_is_taken_as_it_is(body):
    assert read_report(body) == body


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ([{"node": "n1"}], "the start report must be a JSON object with node and gpus"),
        ("n1", "the start report must be a JSON object with node and gpus"),
        (None, "the start report must be a JSON object with node and gpus"),
        (
            {"node": "n1", "gpus": [], "port": 1, "cmd": ["sh"]},
            "a start report carries only node and gpus; refused: cmd, port",
        ),
        ({"gpus": []}, "node must be the pod's node name (spec.nodeName)"),
        ({"node": "", "gpus": []}, "node must be the pod's node name (spec.nodeName)"),
        ({"node": 7, "gpus": []}, "node must be the pod's node name (spec.nodeName)"),
        ({"node": "n" * 257, "gpus": []}, "node must be the pod's node name (spec.nodeName)"),
        ({"node": "n1"}, "gpus must be a list of at most 64 GPU UUIDs"),
        ({"node": "n1", "gpus": "GPU-a"}, "gpus must be a list of at most 64 GPU UUIDs"),
        ({"node": "n1", "gpus": ["G"] * 65}, "gpus must be a list of at most 64 GPU UUIDs"),
        ({"node": "n1", "gpus": [0]}, "each entry of gpus must be a GPU UUID (text)"),
        ({"node": "n1", "gpus": ["GPU-a", ""]}, "each entry of gpus must be a GPU UUID (text)"),
        ({"node": "n1", "gpus": ["G" * 257]}, "each entry of gpus must be a GPU UUID (text)"),
        ({"node": "n1", "gpus": [["GPU-a"]]}, "each entry of gpus must be a GPU UUID (text)"),
    ],
)
def test_a_start_report_is_refused_with_the_reason(body, words):
    with pytest.raises(ReportRefusedError) as refused:
        read_report(body)
    assert str(refused.value) == words


# -- the fleet view: nodes and GPU rows -----------------------------------------------------------------------

NODES = {
    "n1": KubeNode("n1", True, True, 2, 2, gpus_requested=2),
    "n2": KubeNode("n2", True, False, 2, 2, gpus_requested=0),  # cordoned
    "cpu1": KubeNode("cpu1", True, True, 0, 0),
    "cpu2": KubeNode("cpu2", False, True, 0, 0),  # its GPUs were taken out, the hub still knows names
}


def test_node_rows_list_gpu_nodes_and_what_pods_reported(monkeypatch):
    monkeypatch.setattr(fleet, "kube_nodes", lambda: NODES)
    rows = fleet.node_rows({"n1": ["GPU-a"], "cpu2": ["GPU-x"]})
    assert rows == [
        {
            "node": "cpu2",
            "ready": False,
            "schedulable": True,
            "gpu_capacity": 0,
            "gpu_allocatable": 0,
            "gpus_requested": 0,
            "reported_uuids": ["GPU-x"],
        },
        {
            "node": "n1",
            "ready": True,
            "schedulable": True,
            "gpu_capacity": 2,
            "gpu_allocatable": 2,
            "gpus_requested": 2,
            "reported_uuids": ["GPU-a"],
        },
        {
            "node": "n2",
            "ready": True,
            "schedulable": False,
            "gpu_capacity": 2,
            "gpu_allocatable": 2,
            "gpus_requested": 0,
            "reported_uuids": [],
        },
    ]
    monkeypatch.setattr(fleet, "kube_nodes", lambda: None)
    assert fleet.node_rows({"n1": ["GPU-a"]}) is None  # the route's 503


def gpu_row(node: str, held: bool) -> dict:
    return {"node": node, "holders": [{"user": "alice", "server": ""}] if held else []}


N1 = {"node_ready": True, "node_schedulable": True, "node_gpus_requested": 2, "node_gpus_outside_workbench": 1}
IDLE_N2 = {"node_ready": True, "node_schedulable": False, "node_gpus_requested": 0, "node_gpus_outside_workbench": 0}
UNKNOWN = {"node_ready": False, "node_schedulable": False, "node_gpus_requested": 0, "node_gpus_outside_workbench": 0}


def test_each_gpu_row_says_what_kubernetes_says_of_its_node(monkeypatch):
    monkeypatch.setattr(fleet, "kube_nodes", lambda: NODES)
    rows = [gpu_row("n1", True), gpu_row("n1", False), gpu_row("n2", False), gpu_row("gone", True)]
    fleet.annotate_kubernetes(rows)
    assert [row["kubernetes"] for row in rows] == [
        # n1: two GPUs requested, one of them by a workbench server: the other is held outside the workbench,
        # counted on n1's GPU without a lease
        {**N1, "held_outside_workbench": False},
        {**N1, "held_outside_workbench": True},
        {**IDLE_N2, "held_outside_workbench": False},
        # a node the API does not list: nothing is known
        {**UNKNOWN, "held_outside_workbench": None},
    ]


def test_gpu_rows_when_the_api_does_not_answer(monkeypatch):
    monkeypatch.setattr(fleet, "kube_nodes", lambda: None)
    rows = [gpu_row("n1", True)]
    fleet.annotate_kubernetes(rows)
    assert rows[0]["kubernetes"] == {**UNKNOWN, "held_outside_workbench": None}


def test_node_reads_are_cached_briefly_and_a_silent_api_is_none(monkeypatch):
    calls: list[str] = []

    def listing(resource):
        calls.append(resource)
        return list(NODES.values())

    now = [1000.0]
    monkeypatch.setattr(fleet.kube_nodes, "clock", lambda: now[0])
    monkeypatch.setattr(fleet.kube_nodes, "_next_read", None)  # nothing read yet
    monkeypatch.setattr(fleet, "list_nodes", listing)
    assert set(fleet.kube_nodes()) == set(NODES)
    assert fleet.kube_nodes() is fleet.kube_nodes()
    assert calls == ["nvidia.com/gpu"]  # a busy admin page asks the API once
    now[0] += 2.0
    assert fleet.kube_nodes() is not None
    assert len(calls) == 2

    def down(resource):
        raise KubernetesUnavailableError("the API server did not answer (timeout)")

    monkeypatch.setattr(fleet, "list_nodes", down)
    now[0] += 2.0
    assert fleet.kube_nodes() is None  # not the last answer: the route says the API is silent
    monkeypatch.setattr(fleet, "list_nodes", listing)
    assert set(fleet.kube_nodes()) == set(NODES)  # asked again at once, not after two seconds


# -- the extension: registered, and each hook wired ---------------------------------------------------------


def test_the_backend_is_installed_under_its_names():
    extension = installed_backends()["kubernetes"]
    assert (extension.name, extension.spawner) == ("kubernetes", "gpu-kubernetes")
    assert extension.configure is configure
    (point,) = entry_points(group="jupyterhub.spawners", name="gpu-kubernetes")
    spawner = point.load()
    assert spawner.__name__ == "KubernetesGPUSpawner"
    assert (spawner.workbench_backend, spawner.placement_mode) == ("kubernetes", "engine")


def test_the_extensions_check_is_the_lock_down_check():
    check = installed_backends()["kubernetes"].check
    assert check(Config()) == []
    assert check(spawner_config(privileged=True)) == [
        "c.KubernetesGPUSpawner.privileged = True would make every user pod privileged"
    ]


def test_setup_hub_adds_the_start_report_route_once_through_extra_handlers():
    from jupyterhub import apihandlers

    from workbench_spawner.backends.kubernetes.report_api import PodReportHandler

    before = list(apihandlers.default_handlers)
    c = Config()
    c.JupyterHub.extra_handlers = [(r"/api/site-route", object)]  # a site's own route stays
    setup = installed_backends()["kubernetes"].setup_hub
    setup(c)
    setup(c)
    assert c.JupyterHub.extra_handlers == [(r"/api/site-route", object), (ROUTE, PodReportHandler)]
    assert apihandlers.default_handlers == before, "JupyterHub's own handler list is never changed"


def test_the_fleet_view_names_gpus_by_what_pods_reported(store, monkeypatch):
    extension = installed_backends()["kubernetes"]
    real = cluster_inventory(list(NODES.values()), "")
    NodeUUIDs(store).accept("n1", ["GPU-a"], 2)
    assert [d.uuid for d in extension.resolve_inventory(store, real).devices] == [
        "GPU-a",
        "K8S-n1-gpu1",
        "K8S-n2-gpu0",
        "K8S-n2-gpu1",
    ]
    monkeypatch.setattr(fleet, "kube_nodes", lambda: NODES)
    rows = [gpu_row("n2", False)]
    extension.annotate_fleet(rows)
    assert rows[0]["kubernetes"]["node_schedulable"] is False


def test_the_service_routes_and_the_openapi_fragment_agree(monkeypatch):
    extension = installed_backends()["kubernetes"]
    patterns = [pattern for pattern, _handler in extension.service_routes("/services/workbench/")]
    assert patterns == ["/services/workbench/api/kubernetes/nodes", r"/services/workbench/api/kubernetes/nodes/([^/]+)"]
    fragment = load_fragment(extension.openapi)
    document = load_document([fragment])
    for ref in set(re.findall(r"'\$ref': '#/([^']+)'", repr(fragment))):  # it leans on the main document's parts
        node = document
        for part in ref.split("/"):
            node = node[part]
    assert set(fragment["paths"]) == {"/api/kubernetes/nodes", "/api/kubernetes/nodes/{name}"}
    node = document["paths"]["/api/kubernetes/nodes/{name}"]["parameters"][0]["schema"]
    assert node["maxLength"] == kubernetes_extension.nodes.max_node  # the fragment's bound is the handler's
    schemas = document["components"]["schemas"]
    monkeypatch.setattr(fleet, "kube_nodes", lambda: NODES)
    row = fleet.node_rows({})[0]
    assert set(schemas["KubernetesNode"]["required"]) == set(row) == set(schemas["KubernetesNode"]["properties"])
    assert document["components"]["schemas"]["GPU"]["properties"]["kubernetes"] == {
        "$ref": "#/components/schemas/KubernetesGPUState"
    }
    annotated = [gpu_row("n1", True)]
    fleet.annotate_kubernetes(annotated)
    state = schemas["KubernetesGPUState"]
    assert set(state["required"]) == set(state["properties"]) == set(annotated[0]["kubernetes"])


def test_the_cli_lists_nodes_and_forgets_one(monkeypatch):
    extension = installed_backends()["kubernetes"]
    monkeypatch.setattr(fleet, "kube_nodes", lambda: NODES)
    assert extension.cli.names == ("kubernetes-nodes", "kubernetes-forget-node")
    parser = argparse.ArgumentParser()
    extension.cli.add_parsers(parser.add_subparsers(dest="area"))
    calls: list[tuple[str, str]] = []

    def call(url, token, method, path):
        calls.append((method, path))
        return {"nodes": fleet.node_rows({"n1": ["GPU-a"]})}

    args = parser.parse_args(["kubernetes-nodes"])
    args.url, args.token = "http://hub/services/workbench/", "t"
    data, text = extension.cli.run(args, call)
    assert text == (
        "n1: 2/2 GPU(s) requested; reported: GPU-a\nn2: 0/2 GPU(s) requested (not schedulable); reported: none yet"
    )
    assert data["nodes"][0]["node"] == "n1"
    forget = parser.parse_args(["kubernetes-forget-node", "gpu node/1"])
    forget.url, forget.token = args.url, args.token
    data, text = extension.cli.run(forget, call)
    assert calls[-1] == ("DELETE", "api/kubernetes/nodes/gpu%20node%2F1")  # the name is one path segment
    assert data is None
    assert text.startswith("The hub forgot the GPU UUIDs of gpu node/1")
