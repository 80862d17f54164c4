"""The docker backend: one container per user server, pinned by GPU UUID.

DockerSpawner does the container work; this class adds what GPU Workbench
promises about every user container:

* a Docker device request (driver ``nvidia``) for exactly the leased UUIDs,
  so the NVIDIA runtime sets ``NVIDIA_VISIBLE_DEVICES`` to them; a CPU-only
  container gets ``NVIDIA_VISIBLE_DEVICES=void`` so an image that says
  ``all`` (the PyTorch images do) still sees no GPU;
* labels ``workbench.user``, ``workbench.server``, ``workbench.gpus`` and
  ``workbench.hub`` (this hub's id, also in every container, volume and
  network name), which is how a restarted hub recognises its containers and
  only its own;
* a network that only the hub and the proxy share with the container
  (``tenancy.py``: inter-container traffic off, or a network per user);
* a named volume per user for the home, a read-only datasets volume, a
  writable per-user checkpoints volume;
* no Docker socket, no privileged mode, every capability dropped and
  ``no-new-privileges``.

The lock-down cannot be configured away by accident (the rules are in
``lockdown.py``). Settings that would
undo it (privileged mode, added capabilities, host devices, the host's
PID/network/IPC/UTS/user/cgroup namespaces, security options that turn off
no-new-privileges, seccomp, AppArmor or SELinux, sysctls, another
container's volumes, host paths mounted through ``volumes``,
``read_only_volumes``, ``mounts`` or binds) are refused twice:

* at hub start, by :func:`check_lockdown` on the loaded config (the hub
  configuration prints each sentence and exits 2);
* at every spawn, on the spawner's own settings and on the final create call
  (so a callable ``extra_host_config``, a hook or a subclass cannot slip one
  through): the spawn fails with the same sentence.

An operator who means it lists the setting in
``c.DockerGPUSpawner.allowed_host_config_keys``. Two things cannot be
allowed: the Docker socket (root on the host for anyone who can reach it) and
device requests (they would replace the ones made from the GPU lease).

Reconcile rule after a hub restart: a lease whose container is gone is
released. A running container labelled with this hub's id and without a lease
is adopted (its GPUs are leased to it again) when none of its GPUs is held by
another server, and stopped otherwise, because its GPUs belong to someone else
now. Containers of other hubs on the same engine are never looked at. With the
hub in a container, it joins its running users' networks again (a recreated
hub container has lost them).
"""

from __future__ import annotations

import asyncio
import copy
import os
from collections.abc import Mapping
from typing import Any

import docker
from docker import DockerClient
from dockerspawner import DockerSpawner
from jupyterhub.spawner import SpawnException
from traitlets import Set, TraitError, Unicode, default, validate
from traitlets.config import Config, LazyConfigValue

from workbench_spawner.backends.docker import tenancy
from workbench_spawner.backends.docker.ending import ContainerEnding, container_ending
from workbench_spawner.backends.docker.isolation import TenantIsolation
from workbench_spawner.backends.docker.lockdown import (
    LOCKED_SETTINGS,
    RISKS,
    _shares_namespace,
    _unsafe_security_opt,
    canonical_allowed,
    host_config_problems,
    settings_problems,
)
from workbench_spawner.backends.docker.tenancy import LABEL_GPUS, LABEL_HUB, LABEL_SERVER, LABEL_USER
from workbench_spawner.form.options import SpawnRequest
from workbench_spawner.ledger.hub_identity import hub_id
from workbench_spawner.ledger.reconcile_book import SERVER_ADOPTED, SERVER_STOPPED
from workbench_spawner.ledger.store import Lease
from workbench_spawner.mixin import GPUSpawnerMixin

__all__ = [
    "LABEL_GPUS",
    "LABEL_HUB",
    "LABEL_SERVER",
    "LABEL_USER",
    "DockerGPUSpawner",
    "check_lockdown",
    "container_ending",
]


def _empty_like(trait_name: str) -> Any:
    return [] if trait_name in ("mounts",) else set() if trait_name == "allowed_host_config_keys" else {}


def check_lockdown(config: Config) -> list[str]:
    """Every way ``config`` undoes the lock-down of user containers, one sentence each.

    For the hub configuration to call at start, when an empty list means the
    lock-down holds and anything else should be printed and end the hub with
    exit 2: a spawner's own checks only run when a user spawns, which is too
    late to find out that the hub is misconfigured.

    Reads the values the way traitlets would give them to a DockerGPUSpawner:
    every section of its class hierarchy (``c.Spawner``, ``c.DockerSpawner``,
    ``c.DockerGPUSpawner``...), the more specific one winning, and lazy
    ``c.DockerSpawner.volumes.update(...)`` values applied to an empty start
    (the defaults hold only named volumes). Each sentence names the section
    that set the value. The config is not changed.
    """
    merged, owners = Config(), {}
    for section in DockerGPUSpawner.section_names():
        if config._has_section(section):
            part = copy.deepcopy(config[section])
            merged.merge(part)
            for name in part:
                owners[name] = f"c.{section}"
    values: dict[str, Any] = {}
    for name in (*LOCKED_SETTINGS, "allowed_host_config_keys", "datasets_volume"):
        if name in merged:
            value = merged[name]
            values[name] = value.get_value(_empty_like(name)) if isinstance(value, LazyConfigValue) else value
    allowed, problems = canonical_allowed(values.get("allowed_host_config_keys") or ())
    datasets = values.get("datasets_volume", DockerGPUSpawner.class_traits()["datasets_volume"].default_value)
    problems += settings_problems(values, owners, allowed, datasets)
    network = values.get("network_name")
    if network and not _shares_namespace(network) and merged.get("network_isolation", True) is not False:
        # Isolation picks each user's network itself; a configured one would be silently ignored.
        problems.append(
            f"GPU Workbench: {owners['network_name']}.network_name is {network!r}, but the hub puts each user "
            "on a network of its own choosing (network_isolation, on by default: users cannot reach each "
            "other). Remove network_name, or set c.DockerGPUSpawner.network_isolation = False to put every "
            "user on that network (where they can reach each other)."
        )
    return problems


class DockerGPUSpawner(ContainerEnding, TenantIsolation, GPUSpawnerMixin, DockerSpawner):
    """DockerSpawner with GPU leases, device requests and locked-down containers (host placement)."""

    workbench_backend = "docker"
    placement_mode = "host"
    runs_picked_images = True

    enforces_resource_limits = True  # Docker's memory limit and CPU quota

    datasets_volume = Unicode(
        "workbench-datasets",
        help="""
        Named volume (or host path) with shared datasets, mounted read-only at
        ``/datasets`` in every user container. Empty: no datasets mount.
        """,
    ).tag(config=True)

    home_volume_template = Unicode(
        "workbench-{hub}-home-{username}",
        help="""
        Named volume that holds a user's home (``/home/jovyan``). It survives
        stop, container removal and image upgrades. ``{hub}`` is this hub's
        id, so two hubs on one Docker engine never share a home; a home made
        before hub ids (``workbench-home-{username}``) is moved into this name
        the first time its user starts a server. ``{username}`` is
        DockerSpawner's escape of the user name, which is collision-free
        (``[a-z0-9]`` kept, every other byte, ``-`` included, written as
        ``-`` and two hex digits), so two users never share a volume. Add
        ``--{servername}`` for one home per named server: ``--`` never occurs
        in an escaped name, so the two parts cannot run into each other.
        """,
    ).tag(config=True)

    checkpoints_volume_template = Unicode(
        "workbench-{hub}-checkpoints-{username}",
        help="""
        Named volume mounted writable at ``/checkpoints``, for model
        checkpoints kept apart from the home (and easy to size or back up
        separately). Empty: none.
        """,
    ).tag(config=True)

    allowed_host_config_keys = Set(
        Unicode(),
        help="""
        Lock-down settings this hub lets through, by Docker Engine API name:
        any of ``Privileged``, ``CapAdd``, ``Devices``, ``DeviceCgroupRules``,
        ``Sysctls``, ``PidMode``, ``NetworkMode``, ``IpcMode``, ``UTSMode``,
        ``UsernsMode``, ``CgroupnsMode``, ``SecurityOpt``, ``VolumesFrom``,
        ``Binds`` (host paths in ``volumes``, ``read_only_volumes`` or binds)
        and ``Mounts`` (bind mounts in ``mounts``). The docker-py spelling
        (``cap_add``) is accepted too.

        Empty (the default), the hub refuses to start, and a spawn is refused,
        when ``extra_host_config``, ``extra_create_kwargs``, ``volumes``,
        ``read_only_volumes``, ``mounts`` or ``network_name`` set one of them,
        because each lets a user out of their container: privileged mode or an
        added capability is root on the host, a host device or device rule
        bypasses the GPU pinning, a host namespace shows the host's processes
        or network (the hub's API included), a host path hands over the host's
        files. List one only for a hub whose users are trusted with it, such
        as a single-user workstation that needs a host folder::

            c.DockerGPUSpawner.volumes = {"/srv/projects": "/home/jovyan/projects"}
            c.DockerGPUSpawner.allowed_host_config_keys = {"Binds"}

        A listed setting is passed through as configured; everything else is
        still forced to its safe value. The Docker socket and device requests
        cannot be listed: the first is root on the host for everyone, the
        second would replace the GPU lease's device request. The datasets
        volume may be a host path without listing anything, as it is mounted
        read-only.
        """,
    ).tag(config=True)

    @validate("allowed_host_config_keys")
    def _validate_allowed_host_config_keys(self, proposal):
        allowed, problems = canonical_allowed(proposal.value)
        if problems:
            raise TraitError(" ".join(problems))
        return allowed

    def lockdown_problems(self, create_kwargs: Mapping[str, Any] | None = None) -> list[str]:
        """Sentences for each lock-down breach in this spawner's settings or create call.

        The settings are checked first, so a sentence names the setting as
        check_lockdown does at hub start; the final ``create_container``
        arguments only when the settings are clean, to catch what a callable
        ``extra_host_config``, a hook or a subclass added.
        """
        owner = f"c.{type(self).__name__}"
        settings = {name: getattr(self, name) for name in LOCKED_SETTINGS}
        allowed = set(self.allowed_host_config_keys)
        problems = settings_problems(settings, {name: owner for name in settings}, allowed, self.datasets_volume)
        if not problems and create_kwargs is not None:
            where = (
                f"the create call of {self.user.name}'s container (from a callable extra_host_config "
                f"or extra_create_kwargs, a hook or a subclass)"
            )
            problems = host_config_problems(
                create_kwargs.get("host_config") or {}, where, allowed, self.datasets_volume
            )
        return problems

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The image the site configured, kept: each start runs the pick or this (a pick is not sticky).
        self._configured_image: str = self.image

    @default("volumes")
    def _default_volumes(self):
        volumes: dict = {self.home_volume_template: "/home/jovyan"}
        if self.checkpoints_volume_template:
            volumes[self.checkpoints_volume_template] = "/checkpoints"
        if self.datasets_volume:
            volumes[self.datasets_volume] = {"bind": "/datasets", "mode": "ro"}
        return volumes

    @default("remove")
    def _default_remove(self):
        # Containers are cattle: the home is in a volume, so a stopped
        # container can go, and the next start uses the current image.
        return True

    @default("image")
    def _default_image(self):
        return os.environ.get("WORKBENCH_IMAGE", "gpu-workbench/singleuser:latest")

    @default("allowed_images")
    def _default_allowed_images(self):
        # DockerSpawner checks user_options["image"] against this itself; keep
        # it in step with the images our form offers.
        return {image: image for image in self.offered_images}

    def apply_gpu_request(self, request: SpawnRequest) -> None:
        """The image the user picked (one of ``offered_images``: admission checked it) runs; without a pick, the
        configured ``image`` (DockerSpawner keeps ``self.image``: a pick of an earlier start must not carry over
        to this one)."""
        self.image = request.image or self._configured_image

    def gpu_environment(self, uuids: list[str]) -> dict[str, str]:
        env = {"NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
        if not uuids:
            env["NVIDIA_VISIBLE_DEVICES"] = "void"
        return env

    async def create_object(self):
        # Refuse on the settings before DockerSpawner builds anything from
        # them (docker-py would otherwise fail first on some, with a message
        # that does not say why the setting is a problem).
        self._refuse_breaches(self.lockdown_problems())
        try:
            await asyncio.to_thread(self.prepare_tenancy)
        except tenancy.TenancyError as exc:
            raise SpawnException(f"{exc}", reason="tenancy", status_code=500) from None
        return await super().create_object()

    def _refuse_breaches(self, problems: list[str]) -> None:
        if problems:
            self.log.error("Refusing to create %s's container: %s", self.user.name, " ".join(problems))
            raise SpawnException(" ".join(problems), reason="lockdown", status_code=500)

    async def docker(self, method, *args, **kwargs):
        # Every container is created through here, whatever extra_create_kwargs
        # or extra_host_config an operator configured: a breach of the
        # lock-down fails the spawn with the sentence check_lockdown gives at
        # hub start, and the safe values are forced on the rest.
        if method == "create_container":
            self._refuse_breaches(self.lockdown_problems(kwargs))
            self._lock_down(kwargs)
            # `docker stop` (ours, or an admin's) gives the kernels their grace to checkpoint before SIGKILL.
            kwargs.setdefault("stop_timeout", int(self.kernel_stop_grace + self.server_stop_margin))
            # Docker's AutoRemove (DockerSpawner's `remove`) deletes a container that died within a second,
            # before the hub's poll can read why (OOMKilled, its exit code, its log): the hub removes it
            # itself, on stop as DockerSpawner does, and after poll has read a dead container's end.
            kwargs["host_config"]["AutoRemove"] = False
        return await super().docker(method, *args, **kwargs)

    def _lock_down(self, kwargs: dict) -> None:
        """Force the GPU pinning, the labels and the safe host config onto a create call.

        Runs after lockdown_problems found nothing, so this is the second
        line: whatever is not allow-listed is set to its safe value even if a
        check missed it. Host paths and a shared network cannot be made safe
        by changing a value, so they are only refused, never rewritten.
        """
        uuids = list(self.gpu_uuids)
        allowed = set(self.allowed_host_config_keys)
        labels = dict(kwargs.get("labels") or {})
        labels.update({**self.tenant_labels(), LABEL_GPUS: ",".join(uuids)})
        kwargs["labels"] = labels
        host = kwargs.setdefault("host_config", {})
        host["DeviceRequests"] = [{"Driver": "nvidia", "DeviceIDs": uuids, "Capabilities": [["gpu"]]}] if uuids else []
        if "Privileged" not in allowed:
            host["Privileged"] = False
        host["CapDrop"] = ["ALL"]
        for risk in RISKS:
            if risk.key in ("Privileged", "DeviceRequests", "SecurityOpt", "NetworkMode") or risk.key in allowed:
                continue
            if risk.key in host and risk.unsafe(host[risk.key]):
                del host[risk.key]
        options = list(host.get("SecurityOpt") or [])
        if "SecurityOpt" not in allowed:
            options = [o for o in options if not _unsafe_security_opt(o)]
        if not any(str(o).startswith("no-new-privileges") for o in options):
            options.append("no-new-privileges")
        host["SecurityOpt"] = sorted(set(options))
        binds = [b for b in host.get("Binds") or [] if "docker.sock" not in b]
        mounts = [m for m in host.get("Mounts") or [] if "docker.sock" not in str(m.get("Source", ""))]
        if len(binds) != len(host.get("Binds") or []) or len(mounts) != len(host.get("Mounts") or []):
            self.log.warning("Refusing to mount the Docker socket into %s's container", self.user.name)
        host["Binds"] = binds
        if "Mounts" in host:
            host["Mounts"] = mounts

    def gpu_lease_ref(self) -> str:
        return f"container:{self.container_id}" if self.container_id else ""

    def gpu_lease_alive(self, lease: Lease) -> bool | None:
        if not lease.ref.startswith("container:"):
            return False
        try:
            container = self._sync_client().containers.get(lease.ref.split(":", 1)[1])
        except docker.errors.NotFound:
            return False
        except docker.errors.DockerException:
            return None  # the engine is unreachable: decide later, on poll
        return container.status in ("running", "restarting", "created")

    def _sync_client(self) -> DockerClient:
        """One blocking client per spawner, kept: the reconciler asks through it for every lease on every pass,
        and a client per question left a connection pool behind each time."""
        client = self.__dict__.get("_workbench_sync_client")
        if client is None:
            client = docker.DockerClient(**self.client_kwargs) if self.client_kwargs else docker.from_env()
            self.__dict__["_workbench_sync_client"] = client
        return client

    def gpu_reconcile_orphans(self) -> None:
        """Adopt or stop this hub's running containers that have no lease; rejoin its users' networks.

        Runs on every pass of the reconciler while the hub runs: a container is an
        orphan only when, asked again just before acting, its server holds no lease
        and is not starting (``GPUPolicy.orphan_now``: a container created by a
        start whose lease has no ref yet is not one) and it still runs."""
        policy = self.gpu_policy
        store = policy.store
        try:
            client = self._sync_client()
            containers = client.containers.list(filters={"label": [f"{LABEL_HUB}={hub_id(store)}", LABEL_USER]})
        except docker.errors.DockerException as exc:
            self.log.warning("Cannot list containers to reconcile GPU leases: %s", exc)
            return
        if self.network_isolation and self.hub_container:
            self.rejoin_networks(client, containers)
        leased = {(lease.user, lease.server) for lease in store.leases()}
        for container in containers:
            labels = container.labels
            key = (labels.get(LABEL_USER, ""), labels.get(LABEL_SERVER, ""))
            uuids = [u for u in labels.get(LABEL_GPUS, "").split(",") if u]
            if key in leased or not uuids:
                continue
            if not policy.orphan_now(*key) or not _still_running(container):
                continue
            if store.adopt(key[0], key[1], uuids, f"container:{container.id}", shares=policy.shares()):
                policy.record_fix(
                    SERVER_ADOPTED,
                    f"reconcile: adopted container {container.name} of {key[0]}/{key[1]} on {', '.join(uuids)}: "
                    "it ran without a lease and its GPU(s) were free",
                )
            else:
                policy.record_fix(
                    SERVER_STOPPED,
                    f"reconcile: stopped container {container.name} of {key[0]}/{key[1]}: it ran without a lease "
                    f"and its GPU(s) {', '.join(uuids)} are leased to another server",
                )
                container.stop(timeout=10)


def _still_running(container) -> bool:
    """Whether ``container`` runs now (read again: the list was read before a stop may have ended it)."""
    try:
        container.reload()
    except docker.errors.NotFound:
        return False
    except docker.errors.DockerException:
        return False  # the engine cannot say: leave it to the next pass
    return container.status == "running"
