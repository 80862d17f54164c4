"""The Slurm backend (``gpu-slurm``): one batch job per user server; Slurm places the GPUs.

batchspawner's ``SlurmSpawner`` submits and follows the job (``sudo -E -u
<user> sbatch``, so the job runs as the user's own Unix account); our GPU
mixin keeps what is ours: admission before anything is submitted (a refusal
submits nothing), the ledger, GPU-hours, the fleet view. Slurm's queue is the
wait: ``SlurmPlacement`` follows the job, shows Slurm's reason and position,
cancels it at the queue timeout, and writes the lease once Slurm has placed
it and the job reported its GPU UUIDs (see ``backends/slurm/singleuser.py``).

Around Slurm's queue the workbench keeps its own rules: open reservations
hold a non-member's request back before it is submitted, fair share
reorders the workbench's pending jobs (``backends/slurm/fairness.py``).
Every job carries the tag ``workbench:<hub id>:<user>/<server>`` in its
comment; after a hub restart (servers keep running: cleanup_servers is
False) leases and jobs are reconciled by it (``backends/slurm/reconcile.py``).
The job's start report reaches the hub through our handler, not
batchspawner's (``backends/slurm/report_api.py``).

The job's script is batchspawner's own: its ``batch_script`` template
formatted with its ``req_*`` traits, two of them computed for each start
(``backends/slurm/batch_script.py``).

What this class changes in batchspawner 1.3.0 for JupyterHub 6 (see README):
the start is ours (the stock loop has no queue timeout and never cancels a
pending job when the spawn is abandoned), the server address is the node's
``NodeAddr`` (the stock one is the node name, which need not resolve on the
hub), ``--get-user-env=L`` resetting PATH is undone in the batch script, a
requeued job ends its server and a stop with no job id cancels by tag
(``backends/slurm/job_spawner.py``), and batchspawner's API handler, which
lets a job set any spawner attribute, is replaced.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import time
from dataclasses import asdict, replace

from jupyterhub.spawner import SpawnException
from traitlets import default

from workbench_devices import DeviceInventory, parse_simulated_spec
from workbench_spawner.backends.slurm.batch_script import BATCH_SCRIPT, SlurmBatchScript, refuse_computed_options
from workbench_spawner.backends.slurm.ending import job_ending
from workbench_spawner.backends.slurm.inventory import NodeGPUMap, cluster_inventory, placeholder_uuid
from workbench_spawner.backends.slurm.jobs import (
    SlurmUnavailableError,
    cancel,
    cancelled_by_hub,
    list_jobs,
    list_nodes,
    partitions,
)
from workbench_spawner.backends.slurm.node_report import NodeReport
from workbench_spawner.backends.slurm.placement import SlurmPlacement
from workbench_spawner.backends.slurm.reconcile import WORDS, reconcile_jobs
from workbench_spawner.backends.slurm.records import SlurmJob
from workbench_spawner.backends.slurm.sbatch import sbatch_failure
from workbench_spawner.ledger import endings
from workbench_spawner.ledger.endings import Ending
from workbench_spawner.ledger.gpu_hours import gpu_hours_used
from workbench_spawner.ledger.store import AllocationStore, Lease
from workbench_spawner.placement.engine import EngineJob
from workbench_spawner.placement.engine_fleet import Recent
from workbench_spawner.placement.engine_inventory import is_simulated
from workbench_spawner.placement.engine_reconcile import adopter
from workbench_spawner.placement.engine_spawner import EngineSpawner, engine_reservations, inventory_once
from workbench_spawner.policy.settings import PolicySettings


class SlurmGPUSpawner(EngineSpawner, SlurmBatchScript):
    """batchspawner's SlurmSpawner with GPU Workbench's admission, ledger and fleet view (engine placement).

    ``workbench_report``: set by the job's start-up through ``/hub/api/batchspawner``, the node's GPUs and the
    job's UUIDs."""

    workbench_backend = "slurm"
    lease_ref_prefix = "slurm"
    server_environment = "the cluster's Python environment (the batch job's)"

    @default("batch_script")
    def _default_batch_script(self):
        return BATCH_SCRIPT  # its variables: batch_script.py

    @default("batchspawner_singleuser_cmd")
    def _default_singleuser_cmd(self):
        return os.path.join(self.slurm_env_prefix, "bin", "workbench-slurm-singleuser")

    @default("req_srun")
    def _default_req_srun(self):
        # The batch step holds the job's GPUs; a job step would add a second launch for nothing.
        return ""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.slurm_partition_choice = ""
        self._job_node = ""

    # -- the cluster and the policy ------------------------------------------------------------

    def engine_inventory(self) -> DeviceInventory:
        """The cluster's GPUs from Slurm's node records, read once per hub process (blocking).

        ``self`` may be a bare config object with the policy's traits (the
        hub publishes its settings before any spawner exists)."""
        return inventory_once(
            ("slurm", self.simulated_gpus),
            lambda: cluster_inventory([n for n in list_nodes() if n.gpu_count], self.simulated_gpus),
            SlurmUnavailableError,
            "Slurm",
        )

    def engine_placement(self, settings: PolicySettings, store: AllocationStore) -> SlurmPlacement:
        def inventory() -> DeviceInventory:
            return NodeGPUMap(store).resolve(settings.inventory)

        return SlurmPlacement(
            store,
            inventory,
            self.slurm_poll_interval,
            queue_order=settings.queue_order,
            aging_minutes=settings.queue_aging_minutes,
            reservations=engine_reservations(settings, store, inventory),
            gpu_hours=lambda user: gpu_hours_used(store, user),
            learn=NodeGPUMap(store).accept if self.learns_node_uuids(settings) else lambda report: None,
            devices=lambda: settings.inventory.devices,
        )

    # -- options ---------------------------------------------------------------------------------

    async def check_options(self, options: dict) -> dict:
        """The user's Unix account, and the ``partition`` option (checked against the allowed ones); no
        option named like a variable the hub computes for the batch script (``refuse_computed_options``)."""
        self.slurm_partition_choice = ""  # a partition picked for one start does not stick to the next
        refuse_computed_options(options)
        await asyncio.to_thread(self._check_account)
        choice = options.pop("partition", None)
        if choice is not None:
            self.slurm_partition_choice = await self._allowed_partition(choice)
        return options

    def _check_account(self) -> None:
        """Jobs run as the user's Unix account: it must exist and not be a system account."""
        name = self.user.name
        try:
            uid = pwd.getpwnam(name).pw_uid
        except KeyError:
            raise SpawnException(
                f"Cannot start the server: there is no Unix account named {name!r} on the hub's host, and Slurm "
                "jobs run as the user's own account; ask a hub admin to create it (or to log people in with "
                "PAM or LDAP, docs/slurm.md).",
                reason="no_account",
                status_code=403,
            ) from None
        if uid < self.slurm_min_uid:
            raise SpawnException(
                f"Cannot start the server: {name!r} is a system account (uid {uid}), and Slurm jobs never run as "
                f"one; log in with your own account.",
                reason="system_account",
                status_code=403,
            )

    async def _allowed_partition(self, choice: object) -> str:
        try:
            offered = await asyncio.to_thread(partitions)
        except SlurmUnavailableError as exc:
            raise SpawnException(
                f"Cannot start the server: Slurm's controller did not answer ({str(exc)[:200]}), so nothing was "
                "submitted. Try again in a minute; if it persists, tell a hub admin.",
                reason="slurm_unavailable",
                status_code=503,
            ) from None
        allowed = [p for p in offered if not self.slurm_partitions or p in self.slurm_partitions]
        name = choice.strip() if isinstance(choice, str) else ""
        if name not in allowed:
            raise SpawnException(
                f"Cannot start the server: partition {str(choice)[:60]!r} is not a partition you may use on "
                f"this cluster; choose one of: {', '.join(allowed) or '(none)'}.",
                reason="bad_options",
                status_code=400,
            )
        return name

    # -- lifecycle -----------------------------------------------------------------------------

    async def engine_submit(self) -> EngineJob:
        self.ip = self.traits()["ip"].default_value
        self.port = 0
        if self.server:
            self.server.port = self.port
        self._job_node = ""
        try:
            await self.submit_batch_script()
        except RuntimeError as exc:
            # sbatch failed, or was killed because the spawn was abandoned: a job may exist all the same.
            self.job_id = ""
            await self._cancel_quietly()
            status, message = sbatch_failure(str(exc))
            raise SpawnException(
                message, reason="slurm_refused" if status == 400 else "slurm_unavailable", status_code=status
            ) from None
        if not self.job_id:
            raise SpawnException(
                "Slurm did not say which job it made; nothing was started.", reason="slurm_refused", status_code=500
            )
        self._gpu_events.add(f"Submitted Slurm job {self.job_id}", 5)

        def started() -> NodeReport | None:
            report = NodeReport.from_json(self.workbench_report)
            return self._trusted(report) if report else None

        return EngineJob(job_id=self.job_id, started=started, kind=self.gpu_request.kind)

    async def engine_connect(self, lease: Lease | None) -> tuple[str, int]:
        self._job_node = self.announce_running(lease, NodeReport.from_json(self.workbench_report))
        while not self.port:
            await asyncio.sleep(0.1)
        self.ip = await asyncio.to_thread(self._node_address, self._job_node)
        return self.ip, self.port

    async def engine_cancel(self) -> None:
        await self._cancel_quietly()

    def _trusted(self, report: NodeReport) -> NodeReport:
        """The report with the node's GPU list from the hub where it knows it (simulated nodes).

        The report comes from a process the user controls. Where the hub can
        compute the node's UUIDs itself it uses its own list, so a forged report
        cannot name another node's GPUs; real GPUs are checked against Slurm's
        job record and then against what the hub learned of the node
        (``SlurmPlacement.place``, ``NodeGPUMap``).
        """
        if not is_simulated(self.simulated_gpus):
            return report
        known = parse_simulated_spec(self.simulated_gpus, report.node)
        # Listed in Slurm's index order (``cluster_inventory``): a slice's index is its place in the list.
        return replace(report, gpus=tuple(asdict(replace(d, index=i)) for i, d in enumerate(known)))

    def _node_address(self, node: str) -> str:
        try:
            nodes = {n.name: n.address for n in list_nodes()}
        except SlurmUnavailableError:
            nodes = {}
        return nodes.get(node) or node or self.state_gethost()

    def gpu_lease_ref(self) -> str:
        return f"{self.lease_ref_prefix}:{self.job_id}" if self.job_id else ""

    def gpu_lease_alive(self, lease: Lease) -> bool | None:
        job_id = self.lease_job(lease)
        if not job_id:
            return False
        try:
            job = _recent_job(job_id)
        except SlurmUnavailableError:
            return None
        return bool(job and job.running)

    async def gpu_exit_reason(self) -> Ending | None:
        """Why the job ended, from the squeue line the poll that found it gone saw (``slurm_end``), in the
        student's words (``slurm/ending.py``): NODE_FAIL names the node and why Slurm marked it down, a
        CANCELLED job this hub did not cancel is "cancelled outside the hub" (one it cancelled: "stopped"),
        TIMEOUT names the time limit; None for a job squeue no longer knew."""
        job_id, status = self.slurm_end
        if not job_id:
            return None
        return await asyncio.to_thread(job_ending, job_id, status, cancelled_by_hub(job_id), _node_down_because)

    def gpu_lease_gone_reason(self, lease: Lease) -> Ending | None:
        """The same rule for the reconciler, from Slurm's job list (blocking; squeue keeps an ended job
        ``MinJobAge`` seconds, after that nobody can tell and the answer is None)."""
        job_id = self.lease_job(lease)
        if not job_id:
            return None
        try:
            job = _recent_job(job_id)
        except SlurmUnavailableError:
            return None
        if job is None or job.pending or job.running:
            return None  # gone from Slurm's memory, or requeued: nothing says why
        # A known end with nothing more to say is the server exiting, as poll says.
        return (
            job_ending(job_id, f"{job.state} {job.node}", cancelled_by_hub(job_id), _node_down_because)
            or endings.server_exited()
        )

    def gpu_reconcile_orphans(self) -> None:
        """Adopt or cancel this hub's tagged jobs without a lease (``backends/slurm/reconcile.py``)."""
        try:
            jobs = list_jobs()
        except SlurmUnavailableError as exc:
            self.log.warning("Cannot list Slurm jobs to reconcile GPU leases: %s", exc)
            return
        # Inside reconcile too, where asking for the policy returns at once (policy.reconcile).
        store = self.gpu_policy.store
        inventory = NodeGPUMap(store).resolve(self.engine_inventory())
        by_place = {(d.node, d.index): d.uuid for d in inventory.devices if d.uuid != placeholder_uuid(d.node, d.index)}
        actions = reconcile_jobs(
            jobs,
            store.leases(),
            self.hub_id(),
            lambda node, index: by_place.get((node, index)),
            adopter(store, inventory),
            cancel,
            submitted_before=PROCESS_STARTED,
        )
        self.gpu_policy.count_fixes([action.what for action in actions], WORDS.fixes)  # on /metrics; each was logged

    def load_state(self, state):
        super().load_state(state)
        self._job_node = state.get("slurm_node", "")

    def get_state(self):
        state = super().get_state()
        if getattr(self, "_job_node", ""):
            state["slurm_node"] = self._job_node
        return state

    def clear_state(self):
        """Forget the job's node with the job: a stopped server's saved state is empty (``load_state`` reads a
        state with anything in it as a server that was running)."""
        super().clear_state()
        self._job_node = ""


# Jobs submitted after this are this process's own spawns, never orphans of an earlier hub.
PROCESS_STARTED = time.time()
# Slurm's job list, read at most every 2 s (reconcile asks once per lease); SlurmUnavailableError reaches the caller.
recent_jobs = Recent(list_jobs, max_age=2.0)


def _recent_job(job_id: str) -> SlurmJob | None:
    """Job ``job_id`` in Slurm's recent job list (None: Slurm no longer lists it). Blocking."""
    return next((j for j in recent_jobs() or () if j.job_id == job_id), None)


def _node_down_because(node: str) -> str:
    """Why Slurm holds ``node`` down now ("down, not responding (Not responding)"), "" if it is up (blocking)."""
    try:
        found = {n.name: n for n in list_nodes()}.get(node)
    except SlurmUnavailableError:
        return ""
    return (found.unusable_because() or "") if found is not None else ""
