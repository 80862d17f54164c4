"""Everything a spawner needs to know about GPUs, for any backend.

``GPUSpawnerMixin`` goes in front of a JupyterHub spawner class. It reads and
checks the spawn options, waits in line for free GPUs, records the lease in
the allocation store, puts ``WORKBENCH_GPUS`` in the server's environment and
releases the GPUs on every way a server can end: stop, failed or timed-out
start, and a poll that finds it dead. A backend subclass adds only what is
specific to its runtime: ``gpu_environment`` (how to pin), ``gpu_lease_ref``
(how to find the server again) and ``gpu_lease_alive`` (whether it still runs).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape
from jupyterhub.spawner import SpawnException, Spawner
from traitlets import Bool, Dict, Float, Integer, List, TraitError, Unicode, default, observe, validate

from workbench_gpu_monitor.devices import DeviceInventory, DeviceSpecError, GPUDevice, discover_devices

from .options import OptionError, SpawnRequest, options_from_form, parse_options
from .policy import GPUPolicy, NoGPUAvailable, shared_policy
from .profiles import ProfileError, ResourceProfile, default_profile, parse_profiles
from .quota import EffectiveQuota, Quota, QuotaBook, gpu_hours_used
from .store import AllocationStore, Lease

_TEMPLATES = Path(__file__).parent / "templates"
_jinja = Environment(loader=FileSystemLoader(str(_TEMPLATES)), autoescape=select_autoescape(["html"]))


def default_data_dir() -> str:
    return os.environ.get("WORKBENCH_DATA_DIR") or os.path.join(os.getcwd(), "data")


class GPUSpawnerMixin(Spawner):
    """GPU policy for a JupyterHub spawner; put it first in the bases.

    It derives from Spawner only so that its traits are real, configurable
    traits; the backend class after it in the bases does the spawning.
    """

    simulated_gpus = Unicode(
        help="""
        Pretend these GPUs exist instead of asking NVML, for CI, demos and laptops.

        A count (``"4"``: four H100-80GB) or a list such as
        ``"2xH100-80GB,2xA100-40GB"``. The simulated devices have stable UUIDs
        (``GPU-sim-00-h100-80gb``), and every page that shows them says
        "simulated". Empty (the default) means: use NVML, or run CPU-only
        servers when no driver is found. Defaults to $WORKBENCH_SIMULATED_GPUS.
        """,
    ).tag(config=True)

    @default("simulated_gpus")
    def _default_simulated_gpus(self):
        return os.environ.get("WORKBENCH_SIMULATED_GPUS", "")

    static_gpus = List(
        Dict(),
        help="""
        A fixed GPU list for hubs that cannot see the driver (the hub runs on a
        different machine or in a container without NVIDIA utilities).

        Each entry needs ``uuid`` and ``name``; ``memory_total_bytes``,
        ``model`` and ``index`` are optional. Example::

            c.LocalGPUSpawner.static_gpus = [
                {"uuid": "GPU-5f3c...", "name": "NVIDIA A100-SXM4-40GB", "model": "A100-40GB"},
            ]

        When set, it wins over NVML and ``simulated_gpus``.
        """,
    ).tag(config=True)

    gpu_db_url = Unicode(
        help="""
        SQLAlchemy URL of the database that holds GPU leases and the usage ledger.

        It must survive hub restarts: that is how running servers keep their
        GPUs. Defaults to $WORKBENCH_DB_URL, else a SQLite file ``workbench.sqlite``
        in $WORKBENCH_DATA_DIR (``./data``). Use PostgreSQL
        (``postgresql+psycopg://...``) when several processes share it.
        """,
    ).tag(config=True)

    @default("gpu_db_url")
    def _default_gpu_db_url(self):
        if os.environ.get("WORKBENCH_DB_URL"):
            return os.environ["WORKBENCH_DB_URL"]
        data_dir = default_data_dir()
        os.makedirs(data_dir, exist_ok=True)
        return "sqlite:///" + os.path.join(os.path.abspath(data_dir), "workbench.sqlite")

    servers_per_gpu = Integer(
        1,
        min=1,
        help="""
        How many servers may share one GPU. 1 (the default) is exclusive mode:
        a GPU belongs to at most one running server. Larger values time-slice a
        GPU between several servers, which suits intro courses with small
        models; the spawn form then marks GPUs as shared.
        """,
    ).tag(config=True)

    gpu_queue_timeout = Float(
        300.0,
        min=0,
        help="""
        Seconds a spawn waits in line for free GPUs before it is refused with
        a message. Spawns wait first come, first served, and the spawn page
        shows how many are ahead. 0 refuses at once when nothing is free.
        """,
    ).tag(config=True)

    gpu_queue_recheck_interval = Float(
        2.0,
        min=0.05,
        help="""
        Seconds between re-checks of the database while waiting in line. A
        release in this hub wakes the line at once; the re-check catches
        releases made elsewhere (an admin editing the database, another hub).
        """,
    ).tag(config=True)

    default_max_gpus = Integer(
        1,
        min=0,
        help="""
        How many GPUs one user may hold at once, over all their servers, when
        no quota says otherwise. Set it to the inventory size on a trusted
        single-team machine, or 0 to make servers CPU-only by default.
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

    resource_profiles = List(
        Dict(),
        help="""
        Named CPU and memory sizes offered on the spawn form (``profile``
        option), e.g. ``[{"slug": "small", "cpu_limit": 2, "mem_limit": "8G"},
        {"slug": "large", "cpu_limit": 16, "mem_limit": "64G", "default": True}]``.
        Keys: ``slug`` (what the API takes), ``display_name``, ``description``,
        ``cpu_limit`` (cores), ``mem_limit`` (bytes or K/M/G/T), ``default``. A
        limit a profile leaves out stays at the spawner's ``cpu_limit`` /
        ``mem_limit``. The docker backend enforces the limits; the local
        backend only passes them on as ``CPU_LIMIT``/``MEM_LIMIT``. Empty: no
        choice, every server gets the spawner's limits.
        """,
    ).tag(config=True)

    @validate("resource_profiles")
    def _check_resource_profiles(self, proposal):
        try:
            parse_profiles(proposal["value"])
        except ProfileError as exc:
            raise TraitError(str(exc)) from exc
        return proposal["value"]

    # Parsed once when configured, not on every form and spawn.
    _parsed_profiles: list[ResourceProfile] = []

    @observe("resource_profiles")
    def _parse_resource_profiles(self, change):
        self._parsed_profiles = parse_profiles(change["new"])

    # Whether the runtime holds a server to its cpu_limit/mem_limit (containers
    # do; a local process only sees them as CPU_LIMIT/MEM_LIMIT). The form says so.
    enforces_resource_limits = False

    @property
    def gpu_profiles(self) -> list[ResourceProfile]:
        return self._parsed_profiles

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
        # What the configuration says, so that a profile picked for one start
        # does not stick to the next start without one.
        self._configured_limits = (self.cpu_limit, self.mem_limit)
        self.gpu_request = SpawnRequest(gpus=0)
        self.gpu_uuids: list[str] = []
        self._gpu_events: list[dict] = []
        self._gpu_event_added = asyncio.Event()
        self._gpu_starting = False

    # -- the shared policy ----------------------------------------------------

    @property
    def gpu_policy(self) -> GPUPolicy:
        key = (self.gpu_db_url, self.simulated_gpus, repr(self.static_gpus), self.servers_per_gpu)
        policy = shared_policy(key, self._build_policy)
        policy.waitlist.recheck_interval = self.gpu_queue_recheck_interval
        policy.reconcile(self.gpu_lease_alive, self.gpu_reconcile_orphans)
        return policy

    def _build_policy(self) -> GPUPolicy:
        inventory = self._discover_inventory()
        self.log.info("GPU inventory (%s): %s", inventory.source, inventory.message)
        for device in inventory.devices:
            self.log.info("  %s  %s  %.0f GiB", device.uuid, device.name, device.memory_total_bytes / 2**30)
        return GPUPolicy(inventory, AllocationStore(self.gpu_db_url), self.servers_per_gpu,
                         self.gpu_queue_recheck_interval)

    def _discover_inventory(self) -> DeviceInventory:
        if self.static_gpus:
            devices = []
            for i, entry in enumerate(self.static_gpus):
                if "uuid" not in entry or "name" not in entry:
                    raise ValueError(f"static_gpus entry {i} needs 'uuid' and 'name': {entry!r}")
                devices.append(
                    GPUDevice(
                        uuid=str(entry["uuid"]),
                        index=int(entry.get("index", i)),
                        name=str(entry["name"]),
                        memory_total_bytes=int(entry.get("memory_total_bytes", 0)),
                        model=str(entry.get("model", "")),
                    )
                )
            return DeviceInventory("static", devices, f"{len(devices)} GPU(s) from the static_gpus setting")
        try:
            return discover_devices(self.simulated_gpus)
        except DeviceSpecError as exc:
            raise ValueError(str(exc)) from None

    # -- what a backend provides ----------------------------------------------

    def gpu_environment(self, uuids: list[str]) -> dict[str, str]:
        """Extra environment that pins the server to ``uuids``."""
        return {}

    def gpu_lease_ref(self) -> str:
        """Something that finds this server again after a hub restart."""
        return ""

    def gpu_lease_alive(self, lease: Lease) -> bool | None:
        """Whether the server behind a stored lease still runs (None: unknown)."""
        return None

    def gpu_reconcile_orphans(self) -> None:
        """After a restart: deal with servers that run without a lease."""

    # -- quota ------------------------------------------------------------------

    cpu_servers_allowed = Bool(
        True,
        help="""
        Whether users may start CPU-only servers (``gpus=0``). True (the
        default) keeps them allowed even when a GPU quota is 0 or a GPU-hours
        budget is spent, so students can still edit notebooks. Set it to False
        on a hub that exists only to hand out GPUs. Defaults from
        $WORKBENCH_CPU_SERVERS in the shipped config.
        """,
    ).tag(config=True)

    quota_contact = Unicode(
        "a hub admin",
        help="""
        Who a student should ask for more GPUs; named in every quota refusal,
        e.g. ``"your course staff (gpu-help@example.edu)"``.
        """,
    ).tag(config=True)

    @property
    def gpu_quota_book(self) -> QuotaBook:
        """The quota tables, in the allocation store's database (one per policy)."""
        return self.gpu_policy.quotas

    def gpu_default_quota(self) -> Quota:
        return Quota(max_gpus=self.default_max_gpus)

    def gpu_effective_quota(self) -> EffectiveQuota:
        """The user's quota by the rule in ``workbench_spawner.quota``: own, best group, default."""
        groups = [g.name for g in getattr(self.user, "groups", None) or []]
        return self.gpu_quota_book.effective(self.user.name, groups, self.gpu_default_quota())

    def gpu_quota(self) -> tuple[int, str]:
        """(most GPUs this user may hold at once, where that limit comes from)."""
        effective = self.gpu_effective_quota()
        return effective.quota.max_gpus, effective.describe

    def gpu_hours_used(self) -> float:
        return gpu_hours_used(self.gpu_policy.store, self.user.name)

    def gpu_limit_now(self) -> tuple[int, int, str]:
        """(GPUs this server may ask for now, the quota, where it comes from).

        0 when the GPU-hours budget of the week is spent."""
        effective = self.gpu_effective_quota()
        quota, source = effective.quota.max_gpus, effective.describe
        held_elsewhere = sum(
            len(lease.gpu_uuids)
            for lease in self.gpu_policy.store.leases()
            if lease.user == self.user.name and lease.server != self.name
        )
        budget = effective.quota.gpu_hours_per_week
        if budget is not None and self.gpu_hours_used() >= budget:
            return 0, quota, source
        return max(0, min(quota - held_elsewhere, len(self.gpu_policy.devices))), quota, source

    # -- options ----------------------------------------------------------------

    async def _render_options_form(self, spawner=None) -> str:
        policy = self.gpu_policy
        allowed, quota, source = self.gpu_limit_now()
        effective = self.gpu_effective_quota()
        status = await asyncio.to_thread(policy.status)
        held = policy.held_by_user(self.user.name)
        models = [m for m in policy.models() if effective.quota.allows_model(m)]
        return _jinja.get_template("options_form.html").render(
            gpus=status,
            source=policy.inventory.source,
            message=policy.inventory.message,
            allowed=allowed,
            quota=quota,
            quota_source=source,
            default=min(self.default_gpus, allowed),
            free=sum(1 for s in status if s.free_slots > 0),
            shared=policy.shared,
            models=models,
            images=self.offered_images,
            profiles=self.gpu_profiles,
            default_profile=default_profile(self.gpu_profiles),
            limits_enforced=self.enforces_resource_limits,
            user=self.user.name,
            held=held,
            hours_used=self.gpu_hours_used(),
            hours_budget=effective.quota.gpu_hours_per_week,
            allowed_models=effective.quota.allowed_models,
            max_session_hours=effective.quota.max_session_hours,
            cpu_allowed=self.cpu_servers_allowed,
            contact=self.quota_contact,
        )

    def _refuse(self, message: str, reason: str, status_code: int = 400):
        raise SpawnException(message, reason=reason, status_code=status_code)

    def _apply_gpu_options(self, user_options: dict) -> None:
        policy = self.gpu_policy
        allowed, quota, source = self.gpu_limit_now()
        effective = self.gpu_effective_quota()
        ask = f"ask {self.quota_contact} to raise your GPU quota"
        try:
            request = parse_options(
                user_options,
                inventory_size=len(policy.devices),
                models=policy.models(),
                default_gpus=min(self.default_gpus, allowed),
                allowed_images=self.offered_images,
                profiles=[p.slug for p in self.gpu_profiles],
            )
        except OptionError as exc:
            self._refuse(f"Cannot start the server: {exc}.", "bad_options")
        if request.gpus == 0 and not self.cpu_servers_allowed:
            self._refuse(
                "Cannot start the server: CPU-only servers are switched off on this hub; ask for at least one GPU.",
                "quota",
                status_code=403,
            )
        budget = effective.quota.gpu_hours_per_week
        if request.gpus and budget is not None:
            used = self.gpu_hours_used()
            if used >= budget:
                self._refuse(
                    f"Cannot start the server: {source} allows {budget:g} GPU-hours per week and you "
                    f"used {used:.1f} in the last 7 days. Start a CPU-only server (0 GPUs), wait until "
                    f"older use leaves the 7-day window, or {ask}.",
                    "quota",
                    status_code=403,
                )
        if request.gpus > allowed:
            held = quota - allowed if quota > allowed else 0
            self._refuse(
                f"Cannot start the server: you asked for {request.gpus} GPU(s), but {source} allows "
                f"{quota} at once{f' and your other servers hold {held}' if held else ''}. "
                f"Ask for fewer, or {ask}.",
                "quota",
                status_code=403,
            )
        models = effective.quota.allowed_models
        if request.gpus and models is not None:
            if request.gpu_model is not None and not effective.quota.allows_model(request.gpu_model):
                self._refuse(
                    f"Cannot start the server: {source} allows only these GPU models: "
                    f"{', '.join(models) or 'none'}, not {request.gpu_model}. Pick one of those, or {ask}.",
                    "quota",
                    status_code=403,
                )
            if request.gpu_model is None:
                # Only allowed models may be handed out: pick the allowed model
                # with the most free GPUs now (the policy allocates by model).
                offered = [m for m in policy.models() if effective.quota.allows_model(m)]
                if not offered:
                    self._refuse(
                        f"Cannot start the server: {source} allows only GPU models this hub does not have "
                        f"({', '.join(models) or 'none'}). Start a CPU-only server (0 GPUs), or {ask}.",
                        "quota",
                        status_code=403,
                    )
                if len(offered) < len(policy.models()):
                    best = max(offered, key=lambda m: (policy.free_count(m), -offered.index(m)))
                    request = replace(request, gpu_model=best)
        # The session limit in force now; the workbench service stops servers
        # that run longer. A later quota change does not touch this server.
        self.gpu_quota_book.record_session_limit(self.user.name, self.name, effective.quota.max_session_hours)
        profile = self._apply_profile(request.profile)
        self.gpu_request = replace(request, profile=profile.slug if profile else None)
        self.apply_gpu_request(self.gpu_request)

    def _apply_profile(self, slug: str | None) -> ResourceProfile | None:
        """Size this start by the chosen profile (or the default one); None when none are offered."""
        cpu_limit, mem_limit = self._configured_limits
        profiles = self.gpu_profiles
        profile = next((p for p in profiles if p.slug == slug), None) or default_profile(profiles)
        if profile is not None:
            cpu_limit = profile.cpu_limit if profile.cpu_limit is not None else cpu_limit
            mem_limit = profile.mem_limit if profile.mem_limit is not None else mem_limit
            self.log.info("Server %s of %s: resource profile %s (%s)", self.name or "(default)",
                          self.user.name, profile.slug, profile.summary())
        self.cpu_limit = cpu_limit
        self.mem_limit = mem_limit
        return profile

    def apply_gpu_request(self, request: SpawnRequest) -> None:
        """Hook for backends that act on more than the GPU count (the image)."""

    # -- lifecycle ----------------------------------------------------------------

    def _event(self, message: str, progress: int | None = None) -> None:
        event: dict = {"message": message}
        if progress is not None:
            event["progress"] = progress
        self._gpu_events.append(event)
        self._gpu_event_added.set()

    async def _acquire(self, request: SpawnRequest) -> Lease:
        policy = self.gpu_policy
        what = f"{request.gpus} {request.gpu_model + ' ' if request.gpu_model else ''}GPU(s)"

        def report(ahead: int) -> None:
            if ahead:
                self._event(f"Waiting for {what}: {ahead} ahead of you in line", 5)
            else:
                self._event(f"Waiting for {what} to become free (you are next in line)", 5)

        try:
            lease = await policy.acquire(
                self.user.name, self.name, request.gpus, request.gpu_model, self.gpu_queue_timeout, report
            )
        except NoGPUAvailable as exc:
            self._refuse(str(exc), "no_gpu", status_code=503)
        self._event(f"Got {what}: {', '.join(lease.gpu_uuids)}", 10)
        return lease

    async def start(self):
        self._gpu_events = []
        self._gpu_starting = True
        try:
            request = self.gpu_request
            self.gpu_uuids = list((await self._acquire(request)).gpu_uuids) if request.gpus else []
            if not request.gpus:
                self._event("Starting a CPU-only server (no GPU requested)", 10)
            try:
                result = await super().start()
            except BaseException:
                await asyncio.to_thread(self._release, "start failed")
                raise
            ref = self.gpu_lease_ref()
            if self.gpu_uuids and ref:
                await asyncio.to_thread(self.gpu_policy.store.set_ref, self.user.name, self.name, ref)
            return result
        finally:
            self._gpu_starting = False

    async def stop(self, now=False):
        try:
            await super().stop(now=now)
        finally:
            await asyncio.to_thread(self._release, "stopped")

    async def poll(self):
        # Read before polling: a backend's poll may clear_state() a dead server.
        held = bool(self.gpu_uuids)
        status = await super().poll()
        if status is not None and held and not self._gpu_starting:
            await asyncio.to_thread(self._release, "server exited")
        return status

    def _release(self, reason: str) -> None:
        self.gpu_policy.release(self.user.name, self.name, reason)
        self.gpu_uuids = []

    async def progress(self):
        seen = 0
        while True:
            while seen < len(self._gpu_events):
                yield self._gpu_events[seen]
                seen += 1
            if not self._gpu_starting and seen:
                break
            self._gpu_event_added.clear()
            try:
                await asyncio.wait_for(self._gpu_event_added.wait(), 1.0)
            except asyncio.TimeoutError:
                pass
        async for event in super().progress():
            yield event

    # -- environment and state ------------------------------------------------------

    def get_env(self):
        env = super().get_env()
        env["WORKBENCH_GPUS"] = ",".join(self.gpu_uuids)
        if self.gpu_policy.inventory.source == "simulated":
            env["WORKBENCH_SIMULATED_GPUS"] = self.simulated_gpus
        env.update(self.gpu_environment(list(self.gpu_uuids)))
        return env

    def get_state(self):
        state = super().get_state()
        if self.gpu_uuids:
            state["gpu_uuids"] = list(self.gpu_uuids)
        return state

    def load_state(self, state):
        super().load_state(state)
        lease = self.gpu_policy.store.lease_of(self.user.name, self.name)
        # The store wins over the saved state: it is what other spawns see.
        self.gpu_uuids = list(lease.gpu_uuids) if lease else []

    def clear_state(self):
        super().clear_state()
        self.gpu_uuids = []
