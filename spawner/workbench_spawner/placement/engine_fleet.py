"""The admin's node routes and CLI every engine backend shares: list what the hub learned, forget a node.

On an engine the hub names a real GPU by the UUID the first job on its node
reported (the backend's ``NodeBook``). When a node's GPUs are replaced an admin
forgets what was known (``DELETE api/<engine>/nodes/{node}``, or
``workbench <engine>-forget-node NODE``); the next job there names them again.
Each engine supplies its book, its words and how it lists its nodes.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from workbench_spawner.ledger.node_book import NodeBook
from workbench_spawner.ledger.store import AllocationStore

log = logging.getLogger("workbench.service")


def forget_node_handler(book: Callable[[AllocationStore], NodeBook], engine: str, max_node: int, unknown: str) -> type:
    """The ``DELETE api/<engine>/nodes/{node}`` handler (admin only; 204, or 404 saying ``unknown``, which
    has ``{node}`` for the quoted name). Imports the service's handler class: call it from the service."""
    from workbench_hub.service.handlers import APIHandler

    class ForgetNodeHandler(APIHandler):
        async def delete(self, node: str) -> None:
            await self.require_admin("make the hub forget a node's GPUs")
            if len(node) > max_node:
                self.fail(400, f"a node name has at most {max_node} characters")
            if not await asyncio.to_thread(book(self.fleet.store).forget, node):
                self.fail(404, unknown.format(node=json.dumps(node)))
            log.info("%s made the hub forget the GPUs of %s node %s", self.caller_name(), engine, node)
            self.set_status(204)
            self.finish()

    ForgetNodeHandler.__name__ = ForgetNodeHandler.__qualname__ = f"{engine}ForgetNodeHandler"
    return ForgetNodeHandler


def add_node_parsers(top: Any, prefix: str, nodes_help: str, forget_help: str, node_help: str) -> None:
    """``workbench <prefix>-nodes`` and ``workbench <prefix>-forget-node NODE``."""
    top.add_parser(f"{prefix}-nodes", help=nodes_help)
    forget = top.add_parser(f"{prefix}-forget-node", help=forget_help)
    forget.add_argument("node", help=node_help)


def run_node_cli(
    args: Any, call: Callable[..., Any], prefix: str, forgot: str, lines: Callable[[Any], list[str]], none: str
) -> tuple[object, str]:
    """Run either command through the service's ``api/<prefix>/nodes``: ``forgot`` (with ``{node}``) after a
    forget; else each of ``lines(data)``, or ``none`` when there is none."""
    if args.area == f"{prefix}-forget-node":
        call(args.url, args.token, "DELETE", f"api/{prefix}/nodes/{quote(args.node, safe='')}")
        return None, forgot.format(node=args.node)
    data = call(args.url, args.token, "GET", f"api/{prefix}/nodes")
    return data, "\n".join(lines(data)) or none
