"""The kubernetes backend: KubeSpawner with the GPU policy; the scheduler places, we admit and record.

KubeSpawner does the pod work through its public ``start()`` (its pod and
event watches, the home PVC, the pod object from its traits, waiting for it
to run); this class sets those traits for each start and adds what GPU
Workbench promises:

* **Admission is ours, placement is the scheduler's.** Quotas, models,
  reservations are decided before a pod exists, so a refusal creates
  nothing. An admitted request becomes a pod asking ``nvidia.com/gpu: N``
  (a model: a node selector on GPU Feature Discovery's labels; MIG slices of a
  ``gpu_profile``: ``nvidia.com/mig-<profile>: 1`` (one slice a server)). While it is
  Pending the progress page shows the scheduler's own words and the place in
  this hub's line; past the queue timeout the pod is deleted and the user
  told (``placement.py``).
* **The hub learns which GPUs the pod got**: the node from the pod, the UUIDs
  from the pod's start-up (``NVIDIA_VISIBLE_DEVICES``, posted to
  ``report_api``), checked against the pod before the lease is written.
  The lease's UUIDs then go on the pod as the annotation ``workbench.gpus``.
* **Names and labels carry this hub's id**: pod ``wb-<hub>-<user_server>``,
  home ``wb-<hub>-home-<user>``, labels ``workbench.hub/user/server``, so
  two hubs on one cluster (or one namespace) never touch each other's pods.
* **The lock-down** (``manifests.py``): non-root, no capabilities, no
  privilege escalation, seccomp ``RuntimeDefault``, no service-account
  token, no host namespaces or hostPath volumes unless allow-listed; checked
  on the final pod in KubeSpawner's ``modify_pod_hook`` (``pod_objects.py``,
  which shapes the pod through KubeSpawner's traits). A NetworkPolicy per hub keeps users apart where the
  network plugin enforces it.

When the API server is away, the pod and event watches are kept (``watch.py``):
the hub keeps its last view, restarts the watches as soon as the API server
answers (a poll cuts the backoff short), and then wakes the policy's
reconciler. Why a pod ended goes into the ledger in its words (``ending.py``):
deleted outside the hub, evicted, out of memory, node failed.

Reconcile rule after a hub restart (``pod_leases.py``, ``reconcile.py``): a
lease whose pod is gone (or ending) is released. This hub's pods without a
lease (label ``workbench.hub``) that were created before this hub process: an
unscheduled one is deleted (no spawn waits for it); a running one whose
``workbench.gpus`` annotation names GPUs nobody holds is adopted, any other is
deleted; a running CPU-only pod is left to JupyterHub. Pods of other hubs are
never looked at.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Sequence
from urllib.parse import urlparse

from jupyterhub.spawner import SpawnException
from kubernetes_asyncio.client.exceptions import ApiException
from kubespawner import KubeSpawner
from traitlets import default

from workbench_devices import DeviceInventory
from workbench_spawner.backends.kubernetes import cluster, pod_leases
from workbench_spawner.backends.kubernetes.cluster import NodeState
from workbench_spawner.backends.kubernetes.ending import needs_node, node_name, pod_ending
from workbench_spawner.backends.kubernetes.inventory import NodeUUIDs, cluster_inventory, slice_key
from workbench_spawner.backends.kubernetes.manifests import (
    ANNOTATION_GPUS,
    CONTAINER_SECURITY,
    POD_SECURITY,
    model_selector,
)
from workbench_spawner.backends.kubernetes.placement import KubernetesPlacement, PodJob, PodReport
from workbench_spawner.backends.kubernetes.pod_objects import PodShape, WorkbenchPod, start_refusal
from workbench_spawner.backends.kubernetes.traits import KubernetesTraits
from workbench_spawner.backends.kubernetes.watch import KeptWatches
from workbench_spawner.config_sections import read_as
from workbench_spawner.form.options import SpawnRequest
from workbench_spawner.ledger.endings import Ending
from workbench_spawner.ledger.store import AllocationStore, Lease
from workbench_spawner.placement.engine_spawner import EngineSpawner, engine_reservations, inventory_once
from workbench_spawner.policy.gpu_policy import GPUPolicy
from workbench_spawner.policy.settings import PolicySettings


class KubernetesGPUSpawner(EngineSpawner, KeptWatches, WorkbenchPod, KubeSpawner):
    """KubeSpawner with GPU Workbench's admission, ledger and fleet view (engine placement).

    ``workbench_report``: set by the pod's start-up through ``/hub/api/workbench/start-report``, the node and
    the GPU UUIDs the pod was given."""

    workbench_backend = "kubernetes"
    lease_ref_prefix = "k8s"
    runs_picked_images = True
    enforces_resource_limits = True  # the pod's limits: the kubelet's cgroups hold it to them

    # -- the lock-down and the image's user, as defaults a site may tighten -------------------

    @default("uid")
    def _default_uid(self):
        return 1000

    @default("gid")
    def _default_gid(self):
        return 100

    @default("fs_gid")
    def _default_fs_gid(self):
        return 100

    @default("allow_privilege_escalation")
    def _default_allow_privilege_escalation(self):
        return False

    @default("container_security_context")
    def _default_container_security_context(self):
        return dict(CONTAINER_SECURITY, capabilities={"drop": ["ALL"]})

    @default("pod_security_context")
    def _default_pod_security_context(self):
        return dict(POD_SECURITY)

    @default("automount_service_account_token")
    def _default_automount(self):
        return False

    @default("storage_pvc_ensure")
    def _default_storage_pvc_ensure(self):
        return True

    @default("storage_capacity")
    def _default_storage_capacity(self):
        return self.home_volume_size

    @default("delete_grace_period")
    def _default_delete_grace_period(self):
        # KubeSpawner's 1 s would SIGKILL a kernel writing its checkpoint (``on_stop``): the pod gets the
        # kernels' grace and the server's margin between SIGTERM and SIGKILL.
        return int(self.kernel_stop_grace + self.server_stop_margin)

    @default("delete_stopped_pods")
    def _default_delete_stopped_pods(self):
        # KubeSpawner's poll would delete an ended pod through self.stop(), which the GPU mixin records as
        # "stopped" before poll can ask why the pod ended (gpu_exit_reason); JupyterHub stops the server, and
        # so deletes the pod, right after poll reports that it ended: nothing is left behind.
        return False

    @default("image_pull_policy")
    def _default_image_pull_policy(self):
        return "IfNotPresent"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._hub = ""
        self._home_in_state = False  # the home's name came from the saved state: kept (``_name_pod_and_home``)
        self._pod_start: asyncio.Future | None = None  # KubeSpawner's start() of this spawn, while it runs

    # -- the cluster and the policy ------------------------------------------------------------

    def engine_inventory(self) -> DeviceInventory:
        """The cluster's GPUs from the nodes' device-plugin counts, read once per hub process (blocking).

        ``self`` may be a bare config object with the policy's traits."""
        traits = self if isinstance(self, KubernetesTraits) else _backend_traits(self.config)
        return inventory_once(
            ("kubernetes", self.simulated_gpus, traits.gpu_resource_name),
            lambda: cluster_inventory(
                cluster.list_nodes(traits.gpu_resource_name),
                self.simulated_gpus,
                traits.gpu_product_label,
                traits.gpu_memory_label,
            ),
            cluster.KubernetesUnavailableError,
            "Kubernetes",
        )

    def engine_placement(self, settings: PolicySettings, store: AllocationStore) -> KubernetesPlacement:
        def inventory() -> DeviceInventory:
            return NodeUUIDs(store).resolve(settings.inventory)

        resource = self.gpu_resource_name

        def free_gpus(current: DeviceInventory) -> list[str]:
            """Whole GPUs not allocated now (what reservations are measured in; slices are not)."""
            held = {lease_uuid for lease in store.leases() for lease_uuid in lease.gpu_uuids}
            free: list[str] = []
            for node in cluster.list_nodes(resource):
                mine = [d.uuid for d in current.devices if d.node == node.name and not d.mig and d.uuid not in held]
                free.extend(mine[: node.gpus_free])
            return free

        real = self.learns_node_uuids(settings)
        capacity: dict[str, int] = {}  # whole GPUs by node, slices by slice_key(node, profile)
        for device in settings.inventory.devices:
            where = slice_key(device.node, device.profile) if device.mig else device.node
            capacity[where] = capacity.get(where, 0) + 1

        def learn(node: str, uuids: Sequence[str], profile: str) -> None:
            """Whole GPUs (``profile`` "") or slices of ``profile`` on ``node``, held to what the node has."""
            if real:
                NodeUUIDs(store).accept(
                    node, uuids, capacity.get(slice_key(node, profile) if profile else node, 0), profile
                )

        return KubernetesPlacement(
            store,
            inventory,
            engine_reservations(settings, store, inventory),
            free_gpus,
            self.k8s_poll_interval,
            self.k8s_report_timeout,
            learn=learn,
        )

    def build_policy(self, settings: PolicySettings) -> GPUPolicy:
        policy = super().build_policy(settings)  # an EnginePolicy
        _policies.add(policy)
        return policy

    def watch_recovered(self) -> None:
        """A pod or event watch is back after the API server was away: the ledger and the cluster may disagree
        (pods deleted, evicted or ended meanwhile), so every Kubernetes policy of this process reconciles now."""
        for policy in list(_policies):
            policy.reconcile_soon()

    def _name_pod_and_home(self, hub: str) -> None:
        """This server's pod ``wb-<hub>-<user_server>`` and home ``wb-<hub>-home-<user>``, by KubeSpawner's templates.

        The one reach into KubeSpawner's private API for names: it expands ``pod_name_template`` and
        ``pvc_name_template`` only when a spawner is made (jupyterhub/kubespawner#761, "Some _template options
        don't work...", open; #528), while this hub's id is known only at start (the GPU database). So the
        templates are set here and expanded by its ``_expand_user_properties``, whose slugs KubeSpawner's own
        names use. A home named in the server's saved state stays (``remember_pvc_name``): an earlier home is
        never orphaned."""
        self._hub = hub
        self.pod_name_template = f"wb-{hub}-{{user_server}}"
        self.pod_name = self._expand_user_properties(self.pod_name_template)
        self.dns_name = self.dns_name_template.format(namespace=self.namespace, name=self.pod_name)
        if not self._home_in_state:
            self.pvc_name_template = f"wb-{hub}-home-{{username}}"
            self.pvc_name = self._expand_user_properties(self.pvc_name_template)

    # -- lifecycle -----------------------------------------------------------------------------

    async def load_user_options(self):
        """Nothing: the workbench's form and admission own the options (``profile`` is a workbench
        resource profile, already applied by ``size_server``; the image by ``apply_gpu_request``);
        KubeSpawner's would look ``profile`` up in its own ``profile_list`` and refuse the spawn."""

    def apply_gpu_request(self, request: SpawnRequest) -> None:
        """The image the user picked (one of ``offered_images``: admission checked it) runs; without a pick, the
        configured ``image`` (a pick of an earlier start is not kept)."""
        self.image = request.image or self._site_pod["image"]

    async def engine_submit(self) -> PodJob:
        request = self.gpu_request
        hub, hours = await asyncio.to_thread(lambda: (self.hub_id(), self.gpu_session_hours()))
        self._name_pod_and_home(hub)
        selector: dict[str, str] = {}
        if request.gpu_model:
            labels = [n.labels for n in await self._nodes()]
            selector = model_selector(request.gpu_model, labels, self.gpu_product_label, self.gpu_memory_label)
        self.shape_pod(
            PodShape(
                hub=hub,
                user=self.user.name,
                server=self.name,
                pvc_name=self.pvc_name,
                gpus=request.gpus,
                gpu_profile=request.gpu_profile,
                gpu_resource=self.gpu_resource_name,
                model_selector=selector,
                session_hours=hours,
                image=request.image,
                home_mount_path=self.home_mount_path,
                datasets_claim=self.datasets_claim,
            )
        )
        if self.workbench_network_policy:
            await self._ensure_network_policy(hub)
        key = f"{self.namespace}/{self.pod_name}"
        # KubeSpawner's own start: its watches, the home, the pod (checked in modify_pod_hook), then the wait for it
        # to run, returning its URL (engine_connect). Meanwhile the placement follows the pod and its events
        # through KubeSpawner's public pod_reflector and events.
        self._pod_start = started = KubeSpawner.start(self)
        while (self.pod_reflector is None or key not in self.pod_reflector.pods) and not started.done():
            await asyncio.sleep(0.1)
        failure = None if not started.done() or started.cancelled() else started.exception()
        if failure is not None:
            raise start_refusal(failure) from None
        self._gpu_events.add(f"Created pod {self.pod_name} in namespace {self.namespace}", 5)
        submitted = time.monotonic()

        def report() -> PodReport | None:
            return PodReport.from_json(self.workbench_report)

        return PodJob(
            job_id=key,
            started=report,
            pod=lambda: self.pod_reflector.pods.get(key),
            events=lambda: self.events,
            submitted=submitted,
            profile=(request.gpu_profile or "") if request.gpus else "",
            kind=request.kind,
        )

    async def engine_connect(self, lease: Lease | None) -> tuple[str, int]:
        if self._pod_start is None:
            raise SpawnException("The server's pod was not started; nothing runs.", status_code=500)
        url = await self._pod_start
        if lease:
            await self._annotate(ANNOTATION_GPUS, ",".join(lease.gpu_uuids))
        self.announce_running(lease, PodReport.from_json(self.workbench_report))
        parsed = urlparse(url)
        return parsed.hostname or "", parsed.port or self.port

    async def engine_cancel(self) -> None:
        """Delete this server's pod (by its name under this hub's id); never raises."""
        started = self._pod_start
        if started is not None and not started.done():
            started.cancel()
        try:
            if not self._hub:
                self._name_pod_and_home(await asyncio.to_thread(self.hub_id))
            try:  # KubeSpawner's client, on the hub's loop: no thread, no new connection per spawn
                await asyncio.wait_for(
                    self.api.delete_namespaced_pod(self.pod_name, self.namespace, grace_period_seconds=0),
                    self.k8s_api_request_timeout,
                )
                self.log.info("Deleted pod %s/%s of %s", self.namespace, self.pod_name, self.server_label)
            except ApiException as exc:
                if exc.status != 404:  # nothing left of an earlier start: the usual case
                    raise
            key = f"{self.namespace}/{self.pod_name}"
            for _ in range(300):  # the kubelet confirms deletion in seconds; a new pod needs the name
                if self.pod_reflector is None or key not in self.pod_reflector.pods:
                    break
                await asyncio.sleep(0.1)
        except Exception as exc:  # noqa: BLE001 - cancel never raises (the contract)
            self.log.warning("Could not delete the pod of %s: %s", self.server_label, exc)

    async def stop(self, now=False):
        """The mixin's stop (which deletes the pod and then releases the lease with who asked), with the pod marked
        as the hub's own deletion meanwhile: the reconciler must not take it for one deleted outside the hub."""
        key = f"{self.namespace}/{self.pod_name}"
        pod_leases.hub_deleting.add(key)
        seen = self.pod_reflector.pods.get(key) if self.pod_reflector is not None else None
        try:
            await super().stop(now=now)
        except Exception:
            # The pod may still run (the API server did not answer KubeSpawner's deletions), while the mixin has
            # released its lease and JupyterHub counts the server stopped: it is deleted once the API answers.
            uid = ((seen or self.last_pod() or {}).get("metadata") or {}).get("uid")
            if uid:
                pod_leases.left_pods[key] = uid
                self.log.warning(
                    "Pod %s of %s is deleted as soon as the Kubernetes API answers", key, self.server_label
                )
            raise
        finally:
            pod_leases.hub_deleting.discard(key)  # the lease is released by now (the mixin's stop, in it)

    # -- why a pod ended -------------------------------------------------------------------------

    async def gpu_exit_reason(self) -> Ending | None:
        """Why the pod ended (poll found it gone or ended), from the pod as last seen (``ending.py``)."""
        reflector = self.pod_reflector
        current = reflector.pods.get(f"{self.namespace}/{self.pod_name}") if reflector is not None else None
        pod = current or self.last_pod()
        gone = current is None
        node, condition = NodeState.UNKNOWN, ""
        if needs_node(pod, gone) and node_name(pod):
            node, condition = await asyncio.to_thread(cluster.node_condition, node_name(pod))
        return pod_ending(pod, gone, node, condition)

    def gpu_lease_gone_reason(self, lease: Lease) -> Ending | None:
        """Why the pod of ``lease`` is gone, for the reconciler (blocking): from the pod as the API lists it now."""
        return pod_leases.lease_gone_reason(lease, self.hub_id())

    # -- after a hub restart -------------------------------------------------------------------

    def gpu_lease_ref(self) -> str:
        return f"{self.lease_ref_prefix}:{self.namespace}/{self.pod_name}" if self._hub else ""

    def gpu_lease_alive(self, lease: Lease) -> bool | None:
        """Whether the lease's pod runs (blocking); None while the API server does not answer (``pod_leases``)."""
        return pod_leases.lease_alive(lease, self.hub_id())

    def gpu_reconcile_orphans(self) -> None:
        """This hub's pods without a lease, adopted or deleted (blocking; ``pod_leases``, ``reconcile.py``)."""
        pod_leases.reconcile_orphans(self.gpu_policy, self.namespace, self.hub_id(), self.log)

    def get_state(self):
        state = super().get_state()
        if self._hub:
            state["workbench_hub"] = self._hub
        return state

    def load_state(self, state):
        super().load_state(state)
        self._hub = state.get("workbench_hub", "")
        self._home_in_state = bool(state.get("pvc_name")) and self.remember_pvc_name

    def clear_state(self):
        super().clear_state()
        self._hub = ""


def _backend_traits(config) -> KubernetesTraits:
    """This backend's settings read from ``config`` as the spawner reads them (its class's sections)."""
    return read_as(KubernetesTraits, KubernetesGPUSpawner, config)


# Every Kubernetes policy of this process, woken when a watch comes back (``watch_recovered``).
_policies: weakref.WeakSet[GPUPolicy] = weakref.WeakSet()
