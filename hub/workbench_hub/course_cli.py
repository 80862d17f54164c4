"""``workbench course``: set courses up (admins) and run one (its instructors and TAs), from a terminal.

    workbench course                                   # the courses this token may see (an instructor's: theirs)
    workbench course set ml-101 --title "Machine learning 101" --starts 2027-01-11 --ends 2027-03-12 \\
        --max-gpus 1 --gpu-hours-per-week 10 --models H100-80GB --staff-group ml-101-staff --staff prof-lee
    workbench course show ml-101                       # its students: quota, GPUs, servers, GPU-hours this week
    workbench course quota ml-101 ann --max-gpus 1     # within the course's ceiling (the rest: the ceiling's)
    workbench course unquota ml-101 ann                # ann's groups' or the hub's default quota applies again
    workbench course stop ml-101 ann [--server big]    # saved first; ann reads "stopped by an instructor"
    workbench course delete ml-101                     # the hub group, quotas and servers stay
    workbench course import ml-101 roster.csv          # accounts, membership, staff; first-login instructions
    workbench course reserve ml-101 --gpus 2 --window "Thu 14:00-16:00"   # within the course's allowance
    workbench course reservations ml-101               # unreserve ml-101 ID cancels one
    workbench course exempt ml-101 --hours 3 --reason "Thursday lab"     # no idle reclaim for the session
    workbench course unexempt ml-101

Every command goes through the workbench service (``api/courses``) with the
token of ``--token`` (``WORKBENCH_ADMIN_TOKEN``): an admin's sets courses up,
an instructor's own token (the hub's token page makes one) runs their
course. Exit codes as the rest of ``workbench``: 1 the service refused (its
sentence: another course, above the ceiling, an ended course), 2 a bad
command line or the service unreachable.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import quote

ACTIONS = (
    "list",
    "show",
    "set",
    "delete",
    "quota",
    "unquota",
    "stop",
    "import",
    "reserve",
    "reservations",
    "unreserve",
    "exempt",
    "unexempt",
)


def add_course_parser(top) -> None:
    course = top.add_parser("course", help="courses: set one up (admins), run one (its instructors and TAs)")
    course.add_argument("action", nargs="?", choices=ACTIONS, default="list")
    course.add_argument("name", nargs="?", help="the course (its students' hub group)")
    course.add_argument(
        "student", nargs="?", help="with quota, unquota, stop: the student; import: the CSV file; unreserve: the id"
    )
    course.add_argument("--title", help="with set: the course's title")
    course.add_argument("--starts", help="with set: its first day, YYYY-MM-DD (the hub's time zone)")
    course.add_argument("--ends", help="with set: its last day, YYYY-MM-DD")
    course.add_argument("--max-gpus", type=int, help="with set: the ceiling's GPUs; with quota: the student's")
    course.add_argument("--gpu-hours-per-week", type=float, help="with set: the ceiling's; with quota: the student's")
    course.add_argument("--models", help="with set or quota: GPU models, comma separated")
    course.add_argument("--staff-group", help="with set: the hub group of its instructors and TAs")
    course.add_argument("--staff", help="with set: instructors and TAs by name, comma separated")
    course.add_argument("--server", default="", help="with stop: the student's named server (default: the default one)")
    course.add_argument("--reservation-gpus", type=int, help="with set: the most GPUs one staff booking may hold")
    course.add_argument("--gpus", type=int, help="with reserve: how many GPUs")
    course.add_argument("--window", help='with reserve: "Thu 14:00-16:00" (weekly) or "2027-01-14 14:00-16:00"')
    course.add_argument("--model", help="with reserve: only GPUs of this model")
    course.add_argument("--hours", type=float, help="with exempt: how long (at most 12 hours)")
    course.add_argument("--reason", help="with exempt: why")


def _names(text: str | None) -> list[str] | None:
    return None if text is None else [n.strip() for n in text.split(",") if n.strip()]


def _course_line(c: dict) -> str:
    dates = f"{c['starts'] or 'open'} to {c['ends'] or 'open'}"
    staff = ", ".join(([f"group {c['staff_group']}"] if c["staff_group"] else []) + c["staff"]) or "none"
    phase = "archived (ended)" if c["phase"] == "ended" else c["phase"]
    return f"{c['name']}: {c['title']} ({dates}, {phase}); staff: {staff}"


def _student_line(s: dict) -> str:
    running = ", ".join(
        (name or "default") + ("" if v["ready"] else f" ({v['pending'] or 'not ready'})")
        for name, v in s["running"].items()
    )
    return (
        f"{s['name']}: {s['held_gpus']} GPU(s) held, {s['gpu_hours_week']:g} GPU-hours this week, "
        f"quota {s['quota']['max_gpus']} GPU(s) ({s['quota']['origin']}); servers: {running or 'none'}"
    )


def _needs(args, error, *what: str) -> None:
    missing = [w for w in what if not getattr(args, w)]
    if missing:
        shown = " and ".join("the " + ("course" if w == "name" else w) for w in missing)
        raise error(f"workbench course {args.action} needs {shown}: see `workbench course --help`", 2)


def _set_body(args, error) -> dict:
    if not args.title or args.max_gpus is None:
        raise error("workbench course set needs --title and --max-gpus (the ceiling's GPUs per student)", 2)
    body: dict = {
        "title": args.title,
        "starts": args.starts,
        "ends": args.ends,
        "ceiling": {"max_gpus": args.max_gpus, "gpu_hours_per_week": args.gpu_hours_per_week},
        "staff_group": args.staff_group,
        "staff": _names(args.staff) or [],
    }
    if args.reservation_gpus is not None:
        body["reservation_gpus"] = args.reservation_gpus
    if args.models is not None:
        body["ceiling"]["allowed_models"] = _names(args.models)
    return body


def _import(args, call: Callable, error: type[Exception], path: str) -> tuple[object, str]:
    """``course import NAME FILE``: the file's text to the service, which applies it whole or not at all."""
    if not args.student:
        raise error("workbench course import needs the course and the roster's CSV file", 2)
    try:
        with open(args.student, encoding="utf-8-sig") as roster:
            text = roster.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read the roster {args.student}: {exc}", 2) from None
    data = call(args.url, args.token, "POST", f"{path}/roster", {"csv": text})
    hub = args.url.rstrip("/")
    lines = [
        f"Roster of {args.name}: {data['created']} account(s) made, {data['joined']} student(s) joined, "
        f"{data['staff_added']} added to its staff; {len(data['rows'])} rows. First logins (hand these out; "
        "each link works once):"
    ]
    for row in data["rows"]:
        first = row["first_login"].replace("/hub/signup?", f"{hub}/hub/signup?")
        lines.append(f"{row['user']} ({row['role']}, line {row['line']}): {first}")
    return data, "\n".join(lines)


def _sessions(args, call: Callable, error: type[Exception], path: str) -> tuple[object, str]:
    """``reserve``, ``reservations``, ``unreserve ID``, ``exempt`` and ``unexempt``: the course's GPU sessions."""
    action = args.action
    if action == "reserve":
        if not args.gpus or not args.window:
            raise error("workbench course reserve needs --gpus and --window", 2)
        body: dict = {"gpus": args.gpus, "window": args.window}
        if args.model:
            body["model"] = args.model
        data = call(args.url, args.token, "POST", f"{path}/reservations", body)
        return data, f"Reserved #{data['id']}: {data['description']}."
    if action == "reservations":
        data = call(args.url, args.token, "GET", f"{path}/reservations")
        lines = [f"#{r['id']} {r['description']}" for r in data["reservations"]]
        return data, "\n".join(lines) or f"no reservations for {args.name}"
    if action == "unreserve":
        if not args.student or not args.student.isdigit():
            raise error("workbench course unreserve needs the course and the reservation's id", 2)
        call(args.url, args.token, "DELETE", f"{path}/reservations/{args.student}")
        return None, f"Cancelled reservation #{args.student} of {args.name}."
    if action == "exempt":
        if args.hours is None:
            raise error("workbench course exempt needs --hours (at most 12)", 2)
        body = {"hours": args.hours, **({"reason": args.reason} if args.reason else {})}
        data = call(args.url, args.token, "PUT", f"{path}/idle-exemption", body)
        return data, f"{args.name} is exempt from idle reclaim until {data['until'][:16].replace('T', ' ')} UTC."
    call(args.url, args.token, "DELETE", f"{path}/idle-exemption")
    return None, f"{args.name} is subject to idle reclaim again."


def run_course(args, call: Callable, error: type[Exception], describe: Callable[[dict], str]) -> tuple[object, str]:
    action = args.action
    if action == "list":
        if args.name:
            raise error(f"workbench course takes no name without an action; did you mean `course show {args.name}`?", 2)
        data = call(args.url, args.token, "GET", "api/courses")
        return data, "\n".join(_course_line(c) for c in data["courses"]) or "no courses (for this token)"
    _needs(args, error, "name")
    path = f"api/courses/{quote(args.name, safe='')}"
    if action == "import":
        return _import(args, call, error, path)
    if action in ("reserve", "reservations", "unreserve", "exempt", "unexempt"):
        return _sessions(args, call, error, path)
    if action in ("quota", "unquota", "stop"):
        _needs(args, error, "name", "student")
        student = f"{path}/students/{quote(args.student, safe='')}"
        if action == "quota":
            if args.max_gpus is None:
                raise error("workbench course quota needs --max-gpus", 2)
            body: dict = {"max_gpus": args.max_gpus}
            if args.gpu_hours_per_week is not None:
                body["gpu_hours_per_week"] = args.gpu_hours_per_week
            if args.models is not None:
                body["allowed_models"] = _names(args.models)
            data = call(args.url, args.token, "PUT", f"{student}/quota", body)
            return data, (
                f"Set {args.student}'s quota for {args.name}: {describe(data['quota'])}. It applies to their next "
                "spawn while the course runs."
            )
        if action == "unquota":
            call(args.url, args.token, "DELETE", f"{student}/quota")
            return None, f"Removed {args.student}'s own quota; their groups' quota or the hub's default applies."
        data = call(args.url, args.token, "POST", f"{student}/stop", {"server": args.server})
        return data, f"Stopping {args.student}'s {args.server or 'default'} server. They read: {data['message']}"
    if args.student:
        raise error(f"workbench course {action} takes no student", 2)
    if action == "set":
        data = call(args.url, args.token, "PUT", path, _set_body(args, error))
        return data, "Set up " + _course_line(data) + f"; ceiling per student: {describe(data['ceiling'])}."
    if action == "delete":
        call(args.url, args.token, "DELETE", path)
        return None, f"Deleted the course {args.name}; its hub group, its students' quotas and servers stay."
    data = call(args.url, args.token, "GET", f"{path}/students")
    lines = [_course_line(data["course"]), f"ceiling per student: {describe(data['course']['ceiling'])}"]
    lines += [_student_line(s) for s in data["students"]] or ["no students (its hub group has no members yet)"]
    ends = data.get("ends_by_reason") or {}
    lines.append("servers ended this week: " + (", ".join(f"{n} {k}" for k, n in ends.items()) or "none"))
    return data, "\n".join(lines)
