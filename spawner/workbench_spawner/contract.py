"""The backend contract's members, and the check that a spawner class keeps them.

``BackendContract`` declares what a backend implements, one member at a
time, each marked with the placement modes it belongs to
(``@contract_member``): every backend finds its server again after a hub
restart (``gpu_lease_ref``, ``gpu_lease_alive``) and deals with servers that
run without a lease (``gpu_reconcile_orphans``); a host-placed backend pins a
server to the GPUs the policy leased (``gpu_environment``); an engine-placed
backend reads the engine's inventory, builds the placement that follows the
engine's queue, submits, connects and cancels (``engine_*``). The optional
hooks after them have a meaning when not overridden. ``GPUSpawnerMixin``
(``mixin.py``) derives from it and drives the members from its life cycle.

:func:`contract_problems` names what a class misses; the hub refuses to
start with such a class (``policy.settings.spawner_gpu_class``), and so does
the first spawner made of it, rather than fail silently at the first spawn.
docs/backends.md describes each member for a backend's author.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from workbench_devices import DeviceInventory
from workbench_spawner.form.options import SpawnRequest
from workbench_spawner.ledger.endings import Ending
from workbench_spawner.ledger.store import AllocationStore, Lease
from workbench_spawner.placement.engine import EngineJob, EnginePlacement
from workbench_spawner.policy.settings import PolicySettings

Mode = Literal["host", "engine"]


def contract_member(*modes: Mode) -> Callable[[Callable], Callable]:
    """Mark a declaration of the mixin as a member that backends of ``modes`` must implement."""

    def mark(function: Callable) -> Callable:
        # A plain function object: the mark is an attribute of its own (read back in ``contract_members``).
        target: Any = function.__func__ if isinstance(function, classmethod) else function
        target.__contract_modes__ = modes
        return function

    return mark


class BackendContractError(TypeError):
    """A spawner class that does not keep the backend contract; str(err) names what it misses."""


class BackendContract:
    """What a backend implements (the marked members) and may override (the hooks after them)."""

    @contract_member("host", "engine")
    def gpu_lease_ref(self) -> str:
        """Something that finds this server again after a hub restart ("pid:42", "container:ab12", "slurm:7").

        Stored in the lease; ``gpu_lease_alive`` gets it back. Empty while
        the server has not started far enough to be found."""
        raise BackendContractError(f"{type(self).__name__} does not implement gpu_lease_ref()")

    @contract_member("host", "engine")
    def gpu_lease_alive(self, lease: Lease) -> bool | None:
        """Whether the server behind a stored lease still runs: True keep, False release, None unknown.

        Called by the reconciler for every lease, at hub start and on every
        pass while the hub runs (blocking: its worker thread; docs/architecture.md,
        "The reconciler"). None keeps the lease, and a poll or a later pass settles it."""
        raise BackendContractError(f"{type(self).__name__} does not implement gpu_lease_alive()")

    @contract_member("host", "engine")
    def gpu_reconcile_orphans(self) -> None:
        """Adopt or end the backend's servers that run without a lease (blocking), on every reconciler pass.

        Adopt (``store.adopt``) when none of the server's GPUs is leased to
        another server, end it otherwise; each backend documents its rule. It
        runs while spawns are in flight: act only where ``gpu_policy.orphan_now``
        says so, and count each fix (``gpu_policy.record_fix``)."""
        raise BackendContractError(f"{type(self).__name__} does not implement gpu_reconcile_orphans()")

    @contract_member("host")
    def gpu_environment(self, uuids: list[str]) -> dict[str, str]:
        """Host placement: the environment that pins the server to ``uuids`` (may be empty for CPU-only).

        Merged into ``get_env()``; a backend that pins by other means (the
        docker backend's device request) still returns what the runtime needs."""
        raise BackendContractError(f"{type(self).__name__} does not implement gpu_environment()")

    @contract_member("engine")
    def engine_inventory(self) -> DeviceInventory:
        """Engine placement: the cluster's GPUs as the engine knows them (blocking; read at hub start).

        Called on a spawner or on a bare config object with the policy's
        traits (the hub publishes the settings before any spawner exists)."""
        raise BackendContractError(f"{type(self).__name__} does not implement engine_inventory()")

    @contract_member("engine")
    def engine_placement(self, settings: PolicySettings, store: AllocationStore) -> EnginePlacement:
        """Engine placement: the placement that follows the engine's queue and writes the lease.

        Built once per hub process (``gpu_policy``); it admits to the
        engine's queue, follows a submitted job and learns node and GPUs.
        A new engine subclasses ``placement.engine_template.EngineTemplate``
        and writes only its hooks (one look at its queue, cancel, how a
        report maps to UUIDs, its words); its policy is
        ``placement.engine_policy.EnginePolicy``."""
        raise BackendContractError(f"{type(self).__name__} does not implement engine_placement()")

    @contract_member("engine")
    async def engine_submit(self) -> EngineJob:
        """Engine placement: submit this server (``self.gpu_request``) to the engine; the job to follow.

        Called once the policy admitted the request. Raise ``SpawnException``
        with the engine's words when the engine refuses (nothing was submitted)."""
        raise BackendContractError(f"{type(self).__name__} does not implement engine_submit()")

    @contract_member("engine")
    async def engine_connect(self, lease: Lease | None) -> tuple[str, int]:
        """Engine placement: the job runs and its lease is written (None: CPU-only); where the server listens."""
        raise BackendContractError(f"{type(self).__name__} does not implement engine_connect()")

    @contract_member("engine")
    async def engine_cancel(self) -> None:
        """Engine placement: end whatever this server has in the engine (by id, or found by tag); never raises.

        Called before a new submission (JupyterHub starts a server it believes
        stopped: anything left of it is stale) and after a failed start."""
        raise BackendContractError(f"{type(self).__name__} does not implement engine_cancel()")

    # -- optional hooks (each has a meaning when not overridden) ----------------------------

    async def check_options(self, options: dict) -> dict:
        """Backend options beyond the policy's (Slurm: ``partition``): check them, return the rest.

        Runs before admission; raise ``SpawnException`` to refuse. By default
        every option goes on to admission, which refuses what it does not know."""
        return options

    def apply_gpu_request(self, request: SpawnRequest) -> None:
        """After admission: act on the request beyond the GPUs (the docker backend: the image)."""

    async def gpu_exit_reason(self) -> Ending | None:
        """Why the server ended on its own, as an ``Ending`` (``ledger.endings``): the ledger's reason and
        the sentence its student reads, from the engine's facts (``endings.out_of_memory(limit)``,
        ``node_failed(node, why)``, ``pod_deleted()``, ``server_exited(code, log)``...). None: the
        server exited (with the exit code the poll returned; a 0 is JupyterHub's "unknown", told as none).

        Called by ``poll`` right after the backend's own poll found the server
        gone, before its lease is released; a backend remembers what its poll
        saw (Docker's ``State``, Slurm's job state, the pod's status)."""
        return None

    def gpu_lease_gone_reason(self, lease: Lease) -> Ending | None:
        """Why the server behind ``lease`` is gone, when ``gpu_lease_alive`` said False (blocking: the
        reconciler's thread), as an ``Ending``; None: ``endings.server_gone()``."""
        return None

    async def prepare_server(self) -> None:
        """Host placement: the GPUs are leased and the server is about to start (local: copy starter notebooks).

        A failure here releases the lease, as a failed start does."""


def contract_members(mode: str) -> list[str]:
    """The names of the members a backend of ``mode`` implements, in declaration order."""
    names = []
    for name, value in vars(BackendContract).items():
        target = value.__func__ if isinstance(value, classmethod) else value
        if mode in getattr(target, "__contract_modes__", ()):
            names.append(name)
    return names


def contract_problems(cls: type) -> list[str]:
    """Sentences naming what ``cls`` misses of the backend contract (empty: it keeps it)."""
    from workbench_spawner.mixin import GPUSpawnerMixin  # the template that declares the life cycle

    if not issubclass(cls, GPUSpawnerMixin):
        return [f"{cls.__name__} is not a GPU Workbench spawner: it does not derive from GPUSpawnerMixin"]
    problems = []
    if cls.placement_mode not in ("host", "engine"):
        problems.append(f"{cls.__name__}.placement_mode must be 'host' or 'engine', not {cls.placement_mode!r}")
        return problems
    if not cls.workbench_backend:
        problems.append(
            f"{cls.__name__}.workbench_backend must name its workbench.backends entry point (e.g. 'docker')"
        )
    for name in contract_members(cls.placement_mode):
        mine = getattr(BackendContract, name)
        theirs = getattr(cls, name)
        if getattr(theirs, "__func__", theirs) is getattr(mine, "__func__", mine):
            problems.append(
                f"{cls.__name__} is a {cls.placement_mode}-placed backend and does not implement "
                f"{name}() (see docs/backends.md)"
            )
    for name in ("start", "_apply_gpu_options", "_acquire", "_restore_lease", "_release"):
        owner = next(k for k in cls.__mro__ if name in vars(k))
        if owner is not GPUSpawnerMixin and issubclass(owner, GPUSpawnerMixin):
            problems.append(
                f"{owner.__name__} overrides {name}(), which belongs to the GPU policy's life cycle; "
                "implement the contract's members instead (docs/backends.md)"
            )
    return problems


_kept_contract: set[type] = set()  # classes checked already (the check runs once per class)


def require_contract(cls: type) -> None:
    """BackendContractError naming what ``cls`` misses; checked once per class (a spawner per server is made)."""
    if cls not in _kept_contract:
        problems = contract_problems(cls)
        if problems:
            raise BackendContractError(" ".join(problems))
        _kept_contract.add(cls)
