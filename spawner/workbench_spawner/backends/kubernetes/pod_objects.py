"""What the workbench adds to KubeSpawner's pod and around it: GPUs, labels, home, the lock-down check.

A mixin of ``KubernetesGPUSpawner`` in front of KubeSpawner (``get_pod_manifest``
calls KubeSpawner's and adds to the pod it made), kept apart from the
spawner's life cycle: this module says what a pod *is*, ``spawner.py`` when
it is made, followed and ended. The rules themselves (the lock-down, the
NetworkPolicy, the model selector) are plain functions in ``manifests.py``.
"""

from __future__ import annotations

import asyncio

from jupyterhub.spawner import SpawnException
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


def gpu_limits(gpus: int, profile: str | None, resource: str) -> dict[str, str]:
    """The pod's GPU limit: ``resource`` (``nvidia.com/gpu``) for whole GPUs, the mixed strategy's
    ``nvidia.com/mig-<profile>`` for MIG slices (the device plugin then hands out exactly such slices)."""
    if not gpus:
        return {}
    return {cluster.mig_resource(profile) if profile else resource: str(gpus)}


# NetworkPolicies this process created or updated: one API call per hub process, not per spawn (a
# policy deleted by hand comes back at the next hub start).
_policies_kept: set[str] = set()


class WorkbenchPod(KubernetesTraits):
    """The workbench's part of a user pod; needs KubeSpawner after it in the bases and the GPU policy's request."""

    home_mount_path = Unicode(
        "/home/jovyan",
        help="""
        Where the user's home volume is mounted in the pod: the image's home
        (the workbench image's user is jovyan, uid 1000).
        """,
    ).tag(config=True)

    async def get_pod_manifest(self):
        """KubeSpawner's pod plus GPUs, model selector, labels, home, datasets, deadline; lock-down checked."""
        from kubernetes_asyncio.client import (
            V1EnvVar,
            V1EnvVarSource,
            V1ObjectFieldSelector,
            V1PersistentVolumeClaimVolumeSource,
            V1Volume,
            V1VolumeMount,
        )

        pod = await super().get_pod_manifest()
        container = pod.spec.containers[0]
        gpus = self.gpu_request.gpus
        if gpus:
            limits = gpu_limits(gpus, self.gpu_request.gpu_profile, self.gpu_resource_name)
            container.resources.limits = {**(container.resources.limits or {}), **limits}
        else:  # an image that says NVIDIA_VISIBLE_DEVICES=all must still see no GPU
            container.env = [*(container.env or []), V1EnvVar(name="NVIDIA_VISIBLE_DEVICES", value="void")]
        if self._model_selector:
            pod.spec.node_selector = {**(pod.spec.node_selector or {}), **self._model_selector}
        container.env = [
            *(container.env or []),
            V1EnvVar(
                name="WORKBENCH_NODE_NAME",
                value_from=V1EnvVarSource(field_ref=V1ObjectFieldSelector(field_path="spec.nodeName")),
            ),
            V1EnvVar(name="WORKBENCH_START_REPORT", value="1"),
        ]
        pod.metadata.labels = {
            **(pod.metadata.labels or {}),
            LABEL_HUB: self._hub,
            LABEL_USER: safe_slug(self.user.name, max_length=48),
            LABEL_SERVER: safe_slug(self.name or "default", max_length=48),
        }
        pod.metadata.annotations = {
            **(pod.metadata.annotations or {}),
            LABEL_USER: self.user.name,
            LABEL_SERVER: self.name,
        }
        claim = V1PersistentVolumeClaimVolumeSource
        volumes = [V1Volume(name="workbench-home", persistent_volume_claim=claim(claim_name=self.pvc_name))]
        mounts = [V1VolumeMount(name="workbench-home", mount_path=self.home_mount_path)]
        if self.datasets_claim:
            datasets = claim(claim_name=self.datasets_claim, read_only=True)
            volumes.append(V1Volume(name="workbench-datasets", persistent_volume_claim=datasets))
            mounts.append(V1VolumeMount(name="workbench-datasets", mount_path="/datasets", read_only=True))
        pod.spec.volumes = [*(pod.spec.volumes or []), *volumes]
        container.volume_mounts = [*(container.volume_mounts or []), *mounts]
        if self._session_limit:
            pod.spec.active_deadline_seconds = int(self._session_limit * 3600)
        problems = lockdown_problems(self.api.api_client.sanitize_for_serialization(pod), self.allowed_host_paths)
        if problems:
            raise SpawnException(
                "The hub's Kubernetes settings would weaken the user pod's lock-down: "
                + "; ".join(problems)
                + ". Nothing was created; tell a hub admin.",
                reason="lockdown",
                status_code=500,
            )
        return pod

    def _session_hours(self) -> float | None:
        """The session limit admission recorded for this start: it becomes the pod's activeDeadlineSeconds."""
        return self.gpu_quota_book.session_limits().get((self.user.name, self.name))

    async def _nodes(self) -> list[cluster.KubeNode]:
        try:
            return await asyncio.to_thread(cluster.list_nodes, self.gpu_resource_name)
        except cluster.KubernetesUnavailable as exc:
            raise SpawnException(
                f"Cannot start the server: the Kubernetes API did not answer ({exc}); nothing was created. Try "
                "again in a minute.",
                reason="kubernetes_unavailable",
                status_code=503,
            ) from None

    async def _ensure_network_policy(self, hub: str) -> None:
        """Create or update the namespace's policy for this hub's pods, once per hub process and content."""
        from kubernetes_asyncio.client import NetworkingV1Api

        manifest = network_policy(self.namespace, hub, self.hub_ingress_cidrs)
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
            self.log.warning("Could not annotate the pod of %s with its GPUs: %s", self._log_name, exc)
