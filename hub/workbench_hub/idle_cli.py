"""``workbench idle``: the idle-GPU rule, each held GPU's idle time, and exempt groups, from a terminal.

    workbench idle                              # the rule, exempt groups, idle time per held GPU
    workbench idle exempt research --reason "long CPU preprocessing"
    workbench idle unexempt research

Every command goes through the workbench service (``api/idle``), like the
rest of ``workbench``; exit codes are the same (1: refused, 2: bad command
line or service unreachable).
"""

from __future__ import annotations

from urllib.parse import quote


def add_idle_parser(top) -> None:
    idle = top.add_parser("idle", help="idle-GPU reclaim: the rule, idle time per held GPU, exempt groups")
    idle.add_argument("action", nargs="?", choices=["show", "exempt", "unexempt"], default="show")
    idle.add_argument("group", nargs="?", help="the hub group to exempt or unexempt")
    idle.add_argument("--reason", default="", help="with exempt: why this group may keep idle GPUs")


def _idle_time(seconds) -> str:
    if seconds is None:
        return "busy or no reading"
    return f"idle {int(seconds // 60)} min {int(seconds % 60)} s"


def run_idle(args, call, error) -> tuple[object, str]:
    if args.action in ("exempt", "unexempt"):
        if not args.group:
            raise error(f"workbench idle {args.action} needs a group name", 2)
        path = f"api/idle/exemptions/{quote(args.group, safe='')}"
        if args.action == "exempt":
            data = call(args.url, args.token, "PUT", path, {"reason": args.reason})
            return data, f"Group {args.group} is exempt from idle reclaim from the next check."
        if args.reason:
            raise error("--reason goes with exempt, not unexempt", 2)
        call(args.url, args.token, "DELETE", path)
        return None, f"Group {args.group} is subject to idle reclaim again."
    if args.group or args.reason:
        raise error("workbench idle (show) takes no group or --reason; did you mean `workbench idle exempt GROUP`?", 2)
    data = call(args.url, args.token, "GET", "api/idle")
    rule = data["default_rule"]
    lines = [
        f"hub default: {'stop ' + rule['describe'] if rule['enabled'] else 'off'}"
        + (f", warned {rule['warn_minutes_before']:g} min before" if rule["enabled"] else "")
    ]
    lines += [f"exempt: {g['group']}" + (f" ({g['reason']})" if g["reason"] else "") for g in data["exempt_groups"]]
    lines += [
        f"{g['uuid']} held by {g['user']}{'/' + g['server'] if g['server'] else ''}: "
        f"{_idle_time(g['idle_seconds'])} (reading from {g['reading_source'] or 'nowhere yet'})"
        for g in data["gpus"]
    ] or ["no GPU is held"]
    return data, "\n".join(lines)
