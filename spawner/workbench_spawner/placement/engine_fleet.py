"""What every engine backend's fleet view and node admin share, so an engine writes only its differences.

On an engine the hub names a real GPU by the UUID the first job on its node
reported (the backend's ``NodeBook``). ``GET api/<engine>/nodes``
(``workbench <engine>-nodes``) lists what the hub learned, with what the engine
says of each node; when a node's GPUs are replaced an admin forgets it
(``DELETE api/<engine>/nodes/{node}``, or ``workbench <engine>-forget-node NODE``)
and the next job there names them again. An engine declares its book, its words
and how it lists its nodes (``EngineNodes``); ``node_routes`` and ``node_cli``
build the rest. ``Recent`` keeps an engine's node or job list for a couple of
seconds, so a busy admin page, spawn form or reconcile pass does not hammer the
engine's controller.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any, Generic, TypeVar
from urllib.parse import quote

from workbench_spawner.backend import CLICommands

log = logging.getLogger("workbench.service")

T = TypeVar("T")


def lazy(target: str) -> Callable[..., Any]:
    """``"package.module:name"`` as a function that imports the module on its first call and calls ``name``
    (an engine's hooks are named this way so that listing the installed backends stays cheap)."""
    module, _, name = target.partition(":")

    def call(*args: Any) -> Any:
        return getattr(import_module(module), name)(*args)

    call.__qualname__ = call.__name__ = name
    return call


class Recent(Generic[T]):
    """A slow blocking read (an engine's node or job list), answered from memory for ``max_age`` seconds.

    One caller reads at a time; the others wait for its answer instead of asking the engine too. The age
    counts from the answer, so a slow read does not run back to back. A read that raises one of
    ``unavailable`` is logged with ``warning`` (``%s``: the error); the answer is then None, or with
    ``keep`` the last one (a node the engine cannot tell about is not declared dead by the hub), and the
    engine is asked again after ``retry_after`` seconds (0: at the next call; default ``max_age``)."""

    def __init__(
        self,
        read: Callable[[], T],
        max_age: float,
        *,
        unavailable: type[Exception] | tuple[type[Exception], ...] = (),
        warning: str = "%s",
        keep: bool = False,
        retry_after: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger = log,
    ) -> None:
        self.read, self.max_age, self.clock = read, max_age, clock
        self.unavailable, self.warning, self.keep, self.logger = unavailable, warning, keep, logger
        self.retry_after = max_age if retry_after is None else retry_after
        self._value: T | None = None
        self._next_read: float | None = None
        self._lock = threading.Lock()

    def __call__(self) -> T | None:
        """The last answer, read again first when it is older than ``max_age``. Blocking."""
        with self._lock:
            if self._next_read is None or self.clock() >= self._next_read:
                try:
                    self._value, wait = self.read(), self.max_age
                except self.unavailable as exc:
                    self.logger.warning(self.warning, exc)
                    self._value, wait = self._value if self.keep else None, self.retry_after
                self._next_read = self.clock() + wait
            return self._value


@dataclass(frozen=True)
class EngineNodes:
    """An engine's node admin in its own words: ``api/<prefix>/nodes`` and ``workbench <prefix>-nodes`` /
    ``workbench <prefix>-forget-node NODE``.

    ``book`` names the node-UUID book class (``"module:Class"``, a ``ledger.node_book.NodeBook``);
    ``rows`` (``"module:function"``, blocking) turns what the book knows into the listing's node rows,
    or None when ``engine``'s API did not answer (503). ``unknown`` (the 404 of a forget) and ``forgot``
    (the CLI's answer to one) have ``{node}``; ``lines(row)`` are the CLI's lines for a row, ``none`` its
    answer when there is no line; the ``*_help`` are the CLI's."""

    prefix: str
    engine: str
    book: str
    rows: str
    max_node: int
    unknown: str
    forgot: str
    lines: Callable[[dict], list[str]]
    none: str
    nodes_help: str
    forget_help: str
    node_help: str


def node_routes(nodes: EngineNodes, prefix: str) -> list[tuple[str, type]]:
    """The service's ``GET api/<engine>/nodes`` (read scope) and ``DELETE api/<engine>/nodes/{node}`` (admin
    only; 204, or 404 with ``unknown``) under ``prefix``. Imports the service's handler class: call it from
    the service."""
    from workbench_hub.service.handlers import APIHandler

    book, rows = lazy(nodes.book), lazy(nodes.rows)

    class NodesHandler(APIHandler):
        async def get(self) -> None:
            await self.require_read()
            found = await asyncio.to_thread(lambda: rows(book(self.fleet.store).known()))
            if found is None:
                self.fail(503, f"the {nodes.engine} API did not answer; the hub's log says why")
            self.send({"nodes": found})

    class ForgetNodeHandler(APIHandler):
        async def delete(self, node: str) -> None:
            await self.require_admin("make the hub forget a node's GPUs")
            if len(node) > nodes.max_node:
                self.fail(400, f"a node name has at most {nodes.max_node} characters")
            if not await asyncio.to_thread(book(self.fleet.store).forget, node):
                self.fail(404, nodes.unknown.format(node=json.dumps(node)))
            log.info("%s made the hub forget the GPUs of %s node %s", self.caller_name(), nodes.engine, node)
            self.set_status(204)
            self.finish()

    for handler in (NodesHandler, ForgetNodeHandler):
        handler.__name__ = handler.__qualname__ = nodes.engine + handler.__name__
    route = f"{prefix}api/{nodes.prefix}/nodes"
    return [(route, NodesHandler), (route + "/([^/]+)", ForgetNodeHandler)]


def node_cli(nodes: EngineNodes) -> CLICommands:
    """``workbench <prefix>-nodes`` and ``workbench <prefix>-forget-node NODE``, through the service's
    ``api/<prefix>/nodes`` like the rest of ``workbench`` (exit codes: 1 refused, 2 bad command line or
    service unreachable)."""
    listing, forget = f"{nodes.prefix}-nodes", f"{nodes.prefix}-forget-node"

    def add_parsers(top: Any) -> None:
        top.add_parser(listing, help=nodes.nodes_help)
        top.add_parser(forget, help=nodes.forget_help).add_argument("node", help=nodes.node_help)

    def run(args: Any, call: Callable[..., Any]) -> tuple[object, str]:
        if args.area == forget:
            call(args.url, args.token, "DELETE", f"api/{nodes.prefix}/nodes/{quote(args.node, safe='')}")
            return None, nodes.forgot.format(node=args.node)
        data = call(args.url, args.token, "GET", f"api/{nodes.prefix}/nodes")
        return data, "\n".join(line for row in data["nodes"] for line in nodes.lines(row)) or nodes.none

    return CLICommands(names=(listing, forget), add_parsers=add_parsers, run=run)
