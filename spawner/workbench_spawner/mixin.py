"""Everything a spawner needs to know about GPUs, for any backend.

``GPUSpawnerMixin`` goes in front of a JupyterHub spawner class. It holds the
policy's traits and the spawner life cycle: admission (``admission.admit``)
checks the spawn options against the quota, placement puts the server on
GPUs (waiting in line on one host), the ledger records the lease, and every
way a server ends releases it: stop, failed or timed-out start, and a poll
that finds it dead. Every database call runs in a worker thread, so a busy
database never stalls the hub's event loop. A backend subclass adds only
what is specific to its runtime: ``gpu_environment`` (how to pin),
``gpu_lease_ref`` (how to find the server again) and ``gpu_lease_alive``
(whether it still runs).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

from jupyterhub.spawner import SpawnException, Spawner
from traitlets import Float, Integer, List, Unicode, default

from workbench_spawner.rules.admission import AdmissionContext, Refusal, admit
from workbench_spawner.form.render import render_options_form
from workbench_spawner.ledger.notices import NoticeBook, render_stop_notice
from workbench_spawner.form.options import SpawnRequest, options_from_form
from workbench_spawner.policy.gpu_policy import GPUPolicy, NoGPUAvailable, shared_policy
from workbench_spawner.form.progress import SpawnEvents
from workbench_spawner.rules.quota import QuotaBook
from workbench_spawner.policy.config import GPUPolicyConfig
from workbench_spawner.policy.settings import resolve_policy_settings
from workbench_spawner.policy.sizing import ServerSizing
from workbench_spawner.ledger.store import AllocationStore, Lease


class GPUSpawnerMixin(GPUPolicyConfig, ServerSizing, Spawner):
    """GPU policy for a JupyterHub spawner; put it first in the bases.

    It derives from Spawner only so that its traits are real, configurable
    traits; the backend class after it in the bases does the spawning. The
    policy's own settings (inventory, database, quota default, queue
    timeout...) are in ``GPUPolicyConfig``, so the hub can resolve them at
    start without making a spawner.
    """

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
        means no choice is offered. Only meaningful for container backends.
        """,
    ).tag(config=True)

    @default("start_timeout")
    def _default_start_timeout(self):
        # A spawn may wait in line for the whole queue timeout before its
        # server even starts; the hub must not give up on it first.
        return int(self.gpu_queue_timeout) + 120

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
        super().__init__(*args, **kwargs)
        self.gpu_request = SpawnRequest(gpus=0)
        self.gpu_uuids: list[str] = []
        self._gpu_events = SpawnEvents()
        self._gpu_starting = False
        self._lease_unchecked = False

    # -- the shared policy (blocking: call from a worker thread) ----------------

    @property
    def gpu_policy(self) -> GPUPolicy:
        settings = resolve_policy_settings(self)
        key = (json.dumps(settings.to_json(), sort_keys=True), settings.db_url)
        policy = shared_policy(key, lambda: GPUPolicy(settings, AllocationStore(settings.db_url),
                                                      recheck_interval=self.gpu_queue_recheck_interval))
        policy.reconcile(self.gpu_lease_alive, self.gpu_reconcile_orphans)
        return policy

    async def _policy(self) -> GPUPolicy:
        return await asyncio.to_thread(lambda: self.gpu_policy)

    @property
    def gpu_quota_book(self) -> QuotaBook:
        return self.gpu_policy.quotas

    def gpu_admission_context(self) -> AdmissionContext:
        """What admission checks for this server now (reads the database)."""
        groups = [g.name for g in getattr(self.user, "groups", None) or []]
        return self.gpu_policy.admission_context(
            self.user.name, self.name, groups, default_gpus=self.default_gpus,
            offered_images=tuple(self.offered_images), profiles=tuple(p.slug for p in self.gpu_profiles))

    def gpu_reserved_now(self) -> list[str]:
        """The spawn form's reservation lines for this user (reads the database)."""
        groups = [g.name for g in getattr(self.user, "groups", None) or []]
        return self.gpu_policy.reserved_now(groups)

    # -- what a backend provides ----------------------------------------------

    def gpu_environment(self, uuids: list[str]) -> dict[str, str]:
        """Extra environment that pins the server to ``uuids``."""
        return {}

    def gpu_lease_ref(self) -> str:
        """Something that finds this server again after a hub restart."""
        return ""

    def gpu_lease_alive(self, lease: Lease) -> bool | None:
        """Whether the server behind a stored lease still runs (None: unknown). Blocking."""
        return None

    def gpu_reconcile_orphans(self) -> None:
        """After a restart: deal with servers that run without a lease. Blocking."""

    def apply_gpu_request(self, request: SpawnRequest) -> None:
        """Hook for backends that act on more than the GPU count (the image)."""

    # -- options ----------------------------------------------------------------

    async def _render_options_form(self, spawner=None) -> str:
        # What the open reservations keep, in words ("8 of 16 GPUs reserved for ml-course until 12:00").
        reserved = await asyncio.to_thread(self.gpu_reserved_now)

        def snapshot():
            policy = self.gpu_policy
            inventory = policy.inventory  # a backend may read it from the database (Slurm's reported UUIDs)
            return (policy, inventory, self.gpu_admission_context(), policy.status(),
                    policy.held_by_user(self.user.name), NoticeBook(policy.store).last_done(self.user.name, self.name))

        policy, inventory, ctx, status, held, stopped = await asyncio.to_thread(snapshot)
        # Why the last server stopped (GPU idle, a reservation), above the form.
        return render_stop_notice(stopped) + render_options_form(
            user=self.user.name, ctx=ctx, status=status, source=inventory.source,
            message=inventory.message, shared=policy.shared, profiles=self.gpu_profiles,
            limits_enforced=self.enforces_resource_limits, held=held,
            reserved=reserved)

    async def _apply_gpu_options(self, user_options: dict) -> None:
        ctx = await asyncio.to_thread(self.gpu_admission_context)
        verdict = admit(user_options, ctx)
        if isinstance(verdict, Refusal):
            raise SpawnException(verdict.message, reason=verdict.reason, status_code=verdict.status)
        # The session limit in force now; the workbench service stops servers
        # that run longer. A later quota change does not touch this server.
        await asyncio.to_thread(lambda: self.gpu_quota_book.record_session_limit(
            self.user.name, self.name, verdict.max_session_hours))
        profile = self.size_server(verdict.request.profile)
        self.gpu_request = replace(verdict.request, profile=profile.slug if profile else None)
        self.apply_gpu_request(self.gpu_request)

    # -- lifecycle ----------------------------------------------------------------

    async def _acquire(self, request: SpawnRequest) -> Lease:
        policy = await self._policy()
        what = f"{request.gpus} {request.gpu_model + ' ' if request.gpu_model else ''}GPU(s)"

        def report(ahead: int, why: str = "") -> None:
            because = f" ({why})" if why else ""
            if ahead:
                self._gpu_events.add(f"Waiting for {what}: {ahead} ahead of you in line{because}", 5)
            else:
                self._gpu_events.add(f"Waiting for {what} to become free (you are next in line){because}", 5)

        # The hub's ORM may load the groups lazily: off the event loop, as admission does.
        groups = await asyncio.to_thread(lambda: tuple(sorted(g.name for g in getattr(self.user, "groups", None) or [])))
        try:
            lease = await policy.place(self.user.name, self.name, request.gpus, request.gpu_model,
                                       self.gpu_queue_timeout, report, groups=groups)
        except NoGPUAvailable as exc:
            raise SpawnException(str(exc), reason="no_gpu", status_code=503) from None
        self._gpu_events.add(f"Got {what}: {', '.join(lease.gpu_uuids)}", 10)
        return lease

    async def start(self):
        self._gpu_events.reset()
        self._gpu_starting = True
        try:
            # Starting again: the spawn page's "why your server stopped" has been read.
            await asyncio.to_thread(NoticeBook(self.gpu_policy.store).acknowledge, self.user.name, self.name)
            request = self.gpu_request
            self.gpu_uuids = list((await self._acquire(request)).gpu_uuids) if request.gpus else []
            if not request.gpus:
                self._gpu_events.add("Starting a CPU-only server (no GPU requested)", 10)
            try:
                result = await super().start()
            except BaseException:
                await asyncio.to_thread(self._release, "start failed")
                raise
            ref = self.gpu_lease_ref()
            if self.gpu_uuids and ref:
                await asyncio.to_thread(lambda: self.gpu_policy.store.set_ref(self.user.name, self.name, ref))
            return result
        finally:
            self._gpu_starting = False

    async def stop(self, now=False):
        try:
            await super().stop(now=now)
        finally:
            await asyncio.to_thread(self._release_on_stop)

    def _release_on_stop(self, otherwise: str = "stopped") -> None:
        """Release with the reason the workbench service announced for this stop ("reclaimed: ..."), if any.

        A stop through the hub API may end the process before ``stop()``
        returns, so ``poll`` can be the one that releases: both ask."""
        self.gpu_policy.release_on_stop(self.user.name, self.name, otherwise)
        self.gpu_uuids = []

    async def poll(self):
        # Read before polling: a backend's poll may clear_state() a dead server.
        held = bool(self.gpu_uuids)
        status = await super().poll()
        if status is None and self._lease_unchecked:
            status = await self._restore_lease()
        if status is not None and held and not self._gpu_starting:
            await asyncio.to_thread(self._release_on_stop, "server exited")
        return status

    async def _restore_lease(self) -> int | None:
        """First poll after a restart: the ledger wins; a live server whose
        lease row is lost gets its saved GPUs back if nobody took them."""
        self._lease_unchecked = False
        saved = list(self.gpu_uuids)
        restored = await asyncio.to_thread(lambda: self.gpu_policy.restore(
            self.user.name, self.name, saved, self.gpu_lease_ref()))
        if restored is not None:
            self.gpu_uuids = list(restored)
            return None
        self.log.warning("Stopping %s's server %s: its GPUs %s are leased to another server now",
                         self.user.name, self.name or "(default)", ", ".join(saved))
        self.gpu_uuids = []
        await super().stop(now=True)
        return 1

    def _release(self, reason: str) -> None:
        self.gpu_policy.release(self.user.name, self.name, reason)
        self.gpu_uuids = []

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
            env["WORKBENCH_SIMULATED_GPUS"] = self.simulated_gpus
            if self.simulated_utilization:  # scripted utilization (tests, demos): the monitor reads it too
                env["WORKBENCH_SIMULATED_UTILIZATION"] = self.simulated_utilization
        env.update(self.gpu_environment(list(self.gpu_uuids)))
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
        # Checked against the ledger on the first poll, in a worker thread:
        # load_state runs on the hub's event loop and must not query the database.
        self.gpu_uuids = [str(u) for u in state.get("gpu_uuids") or []]
        self._lease_unchecked = True

    def clear_state(self):
        super().clear_state()
        self.gpu_uuids = []
        self._lease_unchecked = False
