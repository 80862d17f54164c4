"""``workbench``: manage GPU quotas from a shell, through the workbench service's REST API.

Examples::

    export WORKBENCH_URL=http://127.0.0.1:8000        # the hub
    export WORKBENCH_ADMIN_TOKEN=...                  # a token with custom:workbench:admin
    workbench quota set alice --max-gpus 2 --gpu-hours-per-week 10 --models H100-80GB
    workbench quota set-group ml-course --max-gpus 1 --max-session-hours 4
    workbench quota show alice          # own quota and the effective one
    workbench quota show                # every quota
    workbench quota delete alice
    workbench quota delete-group ml-course
    workbench quota set-group ml-course --max-gpus 1 --gpu-idle-minutes 15   # idle GPUs come back
    workbench quota set-group students --max-gpus 1 --no-whole-gpus --allowed-profiles 1g.18gb
    workbench quota set-group research --max-gpus 4 --allowed-profiles none   # whole GPUs, no MIG slices
    workbench quota set-group thesis --max-gpus 1 --no-shared-gpus   # never a time-sliced GPU
    workbench idle                      # idle time per held GPU; idle exempt/unexempt GROUP
    workbench course set ml-101 --title "ML 101" --ends 2027-03-12 --max-gpus 1 --staff-group ml-101-staff
    workbench course show ml-101        # its students (an instructor's own token works for their course)
    workbench course quota ml-101 ann --max-gpus 1    # course quota/unquota/stop: course_cli.py
    workbench usage                     # GPU-hours of the last 7 days per user, by why leases ended
    workbench usage alice               # one user's (a user's own token may read their own)
    workbench usage --group ml-course   # a group's members, and how their servers ended
    workbench reserve ml-course --gpus 8 --weekly "Tue 10:00-12:00"            # every Tuesday
    workbench reserve ml-course --gpus 2 --model H100-80GB --once "2026-12-08 10:00-12:00" \
        --grace-minutes 10 --preempt --warn-minutes 15
    workbench reservations              # list them (id, window, open now or next)
    workbench reservations delete 3
    workbench drain 0 --reason "new MIG layout"   # GPU 0 (or GPU-.../MIG-...): no new servers there
    workbench drains                    # drained GPUs and who still runs there; undrain GPU
    workbench slurm-nodes               # Slurm: the GPUs jobs reported per node
    workbench slurm-forget-node gpu07   # Slurm: after replacing a node's GPUs
    workbench backup /srv/backups/wb-2026-12-07   # the hub's databases, cookie secret, local config
    workbench check-login alice         # LDAP/OIDC settings in the environment work; alice's groups
    workbench --version                 # this release (CHANGELOG.md)

It has no database URL of its own: every command goes through the service,
which uses the GPU database the hub passes it (``WORKBENCH_DB_URL`` in its environment, the hub's
``gpu_db_url``), so what it sets is what the hub enforces. ``quota show``
(without a name) prints that database (URL without password; admins only)
and the GPU models of the inventory the hub stored, which are what
``--models`` may name; an unknown model is refused with that list.

Reservation windows are wall-clock times in the hub's time zone (the list
prints it). A reservation the hub cannot meet (more GPUs than it has, an
overlap the inventory cannot cover, a malformed window, an unknown group or
model) is refused with the service's sentence and nothing is stored.

``check-login`` needs no service and no token either: it asks the directory
or the login provider in ``WORKBENCH_AUTHENTICATOR``'s settings what the hub
asks at start (``login_check_cli.py``; exit 1 when it refuses a setting).

``backup`` needs no service and no token: it reads the hub's data directory
and databases directly, also while the hub runs (``backup.py``;
docs/upgrading.md).

Exit codes: 0 done, 1 the service refused (the message says why; ``backup``:
a database could not be copied), 2 bad command line or the service could not
be reached (``drain``/``undrain``: also a GPU the hub does not have, or one
not drained; ``backup``: no data directory, an existing or unwritable target).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from urllib.parse import quote

from workbench_spawner.backend import installed_backends
from workbench_spawner.release import version

from .backup import add_backup_parser, run_backup
from .course_cli import add_course_parser, run_course
from .drain_cli import AREAS as DRAIN_AREAS
from .drain_cli import add_drain_parsers, run_drain
from .idle_cli import add_idle_parser, run_idle
from .login_check_cli import add_check_login_parser, run_check_login

SERVICE_PATH = "/services/workbench/"


class CLIError(Exception):
    """``code``: the exit code; ``status``: the service's HTTP status, when it refused (drain maps 404 to 2)."""

    def __init__(self, message: str, code: int = 1, status: int | None = None):
        super().__init__(message)
        self.code = code
        self.status = status


def _number(kind):
    def parse(text: str):
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a {'whole ' if kind is int else ''}number: {text!r}") from None

    return parse


def _optional_number(text: str):
    if text.lower() in ("none", "null", "unlimited", ""):
        return None
    return _number(float)(text)


def _profiles(text: str) -> list[str] | None:
    """``--allowed-profiles``: a comma list of MIG profiles, ``any`` (null) or ``none`` ([])."""
    word = text.strip().lower()
    if word == "any":
        return None
    if word in ("none", ""):
        return []
    return [p.strip() for p in text.split(",") if p.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="workbench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--url",
        default=os.environ.get("WORKBENCH_URL", "http://127.0.0.1:8000"),
        help="the hub's URL (default $WORKBENCH_URL or http://127.0.0.1:8000)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("WORKBENCH_ADMIN_TOKEN", ""),
        help="a hub API token with custom:workbench:admin (default $WORKBENCH_ADMIN_TOKEN)",
    )
    parser.add_argument("--json", action="store_true", help="print the service's JSON answer")
    parser.add_argument("--version", action="version", version=f"workbench (GPU Workbench) {version()}")
    top = parser.add_subparsers(dest="area", required=True)
    quota = top.add_parser("quota", help="GPU quotas of users and groups").add_subparsers(dest="action", required=True)
    for action, kind in (("set", "user"), ("set-group", "group")):
        p = quota.add_parser(action, help=f"set the quota of a {kind} (applies to the next spawn)")
        p.add_argument("name")
        p.add_argument("--max-gpus", type=_number(int), required=True, help="GPUs held at once")
        p.add_argument(
            "--gpu-hours-per-week",
            type=_optional_number,
            default=None,
            help="GPU-hours in the rolling last 7 days (default: no limit)",
        )
        p.add_argument(
            "--models", default=None, help="comma-separated allowed GPU models, e.g. H100-80GB,A100-40GB (default: any)"
        )
        p.add_argument(
            "--max-session-hours",
            type=_optional_number,
            default=None,
            help="servers are stopped after this many hours (default: no limit)",
        )
        p.add_argument(
            "--gpu-idle-minutes",
            type=_optional_number,
            default=None,
            help="stop a server whose GPUs stayed idle this long (0: never; default: the hub's)",
        )
        p.add_argument(
            "--gpu-idle-threshold",
            type=_optional_number,
            default=None,
            help="percent utilization under which a GPU counts as idle (default: the hub's, 5)",
        )
        p.add_argument(
            "--whole-gpus",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="whether whole (non-MIG) GPUs are allowed (default: yes; --no-whole-gpus: MIG slices only)",
        )
        p.add_argument(
            "--allowed-profiles",
            type=_profiles,
            default=None,
            metavar="1g.18gb,2g.35gb|any|none",
            help="comma-separated MIG profiles this user may get; any (the default) or none (no slices)",
        )
        p.add_argument(
            "--shared-gpus",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="whether a time-sliced GPU (shared by several servers) may be this user's "
            "(default: yes; --no-shared-gpus: only GPUs a server holds alone)",
        )
    for action, kind in (("show", "user"), ("show-group", "group")):
        p = quota.add_parser(action, help=f"show the quota of a {kind}, or every quota without a name")
        p.add_argument("name", nargs="?" if kind == "user" else None)
    for action, kind in (("delete", "user"), ("delete-group", "group")):
        p = quota.add_parser(action, help=f"delete the quota of a {kind} (falls back to groups or the default)")
        p.add_argument("name")
    reserve = top.add_parser("reserve", help="reserve GPUs for a group during a weekly or one-off window")
    reserve.add_argument("group", help="the JupyterHub group whose members may use the reserved GPUs")
    reserve.add_argument("--gpus", type=_number(int), required=True, help="how many GPUs to reserve")
    when = reserve.add_mutually_exclusive_group(required=True)
    when.add_argument("--weekly", metavar='"Tue 10:00-12:00"', help="every week, in the hub's time zone")
    when.add_argument("--once", metavar='"2026-12-08 10:00-12:00"', help="one date, in the hub's time zone")
    reserve.add_argument("--model", default=None, help="only GPUs of this model (default: any)")
    reserve.add_argument(
        "--grace-minutes",
        type=_number(float),
        default=None,
        help="release GPUs no member asked for after this long (default 15)",
    )
    reserve.add_argument(
        "--preempt",
        action="store_true",
        help="stop non-members' servers on the needed GPUs at the start (warned before)",
    )
    reserve.add_argument(
        "--warn-minutes",
        type=_number(float),
        default=None,
        help="with --preempt: warn this long before the start (default 10)",
    )
    listing = top.add_parser("reservations", help="list or delete reservations")
    listing.add_argument("action", nargs="?", choices=["list", "delete"], default="list")
    listing.add_argument("id", nargs="?", help="the reservation to delete (see the list)")
    usage = top.add_parser(
        "usage", help="GPU-hours of the last 7 days per user, split by why each lease ended (stopped, exited...)"
    )
    usage.add_argument("user", nargs="?", help="only this user (default: every user; needs custom:workbench:read)")
    usage.add_argument("--group", help="only this hub group's members (needs custom:workbench:read)")
    add_idle_parser(top)
    add_course_parser(top)
    add_drain_parsers(top)
    add_backup_parser(top)
    add_check_login_parser(top)
    for backend in installed_backends().values():
        if backend.cli:
            backend.cli.add_parsers(top)
    return parser


def call(url: str, token: str, method: str, path: str, body=None):
    if not token:
        raise CLIError("no token: set WORKBENCH_ADMIN_TOKEN or pass --token", 2)
    request = urllib.request.Request(
        url.rstrip("/") + SERVICE_PATH + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"token {token}", "Content-Type": "application/json", "Accept": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            raw = response.read()
            return json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            message = json.loads(raw)["message"]
        except (ValueError, KeyError, TypeError):
            message = raw.decode(errors="replace")[:200] or exc.reason
        raise CLIError(f"{method} {path} failed ({exc.code}): {message}", status=exc.code) from None
    except (urllib.error.URLError, OSError) as exc:
        raise CLIError(f"cannot reach the workbench service at {url}: {getattr(exc, 'reason', exc)}", 2) from None


def _describe(q: dict | None) -> str:
    if not q:
        return "none"
    parts = [f"{q['max_gpus']} GPU(s) at once"]
    parts.append(
        f"{q['gpu_hours_per_week']:g} GPU-hours/week"
        if q.get("gpu_hours_per_week") is not None
        else "no GPU-hour limit"
    )
    parts.append(
        f"models {', '.join(q['allowed_models']) or 'none'}" if q.get("allowed_models") is not None else "any model"
    )
    if q.get("max_session_hours") is not None:
        parts.append(f"sessions up to {q['max_session_hours']:g} h")
    if q.get("gpu_idle_minutes") is not None:
        parts.append(
            "never reclaimed when idle"
            if q["gpu_idle_minutes"] == 0
            else f"reclaimed after {q['gpu_idle_minutes']:g} idle min"
        )
    if q.get("gpu_idle_threshold") is not None:
        parts.append(f"idle under {q['gpu_idle_threshold']:g} %")
    # MIG: said only where the quota narrows the default (whole GPUs and any slice).
    if not q.get("whole_gpus", True):
        parts.append("no whole GPUs")
    profiles = q.get("allowed_profiles")
    if profiles is not None:
        parts.append(f"MIG slices {', '.join(profiles)}" if profiles else "no MIG slices")
    if not q.get("shared_gpus", True):
        parts.append("no time-sliced GPUs")
    return ", ".join(parts)


def _reservation_line(r: dict) -> str:
    state = (
        "open now" if r["active"] else (f"next {r['next_start'][:16].replace('T', ' ')}" if r["next_start"] else "over")
    )
    extra = f", grace {r['grace_minutes']:g} min"
    if r["preempt"]:
        extra += f", preempt (warned {r['warn_minutes']:g} min before)"
    return f"#{r['id']} {r['description']} ({state}{extra})"


def run_reservations(args) -> tuple[object, str]:
    if args.area == "reserve":
        window = args.weekly if args.weekly is not None else args.once
        if args.weekly is not None and window.strip()[:1].isdigit():
            raise CLIError(
                f'--weekly needs a weekday, not a date: e.g. "Tue 10:00-12:00" (got {window!r}); use --once for a date',
                2,
            )
        if args.once is not None and not window.strip()[:1].isdigit():
            raise CLIError(
                f'--once needs a date: e.g. "2026-12-08 10:00-12:00" (got {window!r}); use --weekly for a weekday', 2
            )
        body: dict = {"group": args.group, "gpus": args.gpus, "window": window, "preempt": args.preempt}
        if args.model is not None:
            body["model"] = args.model
        if args.grace_minutes is not None:
            body["grace_minutes"] = args.grace_minutes
        if args.warn_minutes is not None:
            body["warn_minutes"] = args.warn_minutes
        data = call(args.url, args.token, "POST", "api/reservations", body)
        return data, f"Reserved {_reservation_line(data)}."
    if args.action == "delete":
        if not args.id or not args.id.isdigit():
            raise CLIError(
                "workbench reservations delete needs the reservation's id (a number; "
                "`workbench reservations` lists them)",
                2,
            )
        call(args.url, args.token, "DELETE", f"api/reservations/{args.id}")
        return None, f"Deleted reservation #{args.id}."
    if args.id:
        raise CLIError("workbench reservations list takes no id", 2)
    data = call(args.url, args.token, "GET", "api/reservations")
    lines = [f"time zone: {data['time_zone']} (now {data['now'][:16].replace('T', ' ')})"]
    lines += [_reservation_line(r) for r in data["reservations"]] or ["no reservations"]
    return data, "\n".join(lines)


def _usage_line(u: dict) -> str:
    """One user's GPU-hours, in all and by reason kind, largest first ("held now" is still running)."""
    kinds = u.get("gpu_hours_week_by_reason") or {}
    parts = [f"{hours:g} {kind}" for kind, hours in sorted(kinds.items(), key=lambda item: (-item[1], item[0]))]
    detail = f": {', '.join(parts)}" if parts else ""
    line = f"{u['name']}: {u['gpu_hours_week']:g} GPU-hours, {u['held_gpus']} GPU(s) held now{detail}"
    servers = u.get("servers") or {}
    if any(servers):  # a named server among them: say which server used what (the default one alone says nothing new)
        line += "\n  by server: " + "; ".join(
            f"{name or 'default server'} {part['gpu_hours_week']:g} GPU-hours, {part['held_gpus']} held now"
            for name, part in sorted(servers.items())
        )
    return line


def run_usage(args) -> tuple[object, str]:
    query = [f"user={quote(args.user, safe='')}"] if args.user else []
    query += [f"group={quote(args.group, safe='')}"] if getattr(args, "group", None) else []
    data = call(args.url, args.token, "GET", "api/usage" + ("?" + "&".join(query) if query else ""))
    window = f"{data['window_start'][:16].replace('T', ' ')} to {data['window_end'][:16].replace('T', ' ')} UTC"
    of = f" (group {data['group']})" if data.get("group") else ""
    lines = [f"GPU-hours from {window}{of}, by why the leases ended:"]
    lines += [_usage_line(u) for u in data["users"]] or ["no users"]
    ends = data.get("ends_by_reason") or {}
    counted = ", ".join(f"{n} {kind}" for kind, n in ends.items())
    lines.append(f"Servers ended in that window: {sum(ends.values())}" + (f" ({counted})" if counted else ""))
    return data, "\n".join(lines)


def run(args) -> tuple[object, str]:
    if args.area == "backup":
        return run_backup(args, CLIError)
    if args.area == "check-login":
        return run_check_login(args, CLIError)
    if args.area == "usage":
        return run_usage(args)
    if args.area == "idle":
        return run_idle(args, call, CLIError)
    if args.area == "course":
        return run_course(args, call, CLIError, _describe)
    if args.area in ("reserve", "reservations"):
        return run_reservations(args)
    if args.area in DRAIN_AREAS:
        return run_drain(args, call, CLIError)
    for backend in installed_backends().values():
        if backend.cli and args.area in backend.cli.names:
            return backend.cli.run(args, call)
    action = args.action
    kind = "groups" if action.endswith("-group") else "users"
    if action in ("set", "set-group"):
        body = {
            "max_gpus": args.max_gpus,
            "gpu_hours_per_week": args.gpu_hours_per_week,
            "allowed_models": [m.strip() for m in args.models.split(",") if m.strip()]
            if args.models is not None
            else None,
            "max_session_hours": args.max_session_hours,
            "gpu_idle_minutes": args.gpu_idle_minutes,
            "gpu_idle_threshold": args.gpu_idle_threshold,
            "whole_gpus": args.whole_gpus,
            "allowed_profiles": args.allowed_profiles,
            "shared_gpus": args.shared_gpus,
        }
        data = call(args.url, args.token, "PUT", f"api/quotas/{kind}/{quote(args.name, safe='')}", body)
        return (
            data,
            f"Set the quota of {kind[:-1]} {args.name}: {_describe(data['quota'])}. It applies to the next spawn.",
        )
    if action in ("delete", "delete-group"):
        call(args.url, args.token, "DELETE", f"api/quotas/{kind}/{quote(args.name, safe='')}")
        return None, f"Deleted the quota of {kind[:-1]} {args.name}."
    if action == "show" and not args.name:
        data = call(args.url, args.token, "GET", "api/quotas")
        lines = []
        if data.get("database"):
            lines.append(f"database: {data['database']} (the hub's GPU database, through {args.url})")
        if "models" in data:
            lines.append(f"GPU models on {data.get('node') or 'this hub'}: {', '.join(data['models']) or 'none'}")
        lines.append(f"default: {_describe(data['default'])}")
        lines += [f"user {q['name']}: {_describe(q)}" for q in data["users"]]
        lines += [f"group {q['name']}: {_describe(q)}" for q in data["groups"]]
        return data, "\n".join(lines)
    data = call(args.url, args.token, "GET", f"api/quotas/{kind}/{quote(args.name, safe='')}")
    lines = [f"{kind[:-1]} {args.name}: own quota: {_describe(data['quota'])}"]
    if "effective" in data:
        eff = data["effective"]
        lines.append(f"effective: {_describe(eff)} ({eff['origin']})")
    if "users" in data:
        lines.append(f"members: {', '.join(data['users']) or 'none'}")
    return data, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        data, text = run(args)
    except CLIError as exc:
        print(f"workbench: {exc}", file=sys.stderr)
        return exc.code
    print(json.dumps(data, indent=2) if args.json and data is not None else text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
