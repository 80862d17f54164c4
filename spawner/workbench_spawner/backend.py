"""What a backend adds to the hub, the workbench service and the CLI, found by entry point.

A backend is one folder under ``workbench_spawner/backends/`` (or a package
of a site's own) with a spawner class (the ``jupyterhub.spawners`` entry
point, e.g. ``gpu-slurm``) and one :class:`BackendExtension`, registered in
the ``workbench.backends`` entry-point group under the name that
``WORKBENCH_BACKEND`` takes::

    [project.entry-points."workbench.backends"]
    slurm = "workbench_spawner.backends.slurm.extension:extension"

The hub's config file, the workbench service and the ``workbench`` CLI ask
this module for the extension by name and call its hooks; they never import
a backend module themselves (``tests/unit/test_import_walls.py`` guards it).
Nothing is installed when a backend module is imported: every addition
happens because the hub or the service called a hook. The spawner class
names its extension (``GPUSpawnerMixin.workbench_backend``), which the hub
publishes with the policy's settings, so a site's subclass of a backend's
spawner keeps every feature of it.

Each hook is optional except ``configure``; an extension module should
import its heavy dependencies (batchspawner, docker, the service's handler
classes) inside the hooks, so that listing the installed backends stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from traitlets.config import Config

    from workbench_devices import DeviceInventory
    from workbench_spawner.ledger.store import AllocationStore

GROUP = "workbench.backends"

Env = Mapping[str, str]


@dataclass(frozen=True)
class HubContext:
    """Where the hub runs, for a backend's ``configure``: its data dir, the repository, the Python env's bin.

    ``lookups``: questions a backend would otherwise ask the outside world
    while configuring (the docker backend: the Docker bridge's address), by
    name; a test passes its own answer, the hub none (the backend asks).
    """

    data_dir: Path
    repo: Path
    bin_dir: Path
    lookups: Mapping[str, Callable[[], str]] = field(default_factory=dict)


@dataclass(frozen=True)
class CLICommands:
    """Subcommands a backend adds to ``workbench`` (they talk to the service's routes of the backend)."""

    names: tuple[str, ...]
    add_parsers: Callable[[Any], None]  # argparse's subparsers object
    run: Callable[[Any, Callable[..., Any]], tuple[object, str]]  # (args, call) -> (data, text)


@dataclass(frozen=True)
class NodeDrain:
    """How an engine closes a node to new servers and opens it again.

    Where an engine places servers it never reads a workbench drain, so the
    service refuses ``PUT api/drains`` and says this instead (and the fleet
    page says where to drain). ``close`` and ``reopen`` are commands with
    ``{node}`` in them; empty where the engine has none to name.
    """

    engine: str  # as a person names it: "Slurm"
    verb: str  # what closing a node is called there: "drain", "cordon"
    close: str = ""  # 'scontrol update NodeName={node} State=DRAIN Reason="..."'
    reopen: str = ""  # "scontrol update NodeName={node} State=RESUME"
    wait_for: str = "its servers"  # what must end before a node's MIG layout can change

    def line(self) -> str:
        """One line for the fleet page: where a node is closed to new servers here."""
        how = f" ({self.close.format(node='<node>')})" if self.close else ""
        line = f"{self.engine} places servers on GPUs here: {self.verb} a node in {self.engine}{how}."
        return line[0].upper() + line[1:]

    def refusal(self, node: str = "") -> str:
        """Why a workbench drain is refused here, and what to run instead (on ``node`` where it is known)."""
        node = node or "<node>"
        how = (
            f" with `{self.close.format(node=node)}` (and `{self.reopen.format(node=node)}` after)"
            if self.close
            else ""
        )
        return (
            f"this hub runs on {self.engine}, which places servers on GPUs itself and does not read workbench "
            f"drains, so nothing was drained; {self.verb} the node in {self.engine} instead{how}. A MIG layout "
            f"change needs all the node's GPUs idle: wait until {self.wait_for} have ended."
        )


def _no_problems(config: Config) -> list[str]:
    return []


def _nothing(*args: Any) -> None:
    return None


def _no_routes(prefix: str) -> list[tuple]:
    return []


def _same_inventory(store: AllocationStore, inventory: DeviceInventory) -> DeviceInventory:
    return inventory


@dataclass(frozen=True)
class BackendExtension:
    """A backend's additions, each a plain function the hub, the service or the CLI calls.

    ``configure(c, env, hub)``: ``WORKBENCH_BACKEND=<name>`` becomes config
    (the spawner class, how servers reach the hub, the backend's own
    ``WORKBENCH_*`` variables); raises ``ConfigError`` with a sentence.

    ``check(final_config) -> [sentence]``: run by the hub's config file on the
    final config (every file and the command line); any sentence ends the hub
    with exit 2, before a user could spawn into a misconfiguration.

    ``setup_hub(c)``: what the hub must serve for this backend beyond
    JupyterHub's own API (Slurm: the job's start report), called by the hub's
    config file before JupyterHub builds its routes; a route is added to ``c``
    (``c.JupyterHub.extra_handlers``, ``placement.engine_extension.add_hub_route``),
    never to JupyterHub's module-level handler lists.

    ``service_routes(prefix) -> [(pattern, handler)]`` and ``openapi``
    (a YAML fragment with ``paths`` and ``components``, merged into the
    service's document): the backend's part of the workbench service's API.

    ``resolve_inventory(store, inventory)``: the fleet view's inventory as
    this backend knows it (Slurm: GPUs named by the UUIDs jobs reported).

    ``annotate_fleet(gpu_rows)``: adds this backend's view of each GPU row
    under the key ``name`` (Slurm: node state, allocated outside the workbench).

    ``cli``: subcommands of ``workbench``.

    ``node_drain``: for an engine backend, how its engine closes a node to
    new servers (:class:`NodeDrain`); the service names it when it refuses a
    workbench drain, which only the hub's own placement reads.
    """

    name: str
    spawner: str
    summary: str
    configure: Callable[[Config, Env, HubContext], None]
    check: Callable[[Config], list[str]] = _no_problems
    setup_hub: Callable[[Config], None] = _nothing
    service_routes: Callable[[str], list[tuple]] = _no_routes
    openapi: Path | None = None
    resolve_inventory: Callable[[AllocationStore, DeviceInventory], DeviceInventory] = _same_inventory
    annotate_fleet: Callable[[list[dict]], None] = _nothing
    cli: CLICommands | None = None
    node_drain: NodeDrain | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


class UnknownBackendError(LookupError):
    """No installed backend has this name; str(err) says which ones are."""


@cache
def installed_backends() -> dict[str, BackendExtension]:
    """Every backend registered in the ``workbench.backends`` group, by name (loaded once per process)."""
    found: dict[str, BackendExtension] = {}
    for point in entry_points(group=GROUP):
        extension = point.load()
        if not isinstance(extension, BackendExtension):
            raise TypeError(f"the {GROUP} entry point {point.name!r} ({point.value}) is not a BackendExtension")
        if extension.name != point.name:
            raise TypeError(f"the {GROUP} entry point {point.name!r} names its extension {extension.name!r}")
        found[point.name] = extension
    return dict(sorted(found.items()))


def backend_extension(name: str) -> BackendExtension:
    """The installed backend ``name`` (as ``WORKBENCH_BACKEND`` says it), or UnknownBackendError."""
    backends = installed_backends()
    try:
        return backends[name]
    except KeyError:
        raise UnknownBackendError(
            f"WORKBENCH_BACKEND={name!r} is not an installed backend; use one of: {', '.join(backends)}"
        ) from None


def extension_of(backend: str) -> BackendExtension | None:
    """The extension a published ``PolicySettings.backend`` names, or None (an unknown or empty name)."""
    return installed_backends().get(backend)


def node_drain_of(backend: str) -> NodeDrain:
    """How the engine of a published ``backend`` closes a node; a general answer for one that does not say."""
    extension = extension_of(backend)
    if extension is not None and extension.node_drain is not None:
        return extension.node_drain
    return NodeDrain(engine=f"the {backend} engine" if backend else "its engine", verb="close")


def openapi_fragments(names: Sequence[str]) -> list[Path]:
    """The OpenAPI fragments of these backends, for the service's document."""
    return [ext.openapi for name in names if (ext := extension_of(name)) and ext.openapi]
