"""What every engine backend's ``BackendExtension`` shares, so a third engine writes only its differences.

An engine backend (Slurm, Kubernetes) adds the same kinds of things to the
hub: a start-report route on the hub's API, a node-UUID book that names the
fleet's GPUs by what jobs reported, a fleet annotation, ``api/<engine>/nodes``
routes with their CLI, and how its engine closes a node. ``engine_extension``
builds the extension from the dotted names of those hooks, imported only
when called (listing the installed backends stays cheap), and the node routes
and CLI from the engine's declaration of them (``engine_fleet.EngineNodes``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from traitlets.config import Config, LazyConfigValue

from workbench_spawner.backend import BackendExtension, Env, HubContext, NodeDrain
from workbench_spawner.placement.engine_fleet import EngineNodes, lazy, node_cli, node_routes


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
    nodes: EngineNodes,
    annotate_fleet: str,
    node_drain: NodeDrain,
    openapi: Path | None = None,
    check: str = "",
) -> BackendExtension:
    """An engine backend's extension from its hooks' dotted names (``"module:function"``).

    ``setup_hub(c)`` adds the start-report route (``add_hub_route``); ``nodes`` declares the node routes and
    CLI (``engine_fleet.EngineNodes``), and its book's ``resolve`` names the fleet's GPUs;
    ``annotate_fleet(rows)`` adds the engine's view of each GPU row; ``check(config)`` an optional config
    check."""
    book_class = lazy(nodes.book)

    def resolve_inventory(store: Any, inventory: Any) -> Any:
        return book_class(store).resolve(inventory)

    extra: dict[str, Any] = {"check": lazy(check)} if check else {}
    return BackendExtension(
        name=name,
        spawner=spawner,
        summary=summary,
        configure=configure,
        setup_hub=lazy(setup_hub),
        service_routes=partial(node_routes, nodes),
        openapi=openapi,
        resolve_inventory=resolve_inventory,
        annotate_fleet=lazy(annotate_fleet),
        cli=node_cli(nodes),
        node_drain=node_drain,
        **extra,
    )
