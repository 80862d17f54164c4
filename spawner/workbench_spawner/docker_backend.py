"""The docker backend: one container per user server, pinned by GPU UUID.

DockerSpawner does the container work; this class adds what GPU Workbench
promises about every user container:

* a Docker device request (driver ``nvidia``) for exactly the leased UUIDs,
  so the NVIDIA runtime sets ``NVIDIA_VISIBLE_DEVICES`` to them; a CPU-only
  container gets ``NVIDIA_VISIBLE_DEVICES=void`` so an image that says
  ``all`` (the PyTorch images do) still sees no GPU;
* labels ``workbench.user``, ``workbench.server``, ``workbench.gpus``, which
  is how a restarted hub recognises its containers;
* a named volume per user for the home, a read-only datasets volume, a
  writable per-user checkpoints volume;
* no Docker socket, no privileged mode, every capability dropped and
  ``no-new-privileges``.

Reconcile rule after a hub restart: a lease whose container is gone is
released. A running ``workbench.*`` container without a lease is adopted (its
GPUs are leased to it again) when none of its GPUs is held by another server,
and stopped otherwise, because its GPUs belong to someone else now.
"""

from __future__ import annotations

import os

import docker
from dockerspawner import DockerSpawner
from traitlets import Unicode, default

from .mixin import GPUSpawnerMixin
from .store import Lease

LABEL_USER = "workbench.user"
LABEL_SERVER = "workbench.server"
LABEL_GPUS = "workbench.gpus"


class DockerGPUSpawner(GPUSpawnerMixin, DockerSpawner):
    """DockerSpawner with GPU leases, device requests and locked-down containers."""

    enforces_resource_limits = True  # Docker's memory limit and CPU quota

    datasets_volume = Unicode(
        "workbench-datasets",
        help="""
        Named volume (or host path) with shared datasets, mounted read-only at
        ``/datasets`` in every user container. Empty: no datasets mount.
        """,
    ).tag(config=True)

    home_volume_template = Unicode(
        "workbench-home-{username}",
        help="""
        Named volume that holds a user's home (``/home/jovyan``). It survives
        stop, container removal and image upgrades. ``{username}`` is the
        escaped user name; add ``{servername}`` for one home per named server.
        """,
    ).tag(config=True)

    checkpoints_volume_template = Unicode(
        "workbench-checkpoints-{username}",
        help="""
        Named volume mounted writable at ``/checkpoints``, for model
        checkpoints kept apart from the home (and easy to size or back up
        separately). Empty: none.
        """,
    ).tag(config=True)

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

    def apply_gpu_request(self, request) -> None:
        if request.image:
            self.image = request.image

    def gpu_environment(self, uuids: list[str]) -> dict[str, str]:
        env = {"NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
        if not uuids:
            env["NVIDIA_VISIBLE_DEVICES"] = "void"
        return env

    async def docker(self, method, *args, **kwargs):
        # Every container is created through here, whatever extra_create_kwargs
        # or extra_host_config an operator configured: the GPU pinning and the
        # lock-down cannot be configured away by accident.
        if method == "create_container":
            self._lock_down(kwargs)
        return await super().docker(method, *args, **kwargs)

    def _lock_down(self, kwargs: dict) -> None:
        uuids = list(self.gpu_uuids)
        labels = dict(kwargs.get("labels") or {})
        labels.update({LABEL_USER: self.user.name, LABEL_SERVER: self.name, LABEL_GPUS: ",".join(uuids)})
        kwargs["labels"] = labels
        host = kwargs.setdefault("host_config", {})
        host["DeviceRequests"] = (
            [{"Driver": "nvidia", "DeviceIDs": uuids, "Capabilities": [["gpu"]]}] if uuids else []
        )
        host["Privileged"] = False
        host["CapDrop"] = ["ALL"]
        host["SecurityOpt"] = sorted(set(host.get("SecurityOpt") or []) | {"no-new-privileges"})
        binds = [b for b in host.get("Binds") or [] if "docker.sock" not in b]
        if len(binds) != len(host.get("Binds") or []):
            self.log.warning("Refusing to mount the Docker socket into %s's container", self.user.name)
        host["Binds"] = binds

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

    def _sync_client(self) -> docker.DockerClient:
        return docker.DockerClient(**self.client_kwargs) if self.client_kwargs else docker.from_env()

    def gpu_reconcile_orphans(self) -> None:
        """Adopt or stop running workbench containers that have no lease."""
        try:
            client = self._sync_client()
            containers = client.containers.list(filters={"label": LABEL_USER})
        except docker.errors.DockerException as exc:
            self.log.warning("Cannot list containers to reconcile GPU leases: %s", exc)
            return
        store = self.gpu_policy.store
        leased = {(l.user, l.server) for l in store.leases()}
        for container in containers:
            labels = container.labels
            key = (labels.get(LABEL_USER, ""), labels.get(LABEL_SERVER, ""))
            uuids = [u for u in labels.get(LABEL_GPUS, "").split(",") if u]
            if key in leased or not uuids:
                continue
            if store.adopt(key[0], key[1], uuids, f"container:{container.id}"):
                self.log.info("Adopted container %s of %s/%s with GPU(s) %s", container.name, *key, uuids)
            else:
                self.log.warning("Stopping container %s of %s/%s: its GPU(s) %s are held by another server",
                                 container.name, *key, uuids)
                container.stop(timeout=10)
