"""The GPU policy's effective settings, resolved once by the hub and stored.

The spawner reads its traits (config file, local config file, environment
defaults); the workbench service runs in another process and must enforce and
show exactly the same numbers. Before, the service re-derived them from
environment variables and drifted: a ``default_max_gpus`` set as a trait was
enforced at spawn but shown as 1 on the admin page, a ``gpu_db_url`` trait
made the service write quotas to another database, ``static_gpus`` never
reached it. Now the hub resolves the settings once at start, from the
spawner class's own traits, and writes them to one row of the GPU database
(``workbench_settings``); the service reads that row and nothing else. Only
the database URL itself travels on the service's command line.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import select
from traitlets import List, Unicode
from traitlets.config import Config, Configurable

from workbench_devices import DeviceInventory, DeviceSpecError, GPUDevice, discover_devices
from workbench_devices.inventory import counted
from workbench_devices.mig import is_profile_name, profiles_of
from workbench_spawner.config_sections import read_as
from workbench_spawner.ledger.settings_table import SettingsRow
from workbench_spawner.ledger.store import AllocationStore, _aware, utcnow
from workbench_spawner.policy.spawn_limits import SpawnLimits, derive_spawn_limits
from workbench_spawner.rules.admission import image_refusal
from workbench_spawner.rules.quota import Quota

if TYPE_CHECKING:
    from workbench_spawner.mixin import GPUSpawnerMixin
    from workbench_spawner.policy.config import GPUPolicyConfig

log = logging.getLogger("workbench.policy")

POLICY_KEY = "policy"


@dataclass(frozen=True)
class PolicySettings:
    """What every part of the GPU policy must agree on."""

    db_url: str
    inventory: DeviceInventory
    servers_per_gpu: int = 1
    # Servers per device where it differs from ``servers_per_gpu``: keyed by a device's UUID, a MIG
    # profile or a model (``slots_for``: the first that names the device wins, in that order).
    servers_per_device: Mapping[str, int] = field(default_factory=dict)
    default_quota: Quota = field(default_factory=lambda: Quota(max_gpus=1))
    queue_timeout: float = 300.0
    cpu_servers_allowed: bool = True
    quota_contact: str = "a hub admin"
    # The node this hub places GPUs on (single host: its host name).
    node: str = field(default_factory=socket.gethostname)
    backend: str = ""
    # "host" (the hub places GPUs: local, docker) or "engine" (Slurm, Kubernetes place them): what a drain can do.
    placement: str = "host"
    # Reservations and the wait list (queue_order.py, reservations.py, clock.py).
    queue_order: str = "fifo"
    queue_aging_minutes: float = 30.0
    time_zone: str = "UTC"
    test_clock_file: str = ""
    # Idle-GPU reclaim (idle.py, idle_config.py); 0 minutes: off unless a quota sets it.
    gpu_idle_minutes: float = 0.0
    gpu_idle_threshold: float = 5.0
    gpu_idle_warn_minutes: float = 10.0
    simulated_utilization: str = ""
    # dcgm-exporter /metrics URLs: where a MIG slice's utilization comes from (service/dcgm.py).
    dcgm_exporter_urls: tuple[str, ...] = ()
    # How often the hub's reconciler compares the ledger with the running servers (GPUPolicy.reconcile); 0: no timer.
    reconcile_seconds: float = 30.0
    # A class start (spawn_limits.py): spawns that may wait at once; servers started at once (0: derived).
    max_waiting: int = 1000
    max_starting: int = 0

    @property
    def simulated(self) -> bool:
        return self.inventory.source == "simulated"

    def slots_for(self, device: GPUDevice) -> int:
        """How many servers may share ``device``: by its UUID, else its MIG profile, else its model
        (``servers_per_device``), else ``servers_per_gpu``."""
        given = {key.lower(): count for key, count in self.servers_per_device.items()}  # T4-16GB or t4-16gb
        for key in (device.uuid, device.profile if device.mig else None, device.model):
            if key and key.lower() in given:
                return max(1, int(given[key.lower()]))
        return max(1, self.servers_per_gpu)

    def unmatched_slot_keys(self) -> list[str]:
        """The ``servers_per_device`` keys that name no GPU, MIG profile or model of the inventory: a typo,
        or a GPU that is not here now. They share nothing, and the hub says so at start."""
        names = {n.lower() for d in self.inventory.devices for n in (d.uuid, d.profile, d.model) if n}
        return [key for key in self.servers_per_device if key.lower() not in names]

    def slots(self) -> dict[str, int]:
        """Servers per device, by UUID, for every device of the inventory."""
        return {d.uuid: self.slots_for(d) for d in self.inventory.devices}

    def spawn_limits(self, cores: int | None = None) -> SpawnLimits:
        """How many spawns may wait and servers start at once, from these settings (spawn_limits.py):
        every device counts once per server it takes (a time-sliced GPU as its shares)."""
        return derive_spawn_limits(sum(self.slots().values()), cores, self.max_waiting, self.max_starting)

    def models(self) -> list[str]:
        """Every model of this hub, of whole GPUs and of GPUs cut into slices (a model rule covers both)."""
        return sorted({d.model for d in self.inventory.devices if d.model})

    def whole_models(self) -> list[str]:
        """The models of the whole GPUs (what ``gpu_model`` alone asks for)."""
        return sorted({d.model for d in self.inventory.devices if d.model and not d.mig})

    def slices(self) -> dict[str, dict[str, int]]:
        """The MIG slices, counted by profile and model: ``{"1g.18gb": {"H200-141GB": 7}}``."""
        counts: dict[str, dict[str, int]] = {}
        for device in self.inventory.devices:
            if device.mig:
                by_model = counts.setdefault(device.profile, {})
                by_model[device.model] = by_model.get(device.model, 0) + 1
        return counts

    def to_json(self) -> dict[str, Any]:
        return {
            "db_url": _redact(self.db_url),
            "inventory": {
                "source": self.inventory.source,
                "message": self.inventory.message,
                "devices": [asdict(d) for d in self.inventory.devices],
            },
            "servers_per_gpu": self.servers_per_gpu,
            "servers_per_device": dict(self.servers_per_device),
            "default_quota": self.default_quota.to_json(),
            "queue_timeout": self.queue_timeout,
            "cpu_servers_allowed": self.cpu_servers_allowed,
            "quota_contact": self.quota_contact,
            "node": self.node,
            "backend": self.backend,
            "placement": self.placement,
            "queue_order": self.queue_order,
            "queue_aging_minutes": self.queue_aging_minutes,
            "time_zone": self.time_zone,
            "test_clock_file": self.test_clock_file,
            "gpu_idle_minutes": self.gpu_idle_minutes,
            "gpu_idle_threshold": self.gpu_idle_threshold,
            "gpu_idle_warn_minutes": self.gpu_idle_warn_minutes,
            "simulated_utilization": self.simulated_utilization,
            "dcgm_exporter_urls": list(self.dcgm_exporter_urls),
            "reconcile_seconds": self.reconcile_seconds,
            "max_waiting": self.max_waiting,
            "max_starting": self.max_starting,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], db_url: str) -> PolicySettings:
        inv = data.get("inventory") or {}
        devices = [GPUDevice(**d) for d in inv.get("devices") or []]
        quota = data.get("default_quota") or {}
        models = quota.get("allowed_models")
        return cls(
            db_url=db_url,
            inventory=DeviceInventory(inv.get("source", "none"), devices, inv.get("message", "")),
            servers_per_gpu=int(data.get("servers_per_gpu", 1)),
            servers_per_device={str(k): int(v) for k, v in (data.get("servers_per_device") or {}).items()},
            default_quota=Quota(
                max_gpus=int(quota.get("max_gpus", 1)),
                gpu_hours_per_week=quota.get("gpu_hours_per_week"),
                allowed_models=tuple(models) if models is not None else None,
                max_session_hours=quota.get("max_session_hours"),
            ),
            queue_timeout=float(data.get("queue_timeout", 300.0)),
            cpu_servers_allowed=bool(data.get("cpu_servers_allowed", True)),
            quota_contact=str(data.get("quota_contact", "a hub admin")),
            node=str(data.get("node", "")),
            backend=str(data.get("backend", "")),
            placement=str(data.get("placement") or "host"),  # rows stored before it existed: host
            queue_order=str(data.get("queue_order", "fifo")),
            queue_aging_minutes=float(data.get("queue_aging_minutes", 30.0)),
            time_zone=str(data.get("time_zone", "UTC")),
            test_clock_file=str(data.get("test_clock_file", "")),
            gpu_idle_minutes=float(data.get("gpu_idle_minutes", 0.0)),
            gpu_idle_threshold=float(data.get("gpu_idle_threshold", 5.0)),
            gpu_idle_warn_minutes=float(data.get("gpu_idle_warn_minutes", 10.0)),
            simulated_utilization=str(data.get("simulated_utilization", "")),
            dcgm_exporter_urls=tuple(str(url) for url in data.get("dcgm_exporter_urls") or ()),
            reconcile_seconds=float(data.get("reconcile_seconds", 30.0)),
            max_waiting=int(data.get("max_waiting", 1000)),
            max_starting=int(data.get("max_starting", 0)),
        )


def _redact(url: str) -> str:
    """The URL without its password: the row is readable by whoever reads the database."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):  # not a URL SQLAlchemy reads: nothing to show
        return ""


def store_policy_settings(store: AllocationStore, settings: PolicySettings) -> None:
    """Write the hub's resolved settings (replacing what an earlier start wrote)."""
    with store.writes().begin() as session:
        row = session.get(SettingsRow, POLICY_KEY)
        if row is None:
            row = SettingsRow(key=POLICY_KEY)
            session.add(row)
        row.value = json.dumps(settings.to_json())
        row.updated = utcnow()


def load_policy_settings(store: AllocationStore) -> tuple[PolicySettings, datetime] | None:
    """The settings the hub stored, and when; None before any hub wrote them."""
    with store.reads()() as session:
        row = session.scalar(select(SettingsRow).where(SettingsRow.key == POLICY_KEY))
        if row is None:
            return None
        return PolicySettings.from_json(json.loads(row.value), store.url), _aware(row.updated)


# -- resolving the settings from a spawner's traits -------------------------------------

_inventories: dict[tuple, DeviceInventory] = {}


def discover_inventory(static_gpus: list[dict], simulated_gpus: str, fresh: bool = False) -> DeviceInventory:
    """The GPUs this hub hands out: ``static_gpus`` if set, else simulated, else NVML.

    Discovered once per process and arguments: NVML is asked once, and the
    hub's banner, its spawners and the stored settings see one answer;
    ``fresh`` asks again and keeps the new answer (``inventory_refresh``).
    Raises ValueError with a sentence for an operator.
    """
    key = (json.dumps(static_gpus, sort_keys=True, default=str), simulated_gpus)
    if key in _inventories and not fresh:
        return _inventories[key]
    if static_gpus:
        devices = []
        for i, entry in enumerate(static_gpus):
            if not isinstance(entry, dict) or "uuid" not in entry or "name" not in entry:
                raise ValueError(f"static_gpus entry {i} needs 'uuid' and 'name': {entry!r}")
            profile = str(entry.get("profile") or "").strip().lower()
            if profile and not is_profile_name(profile):
                raise ValueError(
                    f"static_gpus entry {i}: profile {profile[:30]!r} is not a MIG profile; "
                    "profiles read like 1g.18gb or 3g.71gb"
                )
            known = profiles_of(str(entry.get("model", "")))
            if profile and known and profile not in known:
                raise ValueError(
                    f"static_gpus entry {i}: the model {str(entry['model']).upper()} has no MIG profile {profile!r}; "
                    f"its profiles are {', '.join(known)}"
                )
            try:
                devices.append(
                    GPUDevice(
                        uuid=str(entry["uuid"]),
                        index=int(entry.get("index", i)),
                        name=str(entry["name"]),
                        memory_total_bytes=int(entry.get("memory_total_bytes", 0)),
                        model=str(entry.get("model", "")),
                        mig=bool(profile),
                        profile=profile,
                        parent_uuid=str(entry.get("parent_uuid") or ""),
                        gpu_instance_id=_instance_id(i, entry.get("gpu_instance_id")),
                    )
                )
            except _StaticEntryError:
                raise
            except (TypeError, ValueError) as exc:
                raise ValueError(
                    f"static_gpus entry {i}: index and memory_total_bytes must be whole numbers ({exc})"
                ) from None
        if len({d.uuid for d in devices}) != len(devices):
            raise ValueError("static_gpus names the same GPU UUID twice")
        both = sorted({d.parent_uuid for d in devices if d.mig} & {d.uuid for d in devices if not d.mig})
        if both:
            # In MIG mode a GPU is reached only through its slices: listing it whole too would hand it out twice.
            raise ValueError(
                f"static_gpus lists {both[0]} as a whole GPU and as the parent of MIG slices; a GPU in MIG "
                "mode is handed out only as its slices: list it or its slices, not both"
            )
        inventory = DeviceInventory("static", devices, f"{counted(devices)} from the static_gpus setting")
    else:
        try:
            inventory = discover_devices(simulated_gpus)
        except DeviceSpecError as exc:
            raise ValueError(str(exc)) from None
    _inventories[key] = inventory
    return inventory


def _instance_id(entry: int, value: object) -> int | None:
    """A static slice's ``gpu_instance_id`` (DCGM's ``GPU_I_ID``), if given; ValueError with a sentence if it is
    not a whole number (raised past the caller's catch-all, which words index and memory errors)."""
    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    raise _StaticEntryError(
        f"static_gpus entry {entry}: gpu_instance_id must be a whole number (the slice's GPU_I_ID), not {value!r}"
    )


class _StaticEntryError(ValueError):
    """A static_gpus entry's error already worded for the operator."""


def resolve_policy_settings(spawner: GPUPolicyConfig, backend: str | None = None) -> PolicySettings:
    """The effective settings from a GPU spawner's traits (or a GPUPolicyConfig's)."""
    return PolicySettings(
        db_url=spawner.gpu_db_url,
        inventory=discover_inventory(list(spawner.static_gpus), spawner.simulated_gpus),
        servers_per_gpu=max(1, int(spawner.servers_per_gpu)),
        servers_per_device={str(k): max(1, int(v)) for k, v in dict(spawner.servers_per_device).items()},
        default_quota=Quota(max_gpus=int(spawner.default_max_gpus)),
        queue_timeout=float(spawner.gpu_queue_timeout),
        cpu_servers_allowed=bool(spawner.cpu_servers_allowed),
        quota_contact=str(spawner.quota_contact),
        node=spawner.gpu_node,
        backend=backend if backend is not None else getattr(spawner, "workbench_backend", ""),
        placement=getattr(spawner, "placement_mode", "host"),  # a spawner's own; publish passes its class's
        queue_order=str(spawner.gpu_queue_order),
        queue_aging_minutes=float(spawner.gpu_queue_aging_minutes),
        time_zone=str(spawner.gpu_time_zone),
        test_clock_file=str(spawner.gpu_test_clock_file),
        gpu_idle_minutes=float(spawner.gpu_idle_minutes),
        gpu_idle_threshold=float(spawner.gpu_idle_threshold),
        gpu_idle_warn_minutes=float(spawner.gpu_idle_warn_minutes),
        simulated_utilization=str(spawner.simulated_utilization),
        dcgm_exporter_urls=tuple(getattr(spawner, "dcgm_exporter_urls", ()) or ()),
        reconcile_seconds=float(getattr(spawner, "reconcile_seconds", 30.0)),
        max_waiting=int(getattr(spawner, "max_waiting_spawns", 1000)),
        max_starting=int(getattr(spawner, "max_starting_servers", 0)),
    )


def spawner_class_from(config: Config) -> type:
    """The class ``c.JupyterHub.spawner_class`` names (entry-point name, import string or class)."""
    from jupyterhub.app import JupyterHub

    value = config.JupyterHub.get("spawner_class", "gpu-local")
    if isinstance(value, type):
        return value
    # JupyterHub's own EntryPointType resolves "gpu-local" and "module.Class" alike.
    cls: type = JupyterHub.class_traits()["spawner_class"].validate(None, value)
    return cls


def spawner_gpu_class(config: Config) -> type[GPUSpawnerMixin]:
    """The configured spawner class, checked to keep the backend contract (ValueError with sentences)."""
    from workbench_spawner.contract import contract_problems
    from workbench_spawner.policy.config import GPUPolicyConfig

    cls = spawner_class_from(config)
    if not issubclass(cls, GPUPolicyConfig):
        raise ValueError(
            f"c.JupyterHub.spawner_class = {cls.__name__} is not a GPU Workbench spawner "
            "(gpu-local, gpu-docker, gpu-slurm)"
        )
    problems = contract_problems(cls)
    if problems:
        raise ValueError(
            f"c.JupyterHub.spawner_class = {cls.__name__} does not keep the backend contract: " + " ".join(problems)
        )
    return cast("type[GPUSpawnerMixin]", cls)  # a GPU policy class that keeps the contract: a backend's spawner


def image_choice_problem(config: Config, spawner_class: type[Configurable]) -> str:
    """The sentence that stops the hub when ``offered_images`` is set for a backend that runs no picked image
    (local, slurm: the form would offer a choice the server then ignores); empty when all is well.

    Read as ``spawner_class`` would read it (its config sections and its bases'), without making a spawner."""
    if getattr(spawner_class, "runs_picked_images", True):
        return ""

    class Images(Configurable):
        offered_images = List(Unicode(), help="The spawner's offered_images, as it would read them.").tag(config=True)

    offered = read_as(Images, spawner_class, config).offered_images
    if not offered:
        return ""
    backend = getattr(spawner_class, "workbench_backend", "") or spawner_class.__name__
    refusal = image_refusal(backend, getattr(spawner_class, "server_environment", "one Python environment"))
    return (
        f"{spawner_class.__name__}.offered_images (WORKBENCH_IMAGES) is set to {', '.join(offered)}, but "
        f"{refusal[0].lower()}{refusal[1:]} Remove it: "
        f"an image choice needs the docker or kubernetes backend."
    )


def publish_policy_settings(config: Config, cls: type[GPUSpawnerMixin] | None = None) -> PolicySettings:
    """Resolve the configured spawner's settings and store them for the workbench service.

    Called by the hub's config file after every config file is loaded, so
    settings made only in ``jupyterhub_config.local.py`` count. The values
    are read through a ``GPUPolicyConfig`` that loads the config sections of
    the spawner class and all its bases (``c.Spawner``, ``c.GPUSpawnerMixin``,
    ``c.LocalGPUSpawner``...), most specific last, as the spawner would:
    no spawner is made, since a spawner needs a user.
    """
    from dataclasses import replace

    from workbench_spawner.policy.config import GPUPolicyConfig

    spawner_class = cls or spawner_gpu_class(config)  # the hub config passes the class it checked already
    problem = image_choice_problem(config, spawner_class)
    if problem:
        raise ValueError(problem)

    policy_config = read_as(GPUPolicyConfig, spawner_class, config)
    backend, mode = spawner_class.workbench_backend, spawner_class.placement_mode
    settings = replace(resolve_policy_settings(policy_config, backend=backend), placement=mode)
    if mode == "engine":
        # An engine knows the cluster's GPUs (Slurm's node records), not this host.
        settings = replace(settings, inventory=spawner_class.engine_inventory(policy_config), node="")
    unmatched = settings.unmatched_slot_keys() if settings.placement == "host" else []
    if unmatched:
        log.warning(
            "servers_per_device (WORKBENCH_SERVERS_PER_GPU) names no GPU model, MIG profile or GPU UUID of "
            "this hub in %s (it has %s): no GPU is time-sliced by that",
            ", ".join(repr(k) for k in unmatched),
            settings.inventory.message,
        )
    store = AllocationStore(settings.db_url)
    try:
        store_policy_settings(store, settings)
    finally:
        store.dispose()
    return settings
