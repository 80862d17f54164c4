"""``workbench drain``: close a GPU to new servers (e.g. to change its MIG layout), from a terminal.

    workbench drain GPU-5d3c...  --reason "MIG layout 7x1g.18gb -> 1x7g.141gb"   # or its index: drain 0
    workbench drains                            # what is drained, and who still runs there
    workbench undrain GPU-5d3c...

A GPU is named by its UUID (``GPU-...``; in MIG mode with all its slices),
one slice's ``MIG-...`` UUID, or its index on this hub; the fleet page
lists them. Servers already on a drained GPU keep running until they stop;
once ``workbench drains`` shows nobody there, its layout may change.
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

from collections.abc import Callable
from urllib.parse import quote

AREAS = ("drain", "undrain", "drains")


def add_drain_parsers(top) -> None:
    drain = top.add_parser("drain", help="drain a GPU: no new server gets it (running ones keep it until they stop)")
    drain.add_argument("gpu", help="the GPU's UUID (GPU-...), a MIG slice's UUID (MIG-...) or the GPU's index")
    drain.add_argument("--reason", default="", help="why (shown with the drain), e.g. the layout change")
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


def _holders(drain: dict) -> str:
    names = sorted({h["user"] + (f"/{h['server']}" if h["server"] else "") for h in drain["holders"]})
    if not names:
        return "nothing runs there: its layout may change now"
    return f"still in use by {', '.join(names)}"


def _line(drain: dict) -> str:
    since = drain["since"][:16].replace("T", " ")
    reason = f" ({drain['reason']})" if drain["reason"] else ""
    return f"{_what(drain)}: drained since {since} UTC by {drain['drained_by'] or 'unknown'}{reason}; {_holders(drain)}"


def run_drain(args, call: Callable, error: type[Exception]) -> tuple[object, str]:
    """``call`` and ``error`` are cli.py's: a refusal is ``error`` with the service's sentence and its status."""
    if args.area == "drains":
        data = call(args.url, args.token, "GET", "api/drains")
        return data, "\n".join(_line(d) for d in data["drains"]) or "no GPU is drained"
    if not args.gpu.strip():
        raise error(f"workbench {args.area} needs a GPU: its UUID, a MIG slice's UUID or its index", 2)
    path = f"api/drains/{quote(args.gpu.strip(), safe='')}"
    try:
        if args.area == "drain":
            data = call(args.url, args.token, "PUT", path, {"reason": args.reason} if args.reason else None)
        else:
            data = call(args.url, args.token, "DELETE", path)
    except error as exc:
        if getattr(exc, "status", None) == 404:  # the command line named no GPU of this hub (or none drained)
            exc.code = 2
        raise
    if args.area == "undrain":
        return None, f"Undrained {args.gpu.strip()}: new servers may get it again."
    if data["holders"]:
        after = f"{_holders(data)}; wait until `workbench drains` shows nobody there before changing its layout"
    else:
        after = _holders(data)
    return data, f"Drained {_what(data)}: no new server gets it; {after}."
