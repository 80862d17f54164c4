"""``workbench drain``: close a GPU to new servers (e.g. to change its MIG layout), from a terminal.

    workbench drain GPU-5d3c...  --reason "MIG layout 7x1g.18gb -> 1x7g.141gb"   # or its index: drain 0
    workbench drain 0 --reason "new MIG layout" --stop-in 15   # and stop its servers in 15 minutes
    workbench drains                            # what is drained, and who still runs there
    workbench undrain GPU-5d3c...

A GPU is named by its UUID (``GPU-...``; in MIG mode with all its slices),
one slice's ``MIG-...`` UUID, or its index on this hub; the fleet page
lists them. Servers already on a drained GPU keep running until they stop,
or, with ``--stop-in MINUTES``, are warned now (a countdown in JupyterLab)
and stopped then, open notebooks saved first; ``workbench undrain`` before
that withdraws the warnings. Once ``workbench drains`` shows nobody there,
its layout may change.
Only the hub's own placement (local, docker) reads drains: where Slurm or
Kubernetes places servers, ``workbench drain`` is refused (exit code 1)
with the engine's command to drain or cordon the node instead;
``workbench undrain`` still removes a drain stored before.

Every command goes through the workbench service (``api/drains``), like the
rest of ``workbench``; exit codes are the same (1: refused, 2: bad command
line or service unreachable), and a GPU the hub does not have, or one that
is not drained when undraining, is 2 as well: the command line named it.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import quote

if TYPE_CHECKING:  # cli.py imports this module: its error class is handed in at run time
    from .cli import CLIError

AREAS = ("drain", "undrain", "drains")
# The longest --stop-in (a week), as the service's DrainBody schema takes.
MAX_STOP_MINUTES = 10080


def minutes_above_zero(text: str) -> float:
    """``--stop-in``'s value: a number of minutes above 0 (at most a week, as the service takes)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= MAX_STOP_MINUTES):
        raise argparse.ArgumentTypeError(
            f"--stop-in takes minutes above 0 and at most {MAX_STOP_MINUTES} (a week), not {text!r}"
        )
    return value


def add_drain_parsers(top) -> None:
    drain = top.add_parser("drain", help="drain a GPU: no new server gets it (running ones keep it until they stop)")
    drain.add_argument("gpu", help="the GPU's UUID (GPU-...), a MIG slice's UUID (MIG-...) or the GPU's index")
    drain.add_argument("--reason", default="", help="why (shown with the drain), e.g. the layout change")
    drain.add_argument(
        "--stop-in",
        type=minutes_above_zero,
        metavar="MINUTES",
        help="also stop the servers on it this many minutes from now (each is warned now with a countdown; "
        "open notebooks are saved first); without it they run until they stop",
    )
    undrain = top.add_parser("undrain", help="undrain a GPU: new servers may get it again")
    undrain.add_argument("gpu", help="the GPU's UUID, a MIG slice's UUID or the GPU's index")
    top.add_parser("drains", help="list drained GPUs and the servers still on them")


def _what(drain: dict) -> str:
    devices = drain["devices"]
    if not devices:
        return f"{drain['gpu_uuid']} (not on this hub now)"
    if devices == [drain["gpu_uuid"]]:
        return drain["gpu_uuid"]
    return f"{drain['gpu_uuid']} ({len(devices)} MIG slice{'' if len(devices) == 1 else 's'})"


def _at(stop_at: str) -> str:
    return stop_at[:16].replace("T", " ") + " UTC"


def _holders(drain: dict) -> str:
    names: dict[str, str] = {}
    for h in drain["holders"]:
        name = h["user"] + (f"/{h['server']}" if h["server"] else "")
        names[name] = f"{name} (to be stopped at {_at(h['stop_at'])})" if h.get("stop_at") else name
    if not names:
        return "nothing runs there: its layout may change now"
    return f"still in use by {', '.join(names[n] for n in sorted(names))}"


def _line(drain: dict) -> str:
    since = drain["since"][:16].replace("T", " ")
    reason = f" ({drain['reason']})" if drain["reason"] else ""
    return f"{_what(drain)}: drained since {since} UTC by {drain['drained_by'] or 'unknown'}{reason}; {_holders(drain)}"


def run_drain(args, call: Callable, error: type[CLIError]) -> tuple[object, str]:
    """``call`` and ``error`` are cli.py's: a refusal is ``error`` with the service's sentence and its status."""
    if args.area == "drains":
        data = call(args.url, args.token, "GET", "api/drains")
        return data, "\n".join(_line(d) for d in data["drains"]) or "no GPU is drained"
    if not args.gpu.strip():
        raise error(f"workbench {args.area} needs a GPU: its UUID, a MIG slice's UUID or its index", 2)
    path = f"api/drains/{quote(args.gpu.strip(), safe='')}"
    try:
        if args.area == "drain":
            body = {"reason": args.reason} if args.reason else {}
            if args.stop_in is not None:
                body["stop_servers_in_minutes"] = args.stop_in
            data = call(args.url, args.token, "PUT", path, body or None)
        else:
            data = call(args.url, args.token, "DELETE", path)
    except error as exc:
        if getattr(exc, "status", None) == 404:  # the command line named no GPU of this hub (or none drained)
            exc.code = 2
        raise
    if args.area == "undrain":
        return None, f"Undrained {args.gpu.strip()}: new servers may get it again."
    if data["holders"] and args.stop_in is not None:
        after = f"{_holders(data)}; each was warned now, and `workbench undrain` before then keeps them running"
    elif data["holders"]:
        after = f"{_holders(data)}; wait until `workbench drains` shows nobody there before changing its layout"
    else:
        after = _holders(data)
    return data, f"Drained {_what(data)}: no new server gets it; {after}."
