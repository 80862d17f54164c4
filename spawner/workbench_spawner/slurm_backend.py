"""The Slurm backend (``gpu-slurm``): one batch job per user server; Slurm places the GPUs.

batchspawner's ``SlurmSpawner`` submits and follows the job (``sudo -E -u
<user> sbatch``, so the job runs as the user's own Unix account); our GPU
mixin keeps what is ours: admission before anything is submitted (a refusal
submits nothing), the ledger, GPU-hours, the fleet view. Slurm's queue is the
wait: ``SlurmPlacement`` follows the job, shows Slurm's reason and position,
cancels it at the queue timeout, and writes the lease once Slurm has placed
it and the job reported its GPU UUIDs (see ``slurm_singleuser``).

Reconcile rule after a hub restart (servers keep running: cleanup_servers is
False): every job carries the tag ``workbench:<user>/<server>`` in its
comment. A lease whose job is no longer running is released and its ledger
entry closed. A running tagged job without a lease is adopted when none of
its GPUs is leased to someone else, else cancelled. A tagged job still
pending has lost the spawn that waited for it, and is cancelled.

What this class changes in batchspawner 1.3.0 for JupyterHub 6 (see README):
the start is ours (the stock loop has no queue timeout and never cancels a
pending job when the spawn is abandoned), the server address is the node's
``NodeAddr`` (the stock one is the node name, which need not resolve on the
hub), and ``--get-user-env=L`` resetting PATH is undone in the batch script.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
from dataclasses import replace

from batchspawner import SlurmSpawner
from jupyterhub.spawner import SpawnException
from traitlets import Dict, Float, Unicode, default

from workbench_devices import DeviceInventory, GPUDevice, parse_simulated_spec

from .mixin import GPUSpawnerMixin
from .placement import NoGPUAvailable
from .policy import GPUPolicy, shared_policy
from .settings import resolve_policy_settings
from .slurm_jobs import NodeReport, SlurmNode, SlurmUnavailable, cancel, list_jobs, list_nodes, partitions, \
    sbatch_options
from .slurm_placement import SlurmPlacement
from .store import AllocationStore, Lease

BATCH_SCRIPT = """#!/bin/bash
{% for opt in sbatch_lines %}#SBATCH {{opt}}
{% endfor %}#SBATCH --output={{homedir}}/workbench-slurm-%j.log
#SBATCH --chdir={{homedir}}
#SBATCH --export={{keepvars}}
#SBATCH --get-user-env=L
set -euo pipefail
# --get-user-env=L ran the user's login shell, which reset PATH: the shared environment goes first again.
export PATH={{env_bin}}:$PATH
trap 'echo SIGTERM received' TERM
{{prologue}}
{{cmd}}
{{epilogue}}
"""


def cluster_inventory(nodes: list[SlurmNode], simulated_spec: str) -> DeviceInventory:
    """Every GPU of the cluster from Slurm's node records, one device per (node, GRES index).

    Simulated GPUs take the UUIDs each node's jobs will report
    (``GPU-sim-<node>-NN-...``); real GPUs are named ``SLURM-<node>-gpuN`` here
    until a job on the node reports their UUIDs (the lease always holds the
    reported ones).
    """
    devices: list[GPUDevice] = []
    for node in nodes:
        simulated = parse_simulated_spec(simulated_spec, node.name) if simulated_spec.strip() not in ("", "0") else []
        for index in range(node.gpu_count):
            if index < len(simulated):
                devices.append(replace(simulated[index], index=index, node=node.name))
            else:
                devices.append(GPUDevice(uuid=f"SLURM-{node.name}-gpu{index}", index=index,
                                         name=f"{node.gpu_type or 'GPU'} on {node.name}",
                                         memory_total_bytes=0,
                                         model=(node.gpu_type or "").upper(), node=node.name))
    source = "simulated" if simulated_spec.strip() not in ("", "0") else "slurm"
    names = ", ".join(f"{n.name} ({n.gpu_count})" for n in nodes)
    label = "simulated GPU(s), readings made up" if source == "simulated" else "GPU(s)"
    return DeviceInventory(source, devices, f"{len(devices)} {label} on Slurm nodes {names}")


class SlurmGPUSpawner(GPUSpawnerMixin, SlurmSpawner):
    """batchspawner's SlurmSpawner with GPU Workbench's admission, ledger and fleet view."""

    slurm_partition = Unicode(
        help="""
        Partition every job goes to unless the user picks another allowed one
        (``partition`` spawn option). Empty: Slurm's default partition.
        Defaults to $WORKBENCH_SLURM_PARTITION.
        """,
    ).tag(config=True)

    @default("slurm_partition")
    def _default_slurm_partition(self):
        return os.environ.get("WORKBENCH_SLURM_PARTITION", "")

    slurm_account = Unicode(
        help="Slurm account (``--account``) of every job. Defaults to $WORKBENCH_SLURM_ACCOUNT.",
    ).tag(config=True)

    @default("slurm_account")
    def _default_slurm_account(self):
        return os.environ.get("WORKBENCH_SLURM_ACCOUNT", "")

    slurm_qos = Unicode(
        help="""
        Slurm QOS (``--qos``) of every job; a site backs our GPU quota with
        the QOS's ``MaxTRESPerUser=gres/gpu=N``. Defaults to $WORKBENCH_SLURM_QOS.
        """,
    ).tag(config=True)

    @default("slurm_qos")
    def _default_slurm_qos(self):
        return os.environ.get("WORKBENCH_SLURM_QOS", "")

    slurm_extra_options = Unicode(
        help="""
        More sbatch options for every job, as one shell-quoted string
        (``--constraint=ib --exclusive``), each put on its own ``#SBATCH``
        line after ours. Defaults to $WORKBENCH_SLURM_EXTRA_OPTIONS.
        """,
    ).tag(config=True)

    @default("slurm_extra_options")
    def _default_slurm_extra_options(self):
        return os.environ.get("WORKBENCH_SLURM_EXTRA_OPTIONS", "")

    slurm_env_prefix = Unicode(
        help="""
        The workbench single-user environment on storage every node mounts
        (a venv or conda env with ``jupyterhub-singleuser``, JupyterLab and
        the GPU monitor). Its ``bin`` goes first on the job's PATH. Defaults
        to $WORKBENCH_SLURM_ENV, else the hub's own environment (right when
        the hub's environment is itself on the shared storage).
        """,
    ).tag(config=True)

    @default("slurm_env_prefix")
    def _default_slurm_env_prefix(self):
        return os.environ.get("WORKBENCH_SLURM_ENV") or sys.prefix

    slurm_poll_interval = Float(
        1.0,
        min=0.1,
        help="Seconds between looks at Slurm's queue while a job is pending or starting.",
    ).tag(config=True)

    workbench_report = Dict(
        allow_none=True,
        default_value=None,
        help="""
        Set by the job's start-up through ``/hub/api/batchspawner`` (never
        configure it): the node's GPUs and the job's UUIDs.
        """,
    )

    @default("batch_script")
    def _default_batch_script(self):
        return BATCH_SCRIPT

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

    @classmethod
    def policy_inventory(cls, config_obj) -> DeviceInventory:
        """The hub's GPU list for admission, the stored settings and the fleet view (blocking)."""
        key = config_obj.simulated_gpus
        if key not in _inventories:
            try:
                nodes = [n for n in list_nodes() if n.gpu_count]
            except SlurmUnavailable as exc:
                return DeviceInventory("none", [], f"Slurm did not answer: {exc}")
            _inventories[key] = cluster_inventory(nodes, config_obj.simulated_gpus)
        return _inventories[key]

    @property
    def gpu_policy(self) -> GPUPolicy:
        settings = replace(resolve_policy_settings(self), inventory=self.policy_inventory(self), node="")
        key = ("slurm", settings.db_url, tuple(d.uuid for d in settings.inventory.devices))

        def build() -> GPUPolicy:
            store = AllocationStore(settings.db_url)
            placement = SlurmPlacement(store, lambda: len(settings.inventory.devices), self.slurm_poll_interval)
            return GPUPolicy(settings, store, placement)

        policy = shared_policy(key, build)
        policy.reconcile(self.gpu_lease_alive, self.gpu_reconcile_orphans)
        return policy

    # -- options ---------------------------------------------------------------------------------

    async def _apply_gpu_options(self, user_options: dict) -> None:
        options = dict(user_options or {})
        choice = options.pop("partition", None)
        if choice is not None:
            offered = await asyncio.to_thread(partitions)
            if not isinstance(choice, str) or choice.strip() not in offered:
                raise SpawnException(
                    f"Cannot start the server: partition {str(choice)[:60]!r} is not a partition of this "
                    f"cluster; choose one of: {', '.join(offered)}.", reason="bad_options", status_code=400)
            self.slurm_partition_choice = choice.strip()
        await super()._apply_gpu_options(options)

    def sbatch_lines(self, session_hours: float | None) -> list[str]:
        request = self.gpu_request
        return sbatch_options(
            user=self.user.name, server=self.name, gpus=request.gpus, model=request.gpu_model,
            cpus=self.cpu_limit or 1, mem_bytes=self.mem_limit, session_hours=session_hours,
            partition=self.slurm_partition_choice or self.slurm_partition, account=self.slurm_account,
            qos=self.slurm_qos, extra=self.slurm_extra_options)

    async def _get_batch_script(self, **subvars):
        hours = await asyncio.to_thread(self._session_hours)
        subvars.update(sbatch_lines=self.sbatch_lines(hours), env_bin=shlex.quote(
            os.path.join(self.slurm_env_prefix, "bin")))
        return await super()._get_batch_script(**subvars)

    def _session_hours(self) -> float | None:
        """The session limit admission recorded for this start: it becomes the job's --time."""
        return self.gpu_quota_book.session_limits().get((self.user.name, self.name))

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self):
        self._gpu_events.reset()
        self._gpu_starting = True
        self.workbench_report = None
        self.ip = self.traits()["ip"].default_value
        self.port = 0
        if self.server:
            self.server.port = self.port
        request = self.gpu_request
        try:
            try:
                await self.submit_batch_script()
            except RuntimeError as exc:
                raise SpawnException(f"Slurm refused the job: {str(exc).strip()[:300]}",
                                     reason="bad_options", status_code=400) from None
            if not self.job_id:
                raise SpawnException("Slurm did not say which job it made; nothing was started.",
                                     status_code=500)
            self._gpu_events.add(f"Submitted Slurm job {self.job_id}", 5)
            policy = await self._policy()
            try:
                lease = await self._place(policy, request)
            except NoGPUAvailable as exc:
                self.clear_state()
                raise SpawnException(str(exc), reason="no_gpu", status_code=503) from None
            except BaseException:
                # The hub gave up on the spawn (start_timeout, the user cancelled): no job may stay behind.
                await self._cancel_quietly()
                raise
            self.gpu_uuids = list(lease.gpu_uuids) if lease else []
            self._gpu_events.add(
                f"Running on {self._job_node} with {', '.join(self.gpu_uuids) or 'no GPU'}", 90)
            while not self.port:
                await asyncio.sleep(0.1)
            self.ip = await asyncio.to_thread(self._node_address, self._job_node)
            return self.ip, self.port
        except BaseException:
            await asyncio.to_thread(self._release, "start failed")
            raise
        finally:
            self._gpu_starting = False

    async def _place(self, policy: GPUPolicy, request) -> Lease | None:
        self._job_node = ""

        def started() -> NodeReport | None:
            report = NodeReport.from_json(self.workbench_report)
            return self._trusted(report) if report else None

        placement = policy.placement
        assert isinstance(placement, SlurmPlacement)
        lease = await placement.place(
            self.user.name, self.name, request.gpus, request.gpu_model, self.gpu_queue_timeout,
            job_id=self.job_id, started=started, describe=lambda text: self._gpu_events.add(text, 20))
        report = NodeReport.from_json(self.workbench_report)
        self._job_node = lease.node if lease else (report.node if report else "")
        return lease if request.gpus else None

    def _trusted(self, report: NodeReport) -> NodeReport:
        """The report with the node's GPU list from the hub where it knows it (simulated nodes).

        The report comes from a process the user controls; where the hub can
        compute the node's UUIDs itself, it uses its own list, so a forged
        report cannot name another node's GPUs.
        """
        known = [d for d in parse_simulated_spec(self.simulated_gpus, report.node)] \
            if self.simulated_gpus.strip() not in ("", "0") else []
        if not known:
            return report
        from dataclasses import asdict
        return replace(report, gpus=tuple(asdict(d) for d in known))

    def _node_address(self, node: str) -> str:
        try:
            nodes = {n.name: n.address for n in list_nodes()}
        except SlurmUnavailable:
            nodes = {}
        return nodes.get(node) or node or self.state_gethost()

    async def _cancel_quietly(self) -> None:
        if self.job_id:
            try:
                await asyncio.to_thread(cancel, self.job_id)
            except SlurmUnavailable as exc:
                self.log.warning("Could not cancel Slurm job %s: %s", self.job_id, exc)

    async def stop(self, now=False):
        # A job that never started is cancelled too (batchspawner's stop only scancels).
        try:
            await SlurmSpawner.stop(self, now=now)
        finally:
            await asyncio.to_thread(self._release, "stopped")

    def gpu_lease_ref(self) -> str:
        return f"slurm:{self.job_id}" if self.job_id else ""

    def gpu_lease_alive(self, lease: Lease) -> bool | None:
        if not lease.ref.startswith("slurm:"):
            return False
        try:
            jobs = {j.job_id: j for j in list_jobs()}
        except SlurmUnavailable:
            return None
        job = jobs.get(lease.ref.split(":", 1)[1])
        return bool(job and job.running)

    def gpu_reconcile_orphans(self) -> None:
        """Adopt or cancel tagged jobs without a lease; cancel tagged jobs left pending."""
        try:
            jobs = list_jobs()
        except SlurmUnavailable as exc:
            self.log.warning("Cannot list Slurm jobs to reconcile GPU leases: %s", exc)
            return
        store = self.gpu_policy_store()
        leased = {(l.user, l.server) for l in store.leases()}
        inventory = self.policy_inventory(self)
        by_node_index = {}
        if inventory.source == "simulated":
            for node in {j.node for j in jobs if j.node}:
                for d in parse_simulated_spec(self.simulated_gpus, node):
                    by_node_index[(node, d.index)] = d.uuid
        for job in jobs:
            tag = job.tag
            if tag is None or tag in leased:
                continue
            if job.pending:
                self.log.warning("Cancelling pending Slurm job %s of %s/%s: no spawn waits for it any more",
                                 job.job_id, *tag)
                cancel(job.job_id)
                continue
            if not job.running:
                continue
            uuids = [by_node_index.get((job.node, i)) for i in job.gpu_indices]
            if None not in uuids and store.adopt(tag[0], tag[1], uuids, f"slurm:{job.job_id}", None, job.node):
                self.log.info("Adopted Slurm job %s of %s/%s on %s with GPU(s) %s", job.job_id, *tag, job.node, uuids)
            else:
                self.log.warning("Cancelling Slurm job %s of %s/%s: its GPUs are leased to another server or "
                                 "unknown to the hub", job.job_id, *tag)
                cancel(job.job_id)

    def gpu_policy_store(self) -> AllocationStore:
        # Inside reconcile, gpu_policy is being built: its store is the one shared policy's.
        settings = resolve_policy_settings(self)
        key = ("slurm", settings.db_url, tuple(d.uuid for d in self.policy_inventory(self).devices))
        return shared_policy(key, lambda: None).store  # type: ignore[union-attr]

    def load_state(self, state):
        super().load_state(state)
        self._job_node = state.get("slurm_node", "")

    def get_state(self):
        state = super().get_state()
        if getattr(self, "_job_node", ""):
            state["slurm_node"] = self._job_node
        return state


_inventories: dict[str, DeviceInventory] = {}
