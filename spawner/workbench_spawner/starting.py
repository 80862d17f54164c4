"""How a start gets its GPUs, by placement mode: a base of ``GPUSpawnerMixin`` (``mixin.py``).

``GPUSpawnerMixin.start`` is the template (the line, the reconciler's
hands-off mark, the stop box read); it hands the rest to one of the two paths
here:

* ``_start_on_host`` (``host`` mode: local, docker): the policy acquires GPUs
  on this node (``_acquire``: the GPU database, the wait list when none is
  free), waits for a start slot on the host (``_start_slot``), then the
  backend's JupyterHub spawner starts the server pinned to them;
* ``_start_by_engine`` (``engine`` mode: Slurm, Kubernetes): the policy admits
  the request to the engine's queue, the backend submits, the engine
  placement follows the job until the engine has placed it, and the backend
  says where the server listens.

Both give everything back when the start fails, times out or is cancelled (a
cancel's clean-up runs in the background, ``_in_background``, because
JupyterHub gives a cancelled spawn one second). A cancel that lands as
``start()`` returns is lost by JupyterHub's own wait for it on Python 3.11;
``start_polling``, which JupyterHub calls next in the spawn's task, gives it
again (``lost_cancel.py``). Kept apart from the mixin's
traits, options and stop so that each file reads as one job; nothing here is
a backend's to override (``contract_problems`` refuses a backend that
overrides ``_acquire``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from workbench_spawner.contract import BackendContract, BackendContractError
from workbench_spawner.ledger import reasons
from workbench_spawner.ledger.lease_limits import LeaseLimits
from workbench_spawner.lost_cancel import give_lost_cancel_again
from workbench_spawner.placement.engine import EnginePlacement
from workbench_spawner.placement.start_line import Slot, SlotTimeoutError, StartLine
from workbench_spawner.policy.gpu_policy import GPUPolicy, NoGPUAvailableError
from workbench_spawner.refusals import refused
from workbench_spawner.rules.reservations import gpus_text

if TYPE_CHECKING:
    # JupyterHub's Spawner, whose state these paths read (``user``, ``name``, ``pending``...) and whose
    # ``start`` the host path calls; JupyterHub ships no type information, so it is Any to the checker.
    from jupyterhub.spawner import Spawner as _SpawnerState

    from workbench_spawner.form.options import SpawnRequest
    from workbench_spawner.form.progress import SpawnEvents
    from workbench_spawner.ledger.store import Lease
else:
    _SpawnerState = object


class ServerStarts(BackendContract, _SpawnerState):
    """The host and engine start paths of ``GPUSpawnerMixin.start``, on the spawner's own state."""

    if TYPE_CHECKING:  # GPUSpawnerMixin's (it derives from this class), which these paths read
        gpu_queue_timeout: float

        @property
        def gpu_policy(self) -> GPUPolicy: ...

        @property
        def server_label(self) -> str: ...

        async def _policy(self) -> GPUPolicy: ...

        def _release(self, reason: str) -> None: ...

    # The spawner's state these paths read and write (set in GPUSpawnerMixin.__init__).
    gpu_request: SpawnRequest
    gpu_uuids: list[str]
    _gpu_events: SpawnEvents
    _gpu_cleanups: set[asyncio.Future]
    if TYPE_CHECKING:  # an engine's start report (EngineSpawner's trait), forgotten before each submission
        workbench_report: dict | None
    # The user's quota as admission read it for this start (``_apply_gpu_options``): the lease is checked
    # against it again where it is written, so two spawns of one user at once cannot both pass.
    gpu_limits: LeaseLimits | None = None

    async def _lease_limits(self, policy: GPUPolicy, groups: tuple[str, ...]) -> LeaseLimits:
        """The limits admission read for this start; read now for a start that skipped admission (a test
        calling ``start`` itself), so no lease of a start is ever written unchecked."""
        if self.gpu_limits is not None:
            return self.gpu_limits

        def read() -> LeaseLimits:
            quota = policy.quotas.effective(self.user.name, list(groups), policy.settings.default_quota)
            return LeaseLimits.of(quota, policy.settings.quota_contact)

        return await asyncio.to_thread(read)

    async def _acquire(self, request: SpawnRequest) -> Lease:
        policy = await self._policy()
        what = gpus_text(request.gpus, request.kind)

        def report(ahead: int, why: str = "") -> None:
            because = f" ({why})" if why else ""
            if ahead:
                self._gpu_events.add(f"Waiting for {what}: {ahead} ahead of you in line{because}", 5)
            else:
                self._gpu_events.add(f"Waiting for {what} to become free (you are next in line){because}", 5)

        groups = await self._groups()
        try:
            lease = await policy.place(
                self.user.name,
                self.name,
                request.gpus,
                request.kind,
                self.gpu_queue_timeout,
                report,
                groups=groups,
                exclusive=request.exclusive,
                limits=await self._lease_limits(policy, groups),
            )
        except NoGPUAvailableError as exc:
            raise refused(str(exc), reason=exc.reason, status=exc.status) from None
        self._gpu_events.add(f"Got {what}: {', '.join(lease.gpu_uuids)}", 10)
        return lease

    async def _start_on_host(self, policy: GPUPolicy, in_line: object):
        request = self.gpu_request
        deadline = time.monotonic() + self.gpu_queue_timeout
        lease = await self._acquire(request) if request.gpus else None
        self.gpu_uuids = list(lease.gpu_uuids) if lease else []
        if not request.gpus:
            self._gpu_events.add("Starting a CPU-only server (no GPU requested)", 10)
        line = policy.start_line
        slot: Slot | None = None
        started = False
        try:
            slot = await self._start_slot(line, deadline)
            line.leave(in_line)  # starting now: no longer counted as waiting
            await self.prepare_server()
            result = await super().start()
            started = True
        except asyncio.CancelledError:
            # The user stopped a pending spawn: JupyterHub's DELETE gives the cancel one second before it calls
            # the spawn stuck (a 500), so the GPUs go back in the background; the hub's stop() that follows
            # ends whatever of the server had started.
            if lease is not None:
                self._in_background(
                    lambda: self.gpu_policy.release(lease.user, lease.server, reasons.START_CANCELLED, lease.since)
                )
            self.gpu_uuids = []
            raise
        except BaseException:
            await asyncio.to_thread(self._release, reasons.START_FAILED)
            raise
        finally:
            if slot is not None:
                if started and self.pending == "spawn":
                    # Held until the hub has seen the server answer and routed it (its spawn no longer pending).
                    line.hold_until(slot, lambda: self.pending != "spawn", float(self.http_timeout) + 60)
                else:  # failed, cancelled, or started outside a hub request (tests): the next may start
                    line.release(slot)
        ref = self.gpu_lease_ref()
        if self.gpu_uuids and ref:
            await asyncio.to_thread(lambda: self.gpu_policy.store.set_ref(self.user.name, self.name, ref))
        return result

    async def _start_slot(self, line: StartLine, deadline: float) -> Slot:
        """A slot among the servers this host starts at once (start_line.py); the user is told how many start
        ahead. The wait shares the spawn's queue deadline, or lasts ``http_timeout`` after the GPUs came."""

        def report(ahead: int) -> None:
            servers = "server" if ahead == 1 else "servers"
            self._gpu_events.add(f"Waiting to start: the host is starting {ahead} {servers} ahead of yours", 15)

        try:
            return await line.start_slot(max(deadline, time.monotonic() + self.http_timeout), report)
        except SlotTimeoutError as exc:
            raise refused(
                f"The host is still busy starting other servers ({exc}). Please try again in a few minutes.",
                reason="start_line",
                status=503,
            ) from None

    async def _start_by_engine(self, policy: GPUPolicy):
        placement = policy.placement
        if not isinstance(placement, EnginePlacement):
            raise BackendContractError(
                f"{type(self).__name__}.engine_placement() gave {type(placement).__name__}, not an EnginePlacement"
            )
        request = self.gpu_request
        key = f"{self.user.name}/{self.name}"
        deadline = placement.clock() + self.gpu_queue_timeout
        groups = await self._groups()
        try:
            # JupyterHub starts a server it believes stopped: a job or lease of it left over is stale.
            await self.engine_cancel()
            if await asyncio.to_thread(policy.store.lease_of, self.user.name, self.name) is not None:
                await asyncio.to_thread(self._release, reasons.REPLACED)
            try:
                if not request.gpu_profile:  # reservations hold whole GPUs: a request for slices waits for none
                    await placement.admit_to_queue(
                        key,
                        request.gpus,
                        request.gpu_model,
                        groups,
                        deadline,
                        describe=lambda text: self._gpu_events.add(text, 3),
                    )
                job = None
                try:
                    self.workbench_report = None  # a report of an earlier job is not this one's
                    job = await self.engine_submit()
                finally:
                    if job is None:
                        placement.withdraw(key)
                lease = await placement.place(
                    self.user.name,
                    self.name,
                    request.gpus,
                    request.gpu_model,
                    self.gpu_queue_timeout,
                    groups=groups,
                    job=replace(
                        job, deadline=deadline, admitted=key, describe=lambda text: self._gpu_events.add(text, 20)
                    ),
                    limits=await self._lease_limits(policy, groups),
                )
            except NoGPUAvailableError as exc:
                self.clear_state()
                raise refused(str(exc), reason=exc.reason, status=exc.status) from None
            self.gpu_uuids = list(lease.gpu_uuids) if lease else []
            if lease:
                self._gpu_events.add(
                    f"The engine placed the server on {lease.node or 'its node'}: {', '.join(lease.gpu_uuids)}", 80
                )
            return await self.engine_connect(lease)
        except asyncio.CancelledError:
            # The user stopped a pending spawn: cancel the job and give the GPUs back in the background, so the
            # cancel ends within the second JupyterHub's DELETE gives it (see _start_on_host).
            self._in_background(self._cancel_engine_start)
            raise
        except BaseException:
            # Refused, timed out, or abandoned by the hub (start_timeout): nothing stays.
            await self.engine_cancel()
            await asyncio.to_thread(self._release, reasons.START_FAILED)
            raise

    async def _cancel_engine_start(self) -> None:
        # Which lease the cancelled start holds, read at once (a new start needs the DELETE to end first, a
        # second later): only that lease is ended, never one of a new start of the same server.
        store = self.gpu_policy.store
        lease = await asyncio.to_thread(store.lease_of, self.user.name, self.name)
        await self.engine_cancel()
        if lease is not None:
            await asyncio.to_thread(
                self.gpu_policy.release, lease.user, lease.server, reasons.START_CANCELLED, lease.since
            )

    def start_polling(self) -> None:
        """JupyterHub's poll of a started server begins; called by ``User.spawn`` in the spawn's own task right
        after ``start()`` returned: a cancel its wait for ``start()`` let through is given again there."""
        super().start_polling()
        give_lost_cancel_again(self.server_label, self.log)

    def _in_background(self, work) -> None:
        """Run a clean-up after the current task is cancelled: ``work`` is a coroutine function, or a blocking
        function run in a worker thread. Failures are logged; the loop keeps a reference until it ends."""
        loop = asyncio.get_running_loop()
        if asyncio.iscoroutinefunction(work):
            future: asyncio.Future = asyncio.ensure_future(work())
        else:
            future = loop.run_in_executor(None, work)

        def done(f: asyncio.Future) -> None:
            self._gpu_cleanups.discard(f)
            if not f.cancelled() and f.exception() is not None:
                self.log.error("Cleaning up the cancelled start of %s failed: %s", self.server_label, f.exception())

        self._gpu_cleanups.add(future)
        future.add_done_callback(done)

    async def _groups(self) -> tuple[str, ...]:
        # The hub's ORM may load the groups lazily: off the event loop, as admission does.
        return await asyncio.to_thread(lambda: tuple(sorted(g.name for g in getattr(self.user, "groups", None) or [])))
