"""What the workbench puts in each user pod, through KubeSpawner's own traits and hooks.

A mixin of ``KubernetesGPUSpawner`` in front of KubeSpawner, kept apart from
the spawner's life cycle: this module says what a pod *is*, ``spawner.py``
when it is made, followed and ended. Before each start ``shape_pod`` sets
KubeSpawner's public traits from what the site configured plus this start's
part (``pod_traits``, a plain function): the GPUs as ``extra_resource_limits``,
a model as ``node_selector``, the hub/user/server labels and annotations, the
home and datasets claims as ``volumes``/``volume_mounts``, the session limit
as ``activeDeadlineSeconds`` in ``extra_pod_config``, the picked ``image``;
``get_env`` adds the start report's variables. The lock-down is checked on the
final pod in ``modify_pod_hook`` (after the site's own hook, if any), so no
setting or hook can weaken it unnoticed. The rules themselves (the lock-down,
the NetworkPolicy, the model selector) are plain functions in ``manifests.py``.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jupyterhub.spawner import SpawnException
from jupyterhub.utils import maybe_future
from kubernetes_asyncio.client.exceptions import ApiException
from kubespawner.slugs import safe_slug
from traitlets import Unicode

from workbench_spawner.backends.kubernetes import cluster
from workbench_spawner.backends.kubernetes.manifests import (
    LABEL_HUB,
    LABEL_SERVER,
    LABEL_USER,
    lockdown_problems,
    network_policy,
)
from workbench_spawner.backends.kubernetes.traits import KubernetesTraits

# KubeSpawner's traits each start sets: the site's configured value plus this start's part (``pod_traits``).
SHAPED = (
    "extra_resource_limits",
    "node_selector",
    "extra_labels",
    "extra_annotations",
    "volumes",
    "volume_mounts",
    "extra_pod_config",
    "image",
    "modify_pod_hook",
)


def gpu_limits(gpus: int, profile: str | None, resource: str) -> dict[str, str]:
    """The pod's GPU limit: ``resource`` (``nvidia.com/gpu``) for whole GPUs, the mixed strategy's
    ``nvidia.com/mig-<profile>`` for MIG slices (the device plugin then hands out exactly such slices)."""
    if not gpus:
        return {}
    return {cluster.mig_resource(profile) if profile else resource: str(gpus)}


@dataclass(frozen=True)
class PodShape:
    """This start's part of the pod: who it is for, what admission granted, where its home is."""

    hub: str
    user: str
    server: str
    pvc_name: str
    gpus: int = 0
    gpu_profile: str | None = None
    gpu_resource: str = "nvidia.com/gpu"
    model_selector: Mapping[str, str] | None = None
    session_hours: float | None = None
    image: str | None = None
    home_mount_path: str = "/home/jovyan"
    datasets_claim: str = ""


def _literal(text: str) -> str:
    """``text`` as KubeSpawner's template expansion leaves it (it ``format``s labels, annotations, volumes)."""
    return text.replace("{", "{{").replace("}", "}}")


def _added(site: Any, named: dict[str, dict]) -> list | dict:
    """KubeSpawner's ``volumes``/``volume_mounts`` (a list, or a dict sorted by key) with ``named`` added."""
    if isinstance(site, dict):
        return {**site, **named}
    return [*(site or []), *named.values()]


def pod_traits(site: Mapping[str, Any], shape: PodShape) -> dict[str, Any]:
    """KubeSpawner's trait values for this start: the site's (``site``, by trait name) with the workbench's part."""
    home = {"name": "workbench-home", "persistentVolumeClaim": {"claimName": _literal(shape.pvc_name)}}
    volumes: dict[str, dict[str, Any]] = {"workbench-home": home}
    mounts: dict[str, dict[str, Any]] = {
        "workbench-home": {"name": "workbench-home", "mountPath": _literal(shape.home_mount_path)}
    }
    if shape.datasets_claim:
        claim = {"claimName": _literal(shape.datasets_claim), "readOnly": True}
        volumes["workbench-datasets"] = {"name": "workbench-datasets", "persistentVolumeClaim": claim}
        mounts["workbench-datasets"] = {"name": "workbench-datasets", "mountPath": "/datasets", "readOnly": True}
    # The dict traits: the site's entries, then ours (ours win: the GPUs, the labels reconcile reads, ...).
    ours: dict[str, Mapping[str, Any]] = {
        "extra_resource_limits": gpu_limits(shape.gpus, shape.gpu_profile, shape.gpu_resource),
        "node_selector": shape.model_selector or {},
        "extra_labels": {
            LABEL_HUB: shape.hub,
            LABEL_USER: safe_slug(shape.user, max_length=48),
            LABEL_SERVER: safe_slug(shape.server or "default", max_length=48),
        },
        "extra_annotations": {LABEL_USER: _literal(shape.user), LABEL_SERVER: _literal(shape.server)},
        "extra_pod_config": {"activeDeadlineSeconds": int(shape.session_hours * 3600)} if shape.session_hours else {},
    }
    return {
        **{name: {**(site.get(name) or {}), **part} for name, part in ours.items()},
        "volumes": _added(site.get("volumes"), volumes),
        "volume_mounts": _added(site.get("volume_mounts"), mounts),
        "image": shape.image or site.get("image") or "",
    }


def start_report_env(gpus: int) -> dict[str, Any]:
    """What the pod's start-up needs to report its node and GPUs; a CPU pod is told it has no GPU."""
    env: dict[str, Any] = {
        "WORKBENCH_NODE_NAME": {"valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        "WORKBENCH_START_REPORT": "1",
    }
    if not gpus:  # an image that says NVIDIA_VISIBLE_DEVICES=all must still see no GPU
        env["NVIDIA_VISIBLE_DEVICES"] = "void"
    return env


def start_refusal(exc: BaseException) -> SpawnException:
    """KubeSpawner's start ended before the pod was seen: the API was away or refused it, in the user's words."""
    if isinstance(exc, SpawnException):
        return exc
    if isinstance(exc, cluster.KubernetesUnavailableError):
        return SpawnException(
            f"Cannot start the server: the Kubernetes API did not answer ({exc}); nothing was created. Try "
            "again in a minute.",
            reason="kubernetes_unavailable",
            status_code=503,
        )
    detail = exc.body if isinstance(exc, ApiException) and exc.body else str(exc)
    return SpawnException(
        f"Kubernetes refused the server's pod or home volume: {str(detail)[:400]}; nothing runs. Tell a hub "
        "admin if this persists.",
        reason="kubernetes_refused",
        status_code=500,
    )


def locked_down(site_hook: Callable | None) -> Callable:
    """A ``modify_pod_hook``: the site's hook first, then the lock-down check of the pod it leaves."""

    async def hook(spawner: WorkbenchPod, pod: Any) -> Any:
        if site_hook is not None:
            pod = await maybe_future(site_hook(spawner, pod))
        spawner.check_lockdown(pod)
        return pod

    return hook


# NetworkPolicies this process created or updated: one API call per hub process, not per spawn (a
# policy deleted by hand comes back at the next hub start).
_policies_kept: set[str] = set()


if TYPE_CHECKING:
    # What WorkbenchPod goes in front of, for the checker (KubeSpawner ships no type information: Any to it).
    from kubespawner import KubeSpawner as _KubeSpawnerBase

    from workbench_spawner.form.options import SpawnRequest
else:
    _KubeSpawnerBase = object


class WorkbenchPod(KubernetesTraits, _KubeSpawnerBase):
    """The workbench's part of a user pod; needs KubeSpawner after it in the bases and the GPU policy's request."""

    if TYPE_CHECKING:  # the GPU mixin's (before this class in KubernetesGPUSpawner's bases), read here
        gpu_request: SpawnRequest

        @property
        def server_label(self) -> str: ...

    home_mount_path = Unicode(
        "/home/jovyan",
        help="""
        Where the user's home volume is mounted in the pod: the image's home
        (the workbench image's user is jovyan, uid 1000).
        """,
    ).tag(config=True)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # What the site configured, kept: each start sets the traits afresh from it (a pick is not sticky).
        self._site_pod = {name: copy.deepcopy(getattr(self, name)) for name in SHAPED}

    def shape_pod(self, shape: PodShape) -> None:
        """Set KubeSpawner's traits for this start (before ``KubeSpawner.start``): the site's values plus ours."""
        for name, value in pod_traits(self._site_pod, shape).items():
            setattr(self, name, value)
        self.modify_pod_hook = locked_down(self._site_pod["modify_pod_hook"])

    def get_env(self) -> dict[str, Any]:
        env = super().get_env()
        env.update(start_report_env(self.gpu_request.gpus))
        return env

    def check_lockdown(self, pod: Any) -> None:
        """Refuse the final pod (every setting, profile and hook applied) if it weakens the lock-down."""
        problems = lockdown_problems(self.api.api_client.sanitize_for_serialization(pod), self.allowed_host_paths)
        if problems:
            raise SpawnException(
                "The hub's Kubernetes settings would weaken the user pod's lock-down: "
                + "; ".join(problems)
                + ". Nothing was created; tell a hub admin.",
                reason="lockdown",
                status_code=500,
            )

    async def _nodes(self) -> list[cluster.KubeNode]:
        try:
            return await asyncio.to_thread(cluster.list_nodes, self.gpu_resource_name)
        except cluster.KubernetesUnavailableError as exc:
            raise start_refusal(exc) from None

    async def _ensure_network_policy(self, hub: str) -> None:
        """Create or update the namespace's policy for this hub's pods, once per hub process and content."""
        from kubernetes_asyncio.client import NetworkingV1Api

        # A plain manifest: kubernetes_asyncio serialises a dict as it does its V1NetworkPolicy model (its
        # annotations name only the model).
        manifest: Any = network_policy(self.namespace, hub, self.hub_ingress_cidrs)
        key = repr(manifest)
        if key in _policies_kept:
            return
        api = NetworkingV1Api(self.api.api_client)
        try:
            await api.create_namespaced_network_policy(self.namespace, manifest)
        except ApiException as exc:
            if exc.status == 409:  # there already: keep it current
                await api.replace_namespaced_network_policy(manifest["metadata"]["name"], self.namespace, manifest)
            else:
                raise SpawnException(
                    f"Kubernetes refused the user pods' NetworkPolicy ({exc.status} {exc.reason}); nothing was "
                    "created. The hub needs to create networkpolicies in its namespace (docs/kubernetes.md).",
                    reason="kubernetes_refused",
                    status_code=500,
                ) from None
        _policies_kept.add(key)

    async def _annotate(self, key: str, value: str) -> None:
        try:
            await self.api.patch_namespaced_pod(
                self.pod_name, self.namespace, {"metadata": {"annotations": {key: value}}}
            )
        except Exception as exc:  # noqa: BLE001 - the lease is written; reconcile then deletes an unannotated pod
            self.log.warning("Could not annotate the pod of %s with its GPUs: %s", self.server_label, exc)
