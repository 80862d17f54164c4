"""The kubernetes backend: KubeSpawner 7.1 with the GPU policy; the scheduler places, we admit and record.

KubeSpawner does the pod work (its pod and event watches, the home PVC, the
pod object from its settings); this class adds what GPU Workbench promises:

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
  on the final pod (``pod_objects.py``, which adds the workbench's part to
  KubeSpawner's pod). A NetworkPolicy per hub keeps users apart where the
  network plugin enforces it.

When the API server is away, the pod and event watches are kept (``watch.py``):
the hub keeps its last view, restarts the watches as soon as the API server
answers (a poll cuts the backoff short), and then wakes the policy's
reconciler. Why a pod ended goes into the ledger in its words (``ending.py``):
deleted outside the hub, evicted, out of memory, node failed.

Reconcile rule after a hub restart: a lease whose pod is gone (or ending) is
released. This hub's pods without a lease (label ``workbench.hub``) that
were created before this hub process: an unscheduled one is deleted (no
spawn waits for it); a running one whose ``workbench.gpus`` annotation names
GPUs nobody holds is adopted, any other is deleted; a running CPU-only pod
is left to JupyterHub. Pods of other hubs are never looked at.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from typing import Any
from urllib.parse import urlparse

from jupyterhub.spawner import SpawnException
from kubernetes_asyncio.client.exceptions import ApiException
from kubespawner import KubeSpawner
from kubespawner.slugs import safe_slug
from traitlets import Any as AnyTrait
from traitlets import default

from workbench_devices import DeviceInventory
from workbench_spawner.backends.kubernetes import cluster
from workbench_spawner.backends.kubernetes.ending import NodeState, needs_node, node_name, pod_ending
from workbench_spawner.backends.kubernetes.inventory import NodeUUIDs, cluster_inventory, slice_key
from workbench_spawner.backends.kubernetes.manifests import (
    ANNOTATION_GPUS,
    CONTAINER_SECURITY,
    LABEL_HUB,
    POD_SECURITY,
    model_selector,
)
from workbench_spawner.backends.kubernetes.placement import KubernetesPlacement, PodJob, PodReport
from workbench_spawner.backends.kubernetes.pod_objects import WorkbenchPod
from workbench_spawner.backends.kubernetes.reconcile import reconcile_pods
from workbench_spawner.backends.kubernetes.traits import KubernetesTraits
from workbench_spawner.backends.kubernetes.watch import KeptWatches
from workbench_spawner.ledger.endings import Ending
from workbench_spawner.ledger.hub_identity import hub_id
from workbench_spawner.ledger.reconcile_book import SERVER_ADOPTED, SERVER_STOPPED
from workbench_spawner.ledger.store import AllocationStore, Lease
from workbench_spawner.mixin import GPUSpawnerMixin
from workbench_spawner.placement.engine_reservations import EngineReservations
from workbench_spawner.policy.clock import hub_clock, zone
from workbench_spawner.policy.gpu_policy import GPUPolicy
from workbench_spawner.policy.settings import PolicySettings

# Pods created after this are this process's own spawns, never orphans of an earlier hub.
PROCESS_STARTED = time.time()


class KubernetesGPUSpawner(GPUSpawnerMixin, KeptWatches, WorkbenchPod, KubeSpawner):
    """KubeSpawner with GPU Workbench's admission, ledger and fleet view (engine placement)."""

    workbench_backend = "kubernetes"
    placement_mode = "engine"
    enforces_resource_limits = True  # the pod's limits: the kubelet's cgroups hold it to them

    workbench_report = AnyTrait(
        None,
        allow_none=True,
        help="""
        Set by the pod's start-up through ``/hub/api/workbench/start-report``
        (never configure it): the node and the GPU UUIDs the pod was given.
        """,
    )

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
        self._session_limit: float | None = None
        self._model_selector: dict[str, str] = {}

    # -- the cluster and the policy ------------------------------------------------------------

    def engine_inventory(self) -> DeviceInventory:
        """The cluster's GPUs from the nodes' device-plugin counts, read once per hub process (blocking).

        ``self`` may be a bare config object with the policy's traits. Nodes
        added later are seen after a hub restart; the fleet view reads them live."""
        traits = self if isinstance(self, KubernetesTraits) else _backend_traits(self.config)
        key = (self.simulated_gpus, traits.gpu_resource_name)
        if key not in _inventories:
            try:
                nodes = cluster.list_nodes(traits.gpu_resource_name)
            except cluster.KubernetesUnavailable as exc:
                return DeviceInventory("none", [], f"Kubernetes did not answer: {exc}")
            _inventories[key] = cluster_inventory(
                nodes, self.simulated_gpus, traits.gpu_product_label, traits.gpu_memory_label
            )
        return _inventories[key]

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

        real = settings.inventory.source == "kubernetes"
        capacity: dict[str, int] = {}  # whole GPUs by node, slices by slice_key(node, profile)
        for device in settings.inventory.devices:
            where = slice_key(device.node, device.profile) if device.mig else device.node
            capacity[where] = capacity.get(where, 0) + 1
        return KubernetesPlacement(
            store,
            inventory,
            EngineReservations(store, inventory, zone(settings.time_zone), hub_clock(settings.test_clock_file)),
            free_gpus,
            self.k8s_poll_interval,
            self.k8s_report_timeout,
            learn=(lambda node, uuids: NodeUUIDs(store).accept(node, uuids, capacity.get(node, 0)))
            if real
            else (lambda node, uuids: None),
            total_gpus=lambda: len(settings.inventory.devices),
            learn_slices=(
                lambda node, uuids, profile: NodeUUIDs(store).accept(
                    node, uuids, capacity.get(slice_key(node, profile), 0), profile
                )
            )
            if real
            else (lambda node, uuids, profile: None),
        )

    def build_policy(self, settings: PolicySettings) -> GPUPolicy:
        store = AllocationStore(settings.db_url)
        policy = KubernetesPolicy(settings, store, self.engine_placement(settings, store))
        _policies.add(policy)
        return policy

    def watch_recovered(self) -> None:
        """A pod or event watch is back after the API server was away: the ledger and the cluster may disagree
        (pods deleted, evicted or ended meanwhile), so every Kubernetes policy of this process reconciles now."""
        for policy in list(_policies):
            policy.reconcile_soon()

    def hub_id(self) -> str:
        """This hub's id (blocking: the GPU database), in every name and label the hub gives the cluster."""
        return hub_id(self.gpu_policy.store)

    def _names(self, hub: str) -> None:
        """This server's pod and home names under this hub's id (kept in state once the home exists)."""
        self._hub = hub
        self.pod_name = f"wb-{hub}-{self._expand_user_properties('{user_server}')}"
        if not self._pvc_exists:
            self.pvc_name = f"wb-{hub}-home-{safe_slug(self.user.name, max_length=48)}"

    # -- lifecycle -----------------------------------------------------------------------------

    async def load_user_options(self):
        """Nothing: the workbench's form and admission own the options (``profile`` is a workbench
        resource profile, already applied by ``size_server``); KubeSpawner's would look ``profile``
        up in its own ``profile_list`` and refuse the spawn."""

    async def engine_submit(self) -> PodJob:
        self.workbench_report = None
        hub, limit = await asyncio.to_thread(lambda: (self.hub_id(), self._session_hours()))
        self._names(hub)
        self._session_limit = limit
        self._model_selector = {}
        if self.gpu_request.gpu_model:
            nodes = await self._nodes()
            self._model_selector = model_selector(
                self.gpu_request.gpu_model, [n.labels for n in nodes], self.gpu_product_label, self.gpu_memory_label
            )
        if self.workbench_network_policy:
            await self._ensure_network_policy(hub)
        key = f"{self.namespace}/{self.pod_name}"
        # The watches first: the pod and its events are followed from them (KubeSpawner starts them
        # again in _start, which is a no-op then).
        await self._start_watching_pods()
        await self._start_watching_events()
        self._start_future = asyncio.ensure_future(KubeSpawner._start(self))
        while key not in self.pod_reflector.pods:
            if self._start_future.done():
                self._raise_start_failure()
                break
            await asyncio.sleep(0.1)
        self._gpu_events.add(f"Created pod {self.pod_name} in namespace {self.namespace}", 5)
        submitted = time.monotonic()

        def started() -> PodReport | None:
            return PodReport.from_json(self.workbench_report)

        return PodJob(
            job_id=key,
            started=started,
            pod=lambda: self.pod_reflector.pods.get(key),
            events=lambda: self.events,
            submitted=submitted,
            profile=(self.gpu_request.gpu_profile or "") if self.gpu_request.gpus else "",
        )

    def _raise_start_failure(self) -> None:
        """KubeSpawner's start ended before the pod was seen: the API refused it, in its words."""
        exc = self._start_future.exception()
        if exc is None:
            return
        if isinstance(exc, SpawnException):
            raise exc
        detail = exc.body if isinstance(exc, ApiException) and exc.body else str(exc)
        raise SpawnException(
            f"Kubernetes refused the server's pod or home volume: {str(detail)[:400]}; nothing runs. Tell a hub "
            "admin if this persists.",
            reason="kubernetes_refused",
            status_code=500,
        ) from None

    async def engine_connect(self, lease: Lease | None) -> tuple[str, int]:
        url = await self._start_future
        if lease:
            await self._annotate(ANNOTATION_GPUS, ",".join(lease.gpu_uuids))
        node = lease.node if lease else (PodReport.from_json(self.workbench_report) or PodReport("", ())).node
        self._gpu_events.add(f"Running on {node or 'its node'} with {', '.join(self.gpu_uuids) or 'no GPU'}", 90)
        parsed = urlparse(url)
        return parsed.hostname or "", parsed.port or self.port

    async def engine_cancel(self) -> None:
        """Delete this server's pod (by its name under this hub's id); never raises."""
        future = getattr(self, "_start_future", None)
        if future is not None and not future.done():
            future.cancel()
        try:
            if not self._hub:
                self._names(await asyncio.to_thread(self.hub_id))
            try:  # KubeSpawner's client, on the hub's loop: no thread, no new connection per spawn
                await asyncio.wait_for(
                    self.api.delete_namespaced_pod(self.pod_name, self.namespace, grace_period_seconds=0),
                    self.k8s_api_request_timeout,
                )
                self.log.info("Deleted pod %s/%s of %s", self.namespace, self.pod_name, self._log_name)
            except ApiException as exc:
                if exc.status != 404:  # nothing left of an earlier start: the usual case
                    raise
            key = f"{self.namespace}/{self.pod_name}"
            for _ in range(300):  # the kubelet confirms deletion in seconds; a new pod needs the name
                if self.pod_reflector is None or key not in self.pod_reflector.pods:
                    break
                await asyncio.sleep(0.1)
        except Exception as exc:  # noqa: BLE001 - cancel never raises (the contract)
            self.log.warning("Could not delete the pod of %s: %s", self._log_name, exc)

    async def stop(self, now=False):
        """The mixin's stop (which deletes the pod and then releases the lease with who asked), with the pod marked
        as the hub's own deletion meanwhile: the reconciler must not take it for one deleted outside the hub."""
        key = f"{self.namespace}/{self.pod_name}"
        _hub_deleting.add(key)
        seen = self.pod_reflector.pods.get(key) if self.pod_reflector is not None else None
        try:
            await super().stop(now=now)
        except Exception:
            # The pod may still run (the API server did not answer KubeSpawner's deletions), while the mixin has
            # released its lease and JupyterHub counts the server stopped: it is deleted once the API answers.
            uid = ((seen or self.last_pod() or {}).get("metadata") or {}).get("uid")
            if uid:
                _left_pods[key] = uid
                self.log.warning("Pod %s of %s is deleted as soon as the Kubernetes API answers", key, self._log_name)
            raise
        finally:
            _hub_deleting.discard(key)  # the lease is released by now (the mixin's stop, in it)

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
        if not lease.ref.startswith("k8s:") or not lease.ref[4:].partition("/")[2]:
            return None
        try:
            pod = self._pod_of(lease)
        except cluster.KubernetesUnavailable:
            return None
        node, condition = NodeState.UNKNOWN, ""
        if needs_node(pod, pod is None):
            node, condition = cluster.node_condition(node_name(pod) or lease.node)
        return pod_ending(pod, pod is None, node, condition)

    # -- after a hub restart -------------------------------------------------------------------

    def gpu_lease_ref(self) -> str:
        return f"k8s:{self.namespace}/{self.pod_name}" if self._hub else ""

    def gpu_lease_alive(self, lease: Lease) -> bool | None:
        """Whether the lease's pod runs (blocking). None, unknown, while the API server does not answer and
        while the hub itself is deleting the pod (its stop records why it ended)."""
        if not lease.ref.startswith("k8s:"):
            return False
        if lease.ref[4:] in _hub_deleting:
            return None
        try:
            pod = self._pod_of(lease)
        except cluster.KubernetesUnavailable:
            return None
        return bool(pod and not pod["metadata"].get("deletionTimestamp") and pod["status"].get("phase") == "Running")

    def _pod_of(self, lease: Lease) -> dict | None:
        """The pod a ``k8s:<namespace>/<name>`` lease names, as the API lists it now (None: no such pod);
        blocking, and KubernetesUnavailable when the API server cannot say."""
        namespace, _, name = lease.ref[4:].partition("/")
        pods = recent_pods(namespace, f"{LABEL_HUB}={self.hub_id()}")
        return next((p for p in pods if p["metadata"]["name"] == name), None)

    def gpu_reconcile_orphans(self) -> None:
        for line in delete_left_pods(self.log):
            self.gpu_policy.record_fix(SERVER_STOPPED, line)
        store = self.gpu_policy.store
        hub = hub_id(store)
        try:
            pods = cluster.list_pods(self.namespace, f"{LABEL_HUB}={hub}")
        except cluster.KubernetesUnavailable as exc:
            self.log.warning("Cannot list pods to reconcile GPU leases: %s", exc)
            return

        def delete(name: str) -> None:
            try:
                cluster.delete_pod(self.namespace, name, 0)
            except cluster.KubernetesUnavailable as exc:
                self.log.warning("Could not delete pod %s: %s", name, exc)

        shares = self.gpu_policy.shares()  # an adopted slice is charged by its share, as when it started

        def adopt(*args) -> bool:
            return store.adopt(*args, shares=shares)

        actions = reconcile_pods(pods, store.leases(), adopt, delete, PROCESS_STARTED)
        fixes = {"adopted": SERVER_ADOPTED, "deleted": SERVER_STOPPED}  # counted on /metrics; each was logged
        self.gpu_policy.count_fixes([action.what for action in actions], fixes)

    def get_state(self):
        state = super().get_state()
        if self._hub:
            state["workbench_hub"] = self._hub
        return state

    def load_state(self, state):
        super().load_state(state)
        self._hub = state.get("workbench_hub", "")

    def clear_state(self):
        super().clear_state()
        self._hub = ""


class KubernetesPolicy(GPUPolicy):
    """The GPU policy on Kubernetes: its inventory names every GPU a pod reported by its real UUID."""

    @property
    def inventory(self) -> DeviceInventory:
        return NodeUUIDs(self.store).resolve(self.settings.inventory)


def _backend_traits(config) -> KubernetesTraits:
    """This backend's settings read from ``config`` as the spawner reads them (its class's sections)."""

    class Reader(KubernetesTraits):
        @classmethod
        def section_names(cls):
            return KubernetesGPUSpawner.section_names()

    return Reader(config=config)


_inventories: dict[tuple[str, str], DeviceInventory] = {}
# Every Kubernetes policy of this process, woken when a watch comes back (``watch_recovered``).
_policies: weakref.WeakSet[GPUPolicy] = weakref.WeakSet()
# "namespace/pod" of the pods the hub is deleting now (a stop): their disappearance is no outside deletion.
_hub_deleting: set[str] = set()
# "namespace/pod" -> uid of pods whose stop failed (the API server was away): deleted by the next reconcile pass.
_left_pods: dict[str, str] = {}


def delete_left_pods(log: logging.Logger) -> list[str]:
    """Delete the pods whose stop failed while the API server was away (blocking; the reconciler's pass);
    returns one line for each pod deleted (a fix to count and log).

    By uid: a new pod of the same server (same name) started since is never touched. One that is gone
    already, or replaced, is forgotten; one the API server still does not answer for is tried next pass."""
    done = []
    for key, uid in list(_left_pods.items()):
        namespace, _, name = key.partition("/")
        try:
            cluster.delete_pod(namespace, name, 0, uid=uid)
        except cluster.KubernetesUnavailable as exc:
            log.warning("Pod %s, whose stop failed, is still to be deleted: %s", key, exc)
            continue
        _left_pods.pop(key, None)
        done.append(f"reconcile: deleted pod {key}, whose stop failed while the Kubernetes API did not answer")
    return done


_pods_cache: dict[tuple[str, str], tuple[float, list[dict[str, Any]]]] = {}


def recent_pods(namespace: str, selector: str, max_age: float = 2.0) -> list[dict[str, Any]]:
    """This hub's pods, read at most every ``max_age`` s (reconcile asks once per lease)."""
    at, pods = _pods_cache.get((namespace, selector), (0.0, []))
    if time.monotonic() - at > max_age:
        pods = cluster.list_pods(namespace, selector)
        _pods_cache[(namespace, selector)] = (time.monotonic(), pods)
    return pods
