"""What every engine backend's ``BackendExtension`` shares, so a third engine writes only its differences.

An engine backend (Slurm, Kubernetes) adds the same kinds of things to the
hub: a start-report route on the hub's API, a node-UUID book that names the
fleet's GPUs by what jobs reported, a fleet annotation, ``api/<engine>/nodes``
routes with their CLI, and how its engine closes a node. ``engine_extension``
builds the extension from the dotted names of those hooks, imported only
when called (listing the installed backends stays cheap).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from pathlib import Path
from typing import Any

from traitlets.config import Config, LazyConfigValue

from workbench_spawner.backend import BackendExtension, CLICommands, Env, HubContext, NodeDrain


def lazy(target: str) -> Callable[..., Any]:
    """``"package.module:name"`` as a function that imports the module on its first call and calls ``name``."""
    module, _, name = target.partition(":")

    def call(*args: Any) -> Any:
        return getattr(import_module(module), name)(*args)

    call.__qualname__ = call.__name__ = name
    return call


def add_hub_route(c: Config, route: str, handler: type) -> None:
    """Serve ``handler`` at ``route`` under the hub's prefix (``/hub/`` + the route), once, by configuration.

    Through ``c.JupyterHub.extra_handlers``: JupyterHub prefixes them with its ``hub_prefix`` as it does its
    own API (``JupyterHub.init_handlers``), so ``/api/batchspawner`` is served at ``<base_url>hub/api/batchspawner``
    as before. The trait is marked deprecated since JupyterHub 3.1 (jupyterhub/jupyterhub#4236, which points at
    services but has "no plans to remove" it); a start report must reach the hub process itself (it sets the
    starting spawner's state), which a service cannot, so this is the public way to add one."""
    section = c.JupyterHub
    current = section.get("extra_handlers", [])
    if isinstance(current, LazyConfigValue):  # c.JupyterHub.extra_handlers.append(...) earlier in the config
        current = current.get_value([])
    section.extra_handlers = [h for h in current if h[0] != route] + [(route, handler)]


def engine_extension(
    *,
    name: str,
    spawner: str,
    summary: str,
    configure: Callable[[Config, Env, HubContext], None],
    setup_hub: str,
    book: str,
    annotate_fleet: str,
    service_routes: str,
    cli_names: tuple[str, ...],
    add_parsers: str,
    run_cli: str,
    node_drain: NodeDrain,
    openapi: Path | None = None,
    check: str = "",
) -> BackendExtension:
    """An engine backend's extension from its hooks' dotted names (``"module:function"``).

    ``setup_hub(c)`` adds the start-report route (``add_hub_route``); ``book`` is the node-UUID book class
    (``ledger.node_book.NodeBook``) whose ``resolve`` names the fleet's GPUs; ``annotate_fleet(rows)`` adds
    the engine's view of each GPU row; ``service_routes(prefix)`` and the CLI's ``add_parsers(top)`` /
    ``run_cli(args, call)`` are the engine's node routes; ``check(config)`` an optional config check."""
    book_class = lazy(book)

    def resolve_inventory(store: Any, inventory: Any) -> Any:
        return book_class(store).resolve(inventory)

    extra: dict[str, Any] = {"check": lazy(check)} if check else {}
    return BackendExtension(
        name=name,
        spawner=spawner,
        summary=summary,
        configure=configure,
        setup_hub=lazy(setup_hub),
        service_routes=lazy(service_routes),
        openapi=openapi,
        resolve_inventory=resolve_inventory,
        annotate_fleet=lazy(annotate_fleet),
        cli=CLICommands(names=cli_names, add_parsers=lazy(add_parsers), run=lazy(run_cli)),
        node_drain=node_drain,
        **extra,
    )
