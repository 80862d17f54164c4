"""The docker backend's lock-down cannot be configured away, and says why when it refuses.

One case per refused setting: check_lockdown (what the hub runs at start)
names it in a sentence, a spawn with it is refused with the same sentence, and
listing it in allowed_host_config_keys lets it through both. No Docker Engine:
the create call goes to a fake ``docker()``.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import docker
import pytest
from dockerspawner import DockerSpawner
from jupyterhub.spawner import SpawnException
from traitlets import TraitError
from traitlets.config import Config

from workbench_spawner.backends.docker.spawner import DockerGPUSpawner, check_lockdown
from workbench_spawner.ledger import reasons
from workbench_spawner.policy.gpu_policy import _policies

ALLOW = "c.DockerGPUSpawner.allowed_host_config_keys"

# (setting, value, key that allows it, where the value ends up in the final HostConfig)
REFUSED = [
    ("extra_host_config", {"privileged": True}, "Privileged", ("Privileged", True)),
    ("extra_host_config", {"cap_add": ["SYS_ADMIN"]}, "CapAdd", ("CapAdd", ["SYS_ADMIN"])),
    ("extra_host_config", {"devices": ["/dev/nvidia0:/dev/nvidia0:rwm"]}, "Devices", ("Devices", None)),
    (
        "extra_host_config",
        {"device_cgroup_rules": ["c 195:* rmw"]},
        "DeviceCgroupRules",
        ("DeviceCgroupRules", ["c 195:* rmw"]),
    ),
    (
        "extra_host_config",
        {"sysctls": {"net.ipv4.ip_forward": "1"}},
        "Sysctls",
        ("Sysctls", {"net.ipv4.ip_forward": "1"}),
    ),
    ("extra_host_config", {"pid_mode": "host"}, "PidMode", ("PidMode", "host")),
    ("extra_host_config", {"pid_mode": "container:jupyter-bob"}, "PidMode", ("PidMode", "container:jupyter-bob")),
    ("extra_host_config", {"network_mode": "host"}, "NetworkMode", ("NetworkMode", "host")),
    (
        "extra_host_config",
        {"network_mode": "container:jupyter-bob"},
        "NetworkMode",
        ("NetworkMode", "container:jupyter-bob"),
    ),
    ("extra_host_config", {"ipc_mode": "host"}, "IpcMode", ("IpcMode", "host")),
    ("extra_host_config", {"uts_mode": "host"}, "UTSMode", ("UTSMode", "host")),
    ("extra_host_config", {"userns_mode": "host"}, "UsernsMode", ("UsernsMode", "host")),
    ("extra_host_config", {"cgroupns": "host"}, "CgroupnsMode", ("CgroupnsMode", "host")),
    (
        "extra_host_config",
        {"security_opt": ["no-new-privileges=false"]},
        "SecurityOpt",
        ("SecurityOpt", ["no-new-privileges=false"]),
    ),
    ("extra_host_config", {"security_opt": ["seccomp=unconfined"]}, "SecurityOpt", ("SecurityOpt", None)),
    ("extra_host_config", {"security_opt": ["apparmor:unconfined"]}, "SecurityOpt", ("SecurityOpt", None)),
    ("extra_host_config", {"security_opt": ["label=disable"]}, "SecurityOpt", ("SecurityOpt", None)),
    ("extra_host_config", {"volumes_from": ["jupyter-bob"]}, "VolumesFrom", ("VolumesFrom", ["jupyter-bob"])),
    ("extra_host_config", {"binds": {"/etc": {"bind": "/host-etc", "mode": "ro"}}}, "Binds", ("Binds", None)),
    ("extra_host_config", {"binds": ["/srv:/srv:rw"]}, "Binds", ("Binds", None)),
    ("extra_host_config", {"mounts": [docker.types.Mount("/srv", "/srv", type="bind")]}, "Mounts", ("Mounts", None)),
    ("extra_create_kwargs", {"host_config": {"Privileged": True}}, "Privileged", ("Privileged", True)),
    ("extra_create_kwargs", {"host_config": {"CapAdd": ["NET_ADMIN"]}}, "CapAdd", ("CapAdd", ["NET_ADMIN"])),
    ("extra_create_kwargs", {"host_config": {"PidMode": "host"}}, "PidMode", ("PidMode", "host")),
    ("extra_create_kwargs", {"host_config": {"Devices": [{"PathOnHost": "/dev/sda"}]}}, "Devices", ("Devices", None)),
    ("volumes", {"/home": "/home/jovyan/host-homes"}, "Binds", ("Binds", None)),
    ("read_only_volumes", {"/etc": "/host-etc"}, "Binds", ("Binds", None)),
    ("mounts", [{"type": "bind", "source": "/srv/projects", "target": "/projects"}], "Mounts", ("Mounts", None)),
    ("network_name", "host", "NetworkMode", ("NetworkMode", "host")),
]
IDS = [
    f"{setting}-{'-'.join(map(str, value)) if isinstance(value, dict) else value!s}"[:60]
    for setting, value, *_ in REFUSED
]


def configured(setting, value, section="DockerGPUSpawner", allow=None) -> Config:
    c = Config()
    c[section][setting] = copy.deepcopy(value)
    if allow is not None:
        c.DockerGPUSpawner.allowed_host_config_keys = allow
    return c


@pytest.mark.parametrize(("setting", "value", "key", "final"), REFUSED, ids=IDS)
@pytest.mark.parametrize("section", ["DockerGPUSpawner", "DockerSpawner"])
def test_check_lockdown_refuses_with_a_sentence(setting, value, key, final, section):
    problems = check_lockdown(configured(setting, value, section))
    assert len(problems) == 1, problems
    sentence = problems[0]
    assert sentence.startswith(f"GPU Workbench: c.{section}.{setting}")
    assert f"list {key!r} in {ALLOW} if you mean it." in sentence
    assert ", which " in sentence
    assert sentence.endswith(".")


@pytest.mark.parametrize(("setting", "value", "key", "final"), REFUSED, ids=IDS)
def test_check_lockdown_allows_what_is_listed(setting, value, key, final):
    assert check_lockdown(configured(setting, value, allow=[key])) == []
    if key != "Binds":  # a different key does not allow it
        assert len(check_lockdown(configured(setting, value, allow=["Binds"]))) == 1


def test_check_lockdown_allows_docker_py_spelling():
    assert check_lockdown(configured("extra_host_config", {"cap_add": ["SYS_NICE"]}, allow=["cap_add"])) == []


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("extra_host_config", {"device_requests": [{"Driver": "nvidia", "Count": -1}]}),
        ("extra_create_kwargs", {"host_config": {"DeviceRequests": [{"Driver": "nvidia", "Count": -1}]}}),
        ("volumes", {"/var/run/docker.sock": "/var/run/docker.sock"}),
        ("extra_host_config", {"binds": ["/run/docker.sock:/var/run/docker.sock"]}),
        ("mounts", [{"type": "bind", "source": "/var/run/docker.sock", "target": "/var/run/docker.sock"}]),
    ],
)
def test_never_allowed(setting, value):
    allow = ["Binds", "Mounts", "Privileged"]
    problems = check_lockdown(configured(setting, value, allow=allow))
    assert len(problems) == 1
    assert problems[0].endswith("remove it (this cannot be allowed).")
    assert f"c.DockerGPUSpawner.{setting}" in problems[0]


@pytest.mark.parametrize("name", ["DeviceRequests", "device_requests", "Priviledged", "docker.sock"])
def test_allow_list_entries_are_checked(name):
    problems = check_lockdown(configured("extra_host_config", {}, allow=[name]))
    assert len(problems) == 1
    assert f"{ALLOW} lists {name!r}" in problems[0]


def test_safe_configs_pass():
    assert check_lockdown(Config()) == []
    c = Config()
    # What hub/jupyterhub_config.py sets for the docker backend, and a little more.
    c.DockerGPUSpawner.image = "gpu-workbench/singleuser:latest"
    c.DockerGPUSpawner.network_isolation = False  # a network of the operator's choosing
    c.DockerGPUSpawner.network_name = "gpu-workbench"
    c.DockerGPUSpawner.use_internal_ip = True
    c.DockerGPUSpawner.datasets_volume = "/srv/datasets"  # a host path, mounted read-only
    c.DockerGPUSpawner.volumes = {
        "workbench-home-{username}": "/home/jovyan",
        "scratch-{username}": "/scratch",
        "/srv/datasets": {"bind": "/datasets", "mode": "ro"},
    }
    c.DockerGPUSpawner.read_only_volumes = {"course-material": "/course"}
    c.DockerGPUSpawner.mounts = [
        {"type": "volume", "source": "cache-{username}", "target": "/cache"},
        {"type": "tmpfs", "source": "", "target": "/tmp"},
    ]
    c.DockerGPUSpawner.extra_host_config = {
        "shm_size": "2g",
        "cap_drop": ["ALL"],
        "ipc_mode": "private",
        "security_opt": ["no-new-privileges", "apparmor=docker-default"],
    }
    c.DockerGPUSpawner.extra_create_kwargs = {"user": "1000", "host_config": {"ShmSize": 1 << 30}}
    c.DockerGPUSpawner.mem_limit = "8G"
    assert check_lockdown(c) == []


@pytest.mark.parametrize("network", ["", "gpu-workbench"])
def test_the_hubs_own_docker_config_passes(network, tmp_path):
    from workbench_hub import configurer

    c = Config()
    env = {
        "WORKBENCH_BACKEND": "docker",
        "WORKBENCH_IMAGE": "gpu-workbench/singleuser:latest",
        "WORKBENCH_DOCKER_NETWORK": network,
        "WORKBENCH_DATASETS_VOLUME": "/srv/datasets",
    }
    configurer.update_spawner(c, env, tmp_path, tmp_path, lambda: "172.17.0.1")
    assert check_lockdown(c) == []


def test_datasets_host_path_only_read_only():
    c = configured("volumes", {"/srv/datasets": {"bind": "/datasets", "mode": "rw"}})
    c.DockerGPUSpawner.datasets_volume = "/srv/datasets"
    assert len(check_lockdown(c)) == 1


def test_check_lockdown_reads_lazy_values_and_precedence():
    c = Config()
    c.DockerSpawner.volumes.update({"/etc": "/host-etc"})  # how config files often add a volume
    problems = check_lockdown(c)
    assert len(problems) == 1
    assert "c.DockerSpawner.volumes" in problems[0]
    assert "'/etc'" in problems[0]
    assert "DockerGPUSpawner" not in c  # the check created no section
    # The more specific section wins, as traitlets does it.
    c = configured("extra_host_config", {"privileged": True}, section="DockerSpawner")
    c.DockerGPUSpawner.extra_host_config = {"shm_size": "1g"}
    assert check_lockdown(c) == []


def test_check_lockdown_names_each_problem():
    c = Config()
    c.DockerGPUSpawner.extra_host_config = {"privileged": True, "pid_mode": "host", "binds": ["/:/host"]}
    c.DockerSpawner.network_name = "host"
    problems = check_lockdown(c)
    assert len(problems) == 4
    assert any("c.DockerSpawner.network_name is 'host'" in p for p in problems)


# --- the create path, with a fake docker() ---------------------------------------------


class FakeClient:
    """The one APIClient call create_object makes before docker(): no engine needed."""

    def create_host_config(self, **kwargs):
        return docker.types.HostConfig(version="1.44", **kwargs)


@pytest.fixture
def make_spawner(tmp_path, monkeypatch):
    _policies.clear()
    calls: list[dict] = []

    async def fake_docker(self, method, *args, **kwargs):
        if method == "inspect_image":
            return {"Config": {"Cmd": ["jupyterhub-singleuser"]}}
        calls.append({"method": method, **kwargs})
        return {"Id": "c0ffee"}

    monkeypatch.setattr(DockerSpawner, "docker", fake_docker)
    monkeypatch.setattr(DockerGPUSpawner, "_client", FakeClient(), raising=False)
    # the networks and labelled volumes are made on a real engine (tests/docker); here, none is asked
    monkeypatch.setattr(DockerGPUSpawner, "prepare_tenancy", lambda self: None)

    def make(config: Config | None = None, user: str = "alice") -> DockerGPUSpawner:
        spawner = DockerGPUSpawner(
            config=config or Config(),
            user=SimpleNamespace(name=user, url=f"/user/{user}/", escaped_name=user),
            hub=SimpleNamespace(public_host="", api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/"),
            orm_spawner=SimpleNamespace(name="", server=None),
            gpu_db_url=f"sqlite:///{tmp_path / 'wb.sqlite'}",
            simulated_gpus="2",
        )
        spawner.calls = calls
        return spawner

    yield make
    _policies.clear()


async def test_safe_defaults_are_forced_at_create(make_spawner):
    spawner = make_spawner()
    spawner.gpu_uuids = ["GPU-sim-01-h100-80gb"]
    await spawner.create_object()
    (call,) = spawner.calls
    host = call["host_config"]
    assert host["Privileged"] is False
    assert host["CapDrop"] == ["ALL"]
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert host["DeviceRequests"] == [
        {"Driver": "nvidia", "DeviceIDs": ["GPU-sim-01-h100-80gb"], "Capabilities": [["gpu"]]}
    ]
    sources = sorted(b.split(":")[0] for b in host["Binds"])
    hub = spawner.hub_id()
    assert sources == sorted(
        [f"workbench-{hub}-checkpoints-alice", f"workbench-{hub}-home-alice", "workbench-datasets"]
    )
    assert call["labels"]["workbench.user"] == "alice"
    assert call["labels"]["workbench.hub"] == hub
    assert call["name"] == f"workbench-{hub}-alice"


@pytest.mark.parametrize(("setting", "value", "key", "final"), REFUSED, ids=IDS)
async def test_create_refuses_with_the_same_sentence(make_spawner, setting, value, key, final):
    config = configured(setting, value)
    spawner = make_spawner(config)
    with pytest.raises(SpawnException) as refused:
        await spawner.create_object()
    assert refused.value.message == check_lockdown(config)[0]
    assert spawner.calls == []  # nothing reached the engine


@pytest.mark.parametrize(("setting", "value", "key", "final"), REFUSED, ids=IDS)
async def test_create_lets_through_what_is_listed(make_spawner, setting, value, key, final):
    config = configured(setting, value, allow=[key])
    if key == "NetworkMode":
        config.DockerGPUSpawner.use_internal_ip = True  # docker-py: no port bindings on another's network
    spawner = make_spawner(config)
    await spawner.create_object()
    (call,) = spawner.calls
    host = call["host_config"]
    name, expected = final
    assert name in host
    if expected is not None:
        assert host[name] == expected
    assert host["CapDrop"] == ["ALL"]
    assert host["DeviceRequests"] == []


async def test_create_catches_a_callable_setting(make_spawner):
    """A callable extra_host_config is only known at spawn: the create call is checked."""
    config = Config()
    config.DockerGPUSpawner.extra_host_config = lambda spawner: {"privileged": True}
    assert check_lockdown(config) == []  # cannot be judged at start
    spawner = make_spawner(config)
    with pytest.raises(
        SpawnException,
        match=r"create call of alice's container .* sets Privileged=True, which "
        r"gives the user root on the host; remove it, or list 'Privileged'",
    ):
        await spawner.create_object()
    assert spawner.calls == []


async def test_lock_down_forces_safe_values_behind_the_checks(make_spawner):
    """Even a create call that got past the checks leaves with the safe values."""
    spawner = make_spawner()
    kwargs = {
        "host_config": {
            "Privileged": True,
            "CapAdd": ["SYS_ADMIN"],
            "PidMode": "host",
            "Devices": [{}],
            "SecurityOpt": ["seccomp=unconfined", "apparmor=docker-default"],
            "Binds": ["/var/run/docker.sock:/var/run/docker.sock", "vol:/data:rw"],
            "DeviceRequests": [{"Driver": "nvidia", "Count": -1}],
        }
    }
    spawner._lock_down(kwargs)
    host = kwargs["host_config"]
    assert host["Privileged"] is False
    assert host["CapDrop"] == ["ALL"]
    assert host["DeviceRequests"] == []
    assert "CapAdd" not in host
    assert "PidMode" not in host
    assert "Devices" not in host
    assert host["SecurityOpt"] == ["apparmor=docker-default", "no-new-privileges"]
    assert host["Binds"] == ["vol:/data:rw"]


def test_allow_list_trait_is_validated(make_spawner):
    spawner = make_spawner(configured("extra_host_config", {}, allow=["cap_add", "Binds"]))
    assert spawner.allowed_host_config_keys == {"CapAdd", "Binds"}
    with pytest.raises(TraitError, match="cannot be allowed"):
        spawner.allowed_host_config_keys = {"DeviceRequests"}


@pytest.mark.parametrize("section", ["DockerGPUSpawner", "DockerSpawner"])
def test_a_network_of_ones_own_needs_isolation_off(section):
    """With isolation on (the default) the hub picks each user's network: a configured one would be
    ignored without a word, so the hub refuses to start and says which of the two to change."""
    c = configured("network_name", "lab-net", section)
    (problem,) = check_lockdown(c)
    assert problem.startswith(f"GPU Workbench: c.{section}.network_name is 'lab-net'")
    assert "network_isolation = False" in problem
    c.DockerGPUSpawner.network_isolation = False
    assert check_lockdown(c) == []


@pytest.mark.parametrize(
    ("inspected", "reason"),
    [
        ({"State": {"Status": "exited", "ExitCode": 137, "OOMKilled": True}}, reasons.OUT_OF_MEMORY),
        ({"State": {"Status": "exited", "ExitCode": 137, "OOMKilled": False}}, reasons.SERVER_EXITED),
        (None, reasons.SERVER_EXITED),  # the container is gone already
    ],
)
async def test_a_container_killed_for_memory_is_recorded_as_out_of_memory(make_spawner, monkeypatch, inspected, reason):
    spawner = make_spawner()

    async def inspect(self):
        return inspected

    async def docker(self, method, *args, **kwargs):
        assert method == "logs"
        return b"Traceback...\nMemoryError\n"

    monkeypatch.setattr(DockerSpawner, "get_object", inspect)
    monkeypatch.setattr(DockerSpawner, "docker", docker)
    ending = await spawner.gpu_exit_reason()
    assert ending.reason == reason
