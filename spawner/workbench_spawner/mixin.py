"""The backend contract: everything a spawner needs to know about GPUs, for any backend.

``GPUSpawnerMixin`` goes in front of a JupyterHub spawner class. It holds the
policy's traits and the spawner life cycle as a template: admission
(``rules.admission.admit``) checks the spawn options against the quota,
placement puts the server on GPUs, the ledger records the lease, and every
way a server ends releases it: stop, failed or timed-out start, and a poll
that finds it dead. Every database call runs in a worker thread, so a busy
database never stalls the hub's event loop.

A backend declares one of two placement modes (docs/backends.md):

* ``host``: the policy acquires GPUs on a node it knows (a transaction in
  the GPU database, the wait list when none is free), then the backend's
  JupyterHub spawner (``super().start()``) starts the server pinned to them
  by ``gpu_environment``. Local and docker.
* ``engine``: the policy admits (quotas, reservations, fair-share order);
  the backend submits (``engine_submit``), the policy's engine placement
  follows the engine's queue with its reason and learns node and GPUs back,
  the ledger records the lease, and ``engine_connect`` says where the
  server listens. Slurm (Kubernetes next).

The members a backend implements are declared in ``contract.py``
(``BackendContract``, a base of this class through ``ServerStarts``), each
with the mode it belongs to; ``contract_problems`` names the ones a class misses, and the hub refuses
to start with such a class rather than fail silently at the first spawn. No backend overrides a private
method of this class or redefines ``start``.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime
from typing import ClassVar

from jupyterhub.spawner import Spawner
from traitlets import Float, Integer, List, Unicode, default

from workbench_spawner.contract import Mode, require_contract
from workbench_spawner.form.options import SpawnRequest, options_from_form
from workbench_spawner.form.progress import SpawnEvents
from workbench_spawner.form.spawn_page import spawn_page
from workbench_spawner.ledger import endings
from workbench_spawner.ledger.endings import Ending, as_ending
from workbench_spawner.ledger.hub_identity import hub_id
from workbench_spawner.ledger.lease_limits import LeaseLimits
from workbench_spawner.ledger.notices import NoticeBook
from workbench_spawner.ledger.quota_book import QuotaBook
from workbench_spawner.ledger.store import AllocationStore
from workbench_spawner.placement.engine_policy import EnginePolicy
from workbench_spawner.placement.start_line import LineFullError
from workbench_spawner.policy.config import GPUPolicyConfig
from workbench_spawner.policy.gpu_policy import GPUPolicy, shared_policy
from workbench_spawner.policy.inventory_refresh import policy_key, spec_in_force, watch
from workbench_spawner.policy.settings import PolicySettings, resolve_policy_settings
from workbench_spawner.policy.sizing import ServerSizing
from workbench_spawner.policy.stop_timing import StopTiming
from workbench_spawner.refusals import refused
from workbench_spawner.rules.admission import AdmissionContext, Refusal, admit, image_refusal
from workbench_spawner.ssh_forwarding import SSHForwarding
from workbench_spawner.starting import ServerStarts
from workbench_spawner.stop_requester import requested_by


class GPUSpawnerMixin(ServerStarts, GPUPolicyConfig, ServerSizing, StopTiming, SSHForwarding, Spawner):
    """GPU policy for a JupyterHub spawner; put it first in the bases.

    It derives from Spawner only so that its traits are real, configurable
    traits; the backend class after it in the bases does the spawning. The
    policy's own settings (inventory, database, quota default, queue
    timeout...) are in ``GPUPolicyConfig``, so the hub can resolve them at
    start without making a spawner.
    """

    workbench_backend: ClassVar[str] = ""
    """The ``workbench.backends`` entry point of this backend; subclasses inherit it, and its features."""

    placement_mode: ClassVar[Mode | str] = ""
    """``host`` (the policy picks the GPUs, then the server starts) or ``engine`` (the engine picks them)."""

    runs_picked_images: ClassVar[bool] = False
    """Whether a server of this backend runs the image a user picks (``offered_images``): the container backends
    do; a backend whose servers run the host's Python environment does not, so its form offers no image, its
    admission refuses an ``image`` option and the hub refuses to start with ``offered_images`` set."""

    server_environment: ClassVar[str] = "the host's Python environment"
    """What every server of a backend that runs no picked image runs, in the sentence that refuses a pick."""

    gpu_queue_recheck_interval = Float(
        2.0,
        min=0.05,
        help="""
        Seconds between re-checks of the database while waiting in line. A
        release in this hub wakes the line at once; the re-check catches
        releases made elsewhere (an admin editing the database, another hub).
        """,
    ).tag(config=True)

    default_gpus = Integer(
        1,
        min=0,
        help="""
        GPUs a server gets when the spawn request does not say ``gpus``. It is
        lowered to what the user's quota and the inventory allow, so CPU-only
        hubs still start servers with the default.
        """,
    ).tag(config=True)

    offered_images = List(
        Unicode(),
        help="""
        Images a user may pick on the spawn form (``image`` option). Empty
        means no choice is offered. Only for a backend that runs a picked
        image (docker, kubernetes); the hub refuses to start with it set for
        another (local, slurm), whose servers run one Python environment.
        """,
    ).tag(config=True)

    @default("start_timeout")
    def _default_start_timeout(self):
        # A spawn may wait in line for the whole queue timeout, then for a start slot (up to http_timeout, as
        # the servers ahead of it answer) before its server even starts; the hub must not give up on it first.
        return int(self.gpu_queue_timeout) + int(self.http_timeout) + 120

    @default("http_timeout")
    def _default_http_timeout(self):
        # JupyterHub's 30 s is for an idle host: at a class start a JupyterLab on a loaded host takes longer
        # to answer, and was given up while still starting (README, "A class starts at once").
        return 120

    @default("options_form")
    def _default_options_form(self):
        return self._render_options_form

    @default("options_from_form")
    def _default_options_from_form(self):
        return options_from_form

    @default("apply_user_options")
    def _default_apply_user_options(self):
        return type(self)._apply_gpu_options

    def __init__(self, *args, **kwargs):
        require_contract(type(self))
        super().__init__(*args, **kwargs)
        self._gpu_policy: GPUPolicy | None = None
        self.gpu_request = SpawnRequest(gpus=0)
        self.gpu_uuids: list[str] = []
        self._gpu_events = SpawnEvents()
        self._gpu_starting = False
        # Why a stop in progress happens: poll() (which the backend's stop may call) leaves the release to it.
        self._gpu_stopping: Ending | None = None
        # A server this spawner started (or found running after a restart) whose end is not recorded yet:
        # a CPU-only server holds no lease, and its end is explained all the same.
        self._gpu_running = False
        self._gpu_started_at: datetime | None = None
        self._lease_unchecked = False
        # Clean-ups of cancelled starts still running (kept so the loop does not drop them).
        self._gpu_cleanups: set[asyncio.Future] = set()
        # The task running start(), while it runs: a stop() meanwhile (the hub shutting down) cancels it.
        self._gpu_start_task: asyncio.Task | None = None

    # -- the shared policy (blocking: call from a worker thread) ----------------

    @property
    def gpu_policy(self) -> GPUPolicy:
        """The process-wide policy for this spawner's settings (blocking on first use: it may reconcile).

        The settings are resolved once per spawner, the policy built once
        per hub process for each distinct configuration (``shared_policy``)."""
        policy = self._gpu_policy
        if policy is None:
            settings = resolve_policy_settings(self)
            if self.placement_mode == "engine":
                settings = replace(settings, inventory=type(self).engine_inventory(self), node="")
            host = self.placement_mode == "host"
            key = (self.placement_mode, policy_key(settings, host, list(self.static_gpus), self.simulated_gpus))
            policy = self._gpu_policy = shared_policy((*key, settings.db_url), lambda: self.build_policy(settings))
        policy.reconcile(self.gpu_lease_alive, self.gpu_reconcile_orphans, self.gpu_lease_gone_reason)
        policy.refresh_inventory()  # a host's MIG layout may have changed: at most every inventory_refresh_seconds
        return policy

    def build_policy(self, settings: PolicySettings) -> GPUPolicy:
        """The policy for ``settings``; host backends place with the host allocator, engines with theirs."""
        store = AllocationStore(settings.db_url)
        if self.placement_mode == "engine":
            # An engine's inventory names each GPU by the UUID its jobs reported (the backend's node book).
            return EnginePolicy(settings, store, self.engine_placement(settings, store))
        policy = GPUPolicy(settings, store, recheck_interval=self.gpu_queue_recheck_interval)
        watch(policy, list(self.static_gpus), self.simulated_gpus, self.inventory_refresh_seconds)
        return policy

    async def _policy(self) -> GPUPolicy:
        return await asyncio.to_thread(lambda: self.gpu_policy)

    @property
    def gpu_quota_book(self) -> QuotaBook:
        return self.gpu_policy.quotas

    @property
    def server_label(self) -> str:
        """ "user" or "user:server", as log lines name this server (JupyterHub's own ``_log_name`` is private)."""
        return f"{self.user.name}:{self.name}" if self.name else self.user.name

    def gpu_session_hours(self) -> float | None:
        """The session limit admission recorded for this start (blocking: the GPU database); an engine turns
        it into its own limit (a Slurm job's --time, a pod's activeDeadlineSeconds)."""
        return self.gpu_quota_book.session_limits().get((self.user.name, self.name))

    def hub_id(self) -> str:
        """This hub's id (blocking: the GPU database), in every name and label the hub gives an engine."""
        return hub_id(self.gpu_policy.store)

    def gpu_admission_context(self, policy: GPUPolicy | None = None, **read) -> AdmissionContext:
        """What admission checks for this server now (reads the database). ``policy`` and ``read`` (the
        leases, status and inventory): what the spawn form's snapshot read already."""
        groups = [g.name for g in getattr(self.user, "groups", None) or []]
        return (policy or self.gpu_policy).admission_context(
            self.user.name,
            self.name,
            groups,
            **read,
            default_gpus=self.default_gpus,
            offered_images=tuple(self.offered_images) if self.runs_picked_images else (),
            image_refusal=""
            if self.runs_picked_images
            else image_refusal(self.workbench_backend, self.server_environment),
            profiles=tuple(p.slug for p in self.gpu_profiles),
        )

    def gpu_reserved_now(self, policy: GPUPolicy | None = None, **read) -> list[str]:
        """The spawn form's reservation lines for this user (reads the database; ``policy`` and ``read``
        as for ``gpu_admission_context``)."""
        groups = [g.name for g in getattr(self.user, "groups", None) or []]
        return (policy or self.gpu_policy).reserved_now(groups, **read)

    # -- options ----------------------------------------------------------------

    async def _render_options_form(self, spawner=None) -> str:
        # Every read in one worker-thread hop; the form says which server it starts (form/spawn_page.py).
        return await spawn_page(self)

    async def _apply_gpu_options(self, user_options: dict) -> None:
        user_options = await self.check_options(dict(user_options or {}))
        ctx = await asyncio.to_thread(self.gpu_admission_context)
        verdict = admit(user_options, ctx)
        if isinstance(verdict, Refusal):
            raise refused(verdict.message, reason=verdict.reason, status=verdict.status)
        self.gpu_limits = LeaseLimits.of(ctx.quota, ctx.contact)  # checked again where the lease is written
        # The session limit in force now; the workbench service stops servers
        # that run longer. A later quota change does not touch this server.
        await asyncio.to_thread(
            lambda: self.gpu_quota_book.record_session_limit(self.user.name, self.name, verdict.max_session_hours)
        )
        profile = self.size_server(verdict.request.profile)
        self.gpu_request = replace(verdict.request, profile=profile.slug if profile else None)
        self.apply_gpu_request(self.gpu_request)

    # -- lifecycle ----------------------------------------------------------------

    async def start(self):
        """The template: admission happened in ``apply_user_options``; place, start, record the lease."""
        self._gpu_events.reset()
        self._gpu_starting = True
        self._gpu_started_at = datetime.now(UTC)
        self._gpu_start_task = asyncio.current_task()
        key = (self.user.name, self.name)
        policy: GPUPolicy | None = None
        in_line = None
        try:
            policy = await self._policy()
            try:
                in_line = policy.start_line.join()  # a place in line, or a 503 past max_waiting_spawns
            except LineFullError as exc:
                raise refused(str(exc), reason="line_full", status=503) from None
            policy.starting.add(key)  # the reconciler leaves a spawn in flight alone
            # Starting again: the spawn page's "why your server stopped" has been read.
            await asyncio.to_thread(NoticeBook(policy.store).acknowledge, self.user.name, self.name)
            if self.placement_mode == "engine":
                result = await self._start_by_engine(policy)
            else:
                result = await self._start_on_host(policy, in_line)
            self._gpu_running = True
            return result
        finally:
            self._gpu_starting = False
            self._gpu_start_task = None
            if policy is not None:
                policy.starting.discard(key)
                policy.start_line.leave(in_line)

    async def stop(self, now=False):
        # Who asked (the user, an admin, the culler), read before the first await (stop_requester.py).
        self._gpu_stopping = requested_by(self.user.name, self.idle_culler_seconds) or endings.stopped_by_hub()
        # A server that ran has its end explained; the hub's stop after a failed start only tidies up.
        ran = self._gpu_running or bool(self.gpu_uuids)
        key = (self.user.name, self.name)
        policy = self._gpu_policy  # None: no policy yet, so no lease either
        if policy is not None:
            policy.stopping.add(key)  # the reconciler leaves the lease to this stop's own release
        starting = self._gpu_start_task
        if starting is not None and not starting.done() and starting is not asyncio.current_task():
            # Stopped while the start waits in line or starts: the hub shutting down stops every active server,
            # pending ones too, without cancelling their starts. The wait ends here; it takes no GPU later.
            starting.cancel()
        try:
            await super().stop(now=now)
        finally:
            try:
                if ran:
                    await asyncio.to_thread(self._end, self._gpu_stopping)
                elif policy is not None:
                    await asyncio.to_thread(self._release, self._gpu_stopping.ledger_reason)
            finally:
                self._gpu_stopping = None
                if policy is not None:
                    policy.stopping.discard(key)

    def _end(self, ending: Ending) -> None:
        """Record why this server ended (``GPUPolicy.end_server``: the ledger, and the student's stop box),
        unless the workbench service announced this stop itself ("reclaimed: ...", which then stands).

        A stop through the hub API may end the process before ``stop()``
        returns, so ``poll`` can be the first to see the end: both call this,
        and the first one's reason stands."""
        self.gpu_policy.end_server(
            self.user.name, self.name, self.with_larger_profile(ending), started=self._gpu_started_at
        )
        self.gpu_uuids = []
        self._gpu_running = False

    async def poll(self):
        # Read before polling: a backend's poll may clear_state() a dead server.
        held = bool(self.gpu_uuids) or self._gpu_running
        status = await super().poll()
        if status is None and self._lease_unchecked:
            status = await self._restore_lease()
            held = held and status is None  # a server it stopped has had its end told there
        # A backend's stop() may poll to see the server end: that stop releases, with its own reason.
        if status is not None and held and not self._gpu_starting and self._gpu_stopping is None:
            code = status if type(status) is int and status else None  # 0: JupyterHub's poll for "unknown"
            why = as_ending(await self.gpu_exit_reason(), endings.server_exited(code))
            await asyncio.to_thread(self._end, why)
        return status

    async def _restore_lease(self) -> int | None:
        """First poll after a restart: the ledger wins; a live server whose
        lease row is lost gets its saved GPUs back if nobody took them."""
        self._lease_unchecked = False
        saved = list(self.gpu_uuids)
        restored = await asyncio.to_thread(
            lambda: self.gpu_policy.restore(self.user.name, self.name, saved, self.gpu_lease_ref())
        )
        if restored is not None:
            self.gpu_uuids = list(restored)
            return None
        self.log.warning(
            "Stopping %s's server %s: its GPUs %s are leased to another server now",
            self.user.name,
            self.name or "(default)",
            ", ".join(saved),
        )
        ending = endings.gpus_leased_elsewhere(saved)
        self.gpu_uuids, self._gpu_stopping = [], ending  # the stop's own polls leave its end to this one
        try:
            await super().stop(now=True)
        finally:
            self._gpu_stopping = None
        await asyncio.to_thread(self._end, ending)
        return 1

    def _release(self, reason: str) -> None:
        self.gpu_policy.release(self.user.name, self.name, reason)
        self.gpu_uuids = []

    def gpu_start_words(self) -> str:
        """The newest words of this server's start (its spawn page's progress: an engine's queue in the engine's
        own words), "" before any: the hub's home page shows them for a server still starting."""
        return self._gpu_events.latest()

    async def progress(self):
        async for event in self._gpu_events.stream(lambda: self._gpu_starting):
            yield event
        async for event in super().progress():
            yield event

    # -- environment and state ------------------------------------------------------

    def get_env(self):
        env = super().get_env()
        env["WORKBENCH_GPUS"] = ",".join(self.gpu_uuids)
        if self.simulated_gpus and not self.static_gpus:
            env["WORKBENCH_SIMULATED_GPUS"] = spec_in_force(self.simulated_gpus)  # a @FILE's spec: docker has no file
            if self.simulated_utilization:  # scripted utilization (tests, demos): the monitor reads it too
                env["WORKBENCH_SIMULATED_UTILIZATION"] = self.simulated_utilization
        env["WORKBENCH_KERNEL_GRACE"] = f"{self.kernel_stop_grace:g}"
        if self.placement_mode == "host":  # an engine pins the job itself (Slurm's cgroup, the device plugin)
            env.update(self.gpu_environment(list(self.gpu_uuids)))
        env.update(self.ssh_environment())  # where the server's sshd lets forwards go (ssh_forwarding.py)
        return env

    def get_state(self):
        """What must survive a hub restart, beside the backend's own fields.

        ``gpu_uuids``: the GPUs this server was started with. The ledger row
        is the truth, but if it was lost (a restored or wiped GPU database)
        while the server kept running, the saved UUIDs let the first poll
        lease them to it again instead of handing them to someone else
        while the server still uses them.
        """
        state = super().get_state()
        if self.gpu_uuids:
            state["gpu_uuids"] = list(self.gpu_uuids)
        return state

    def load_state(self, state):
        super().load_state(state)
        # Checked against the ledger on the first poll, in a worker thread (load_state runs on the hub's loop).
        self.gpu_uuids = [str(u) for u in state.get("gpu_uuids") or []]
        self._lease_unchecked = True
        # It ran before a restart if JupyterHub kept its server row (KubeSpawner saves state even when stopped).
        orm = getattr(self, "orm_spawner", None)
        self._gpu_running = orm.server is not None if orm is not None else bool(state)
        started = getattr(orm, "started", None)
        if started is not None and self._gpu_started_at is None:
            self._gpu_started_at = started if started.tzinfo else started.replace(tzinfo=UTC)

    def clear_state(self):
        super().clear_state()
        self.gpu_uuids = []
        self._lease_unchecked = False
        self._gpu_running = False
