"""Class start: N students log in at once, open the spawn form, press Start and watch the progress stream.

What it measures, on our hub (`make run`'s config, local backend, simulated GPUs) and on plain
JupyterHub 6.1.1 with the same authenticator (`benchmarks/plain_class_start_config.py`), one
after the other in the same run, for each GPU layout asked (`--runs`):

* ``whole``: ``WORKBENCH_SIMULATED_GPUS=8`` (8 whole GPUs; students send ``gpus=1``);
* ``mig``: ``WORKBENCH_SIMULATED_GPUS=8xH200-141GB:mig=7x1g.18gb`` (56 slices; students pick the
  slice in the form's "Kind of GPU" field, ``gpu_profile``, and ``gpus=1``).

How. Each hub gets a private data dir. N NativeAuthenticator accounts are made before the timed
part: authorized rows in NativeAuthenticator's ``users_info`` table with one bcrypt hash (cost 12,
NativeAuthenticator's own), written into the hub's database while it runs, and hub users made
through the REST API (students who used the hub before; on our hub an authorized sign-up is a hub
user anyway). Then every student, in a thread of its own with its own ``requests.Session`` and
browser-like ``Sec-Fetch-*`` headers, starts at the same instant and does what a browser does:

1. ``GET /hub/login`` (the form, its ``_xsrf`` cookie), ``POST /hub/login`` (302 expected);
2. ``GET /hub/home``; ``GET /hub/spawn`` (the spawn form; its fields are read as a browser
   would send them: inputs, each select's selected or first option, checked radios);
3. presses Start: ``POST /hub/spawn`` (multipart, as the form's enctype says, with ``_xsrf``);
   302 to the spawn-pending page expected, anything else (429 Too Many Requests, 5xx, the form
   again) is that student's outcome;
4. ``GET /hub/spawn-pending/<name>`` and its EventSource, the progress stream
   (``/hub/api/users/<name>/server/progress?_xsrf=...``), reconnecting after 1 s if it ends, until
   the server is ready (**served**), the spawn failed, or a message gives a place in a line
   (**in line**: a message containing "ahead of you", "next in line" or "ahead of yours"), or
   ``--follow-seconds`` after Start.

A separate probe process asks ``GET /hub/api/`` through the public proxy every 100 ms, open loop
(each request at its slot on its own connection, so a stalled hub shows as every request sent
during the stall being slow): its latency is the hub loop's lag. Reported for the login phase
(from the class start until the last ``POST /hub/login`` is answered) and for the whole class
start; the hub log's "Event loop was unresponsive" lines (JupyterHub's own loop watcher) are
counted for the same windows. Servers are real ``jupyterhub-singleuser`` processes (8, or 56 on
the MIG run, on our hub; as many as get through on plain's). At the end of each hub every process
it caused (hub, proxy, servers, the workbench service) is stopped and checked gone.

With a directory (``--hubs ours,ldap``, ``benchmarks/class_start_directory.py``): ``ldap`` is our hub
with ``WORKBENCH_AUTHENTICATOR=ldap`` on the tests' private slapd (StartTLS, a service account finds
each student, then the student binds, then the groups are searched), the class in the directory's
course group ``ml-course``, which has a GPU quota before anyone logs in; no NativeAuthenticator rows,
the hub users made through the REST API as for ``ours``. ``ldap-blocking`` is the same hub with
ldapauthenticator's stock ``LDAPAuthenticator`` (its login on the event loop,
``benchmarks/stock_ldap_config.py``). Before the timed part the directory hub's report measures one
login alone (the hub's authenticator code, with and without TLS, and one bcrypt check); during it the
CPU seconds of the hub process and of slapd are sampled, for the login phase.

Plain JupyterHub: NativeAuthenticator 1.3.0 with only the two fixes its login page needs on
JupyterHub 6, ``SimpleLocalProcessSpawner`` running ``jupyterhub-singleuser``, a static spawn form,
``concurrent_spawn_limit`` at the GPU count (8, or 56), as the issue did. It has no GPUs and no
line: it is the baseline for the login, home, form and Start latencies and the hub loop's lag.

Reported per run and hub: p50/p95 of each step, 429s and 5xx (every response of every student,
progress streams included), request errors, outcomes (served, in line, spawn failed, refused),
time from Start to served-or-in-line (p50/p95/max, and how many within 60 s), the time from the
class start until every student is served or in line, whether the places in line were distinct,
the hub loop's lag, and the servers ready at the end.

Targets (our hub, with NativeAuthenticator and with LDAP): 0 x 429 and 0 x 5xx; every student
served or in line with a position within 60 s of pressing Start; hub loop lag p95 under 250 ms
during the logins (plain JupyterHub: over 20 s); spawn form p50 within 1.5x plain's.

    .venv/bin/python benchmarks/class_start.py [--students 200] [--runs whole,mig]
        [--hubs ours,plain | ours,ldap[,ldap-blocking]] [--out benchmarks/results/<date>-class-start.md]
        [--follow-seconds 150] [--hub-logs DIR]

200 students, both runs, both hubs: about 15 to 25 minutes on the 2-core host. Each of the four
hubs takes about 15 s to start and make the accounts, then the login phase (plain JupyterHub
checks one bcrypt password at a time: about 1 to 1.5 minutes for 200), then up to
``--follow-seconds`` (150 s) after the last Start for the stragglers, then up to 30 s to stop.
A request waits at most 300 s for its answer. It loads the machine fully; run it on a quiet host.
``--runs whole --hubs ours,ldap,ldap-blocking`` with 200 students: about 3.5 minutes (results in
``benchmarks/results/2026-12-07-class-start-ldap.md``; ``benchmarks/directory_login_lag.py`` shows
why the LDAP hub's loop lags, without a hub).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import html
import json
import os
import platform
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlparse

from class_start_directory import (
    COURSE,
    DIRECTORY_HUBS,
    CpuSampler,
    LoginCosts,
    course_members,
    enroll,
    hub_env,
    measure_login_costs,
    set_course_quota,
    slapd_pid,
    start_directory,
)

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
PLAIN_CONFIG = HERE.parent / "plain_class_start_config.py"
PASSWORD = "correct-horse-battery-staple"
LAYOUTS = {"whole": "8", "mig": "8xH200-141GB:mig=7x1g.18gb"}
HUBS = ("ours", "ldap", "ldap-blocking", "plain")
OURS = ("ours", "ldap", "ldap-blocking")  # our hub, with NativeAuthenticator, ours for LDAP, or the stock one
TARGETED = ("ours", "ldap")  # the hubs the targets are for
TIMEOUT = 300  # a single request; plain JupyterHub stalls ~1 minute under the logins
PROBE_TIMEOUT = 120
IN_LINE = ("ahead of you", "next in line", "ahead of yours")  # "ahead of you" also matches "ahead of yours"
STEPS = (
    ("login page", "GET /hub/login"),
    ("login", "POST /hub/login"),
    ("home", "GET /hub/home"),
    ("spawn form", "GET /hub/spawn"),
    ("start", "POST /hub/spawn (Start)"),
    ("pending page", "GET /hub/spawn-pending"),
    ("progress", "progress stream, to its headers"),
)
NAVIGATE = {"Sec-Fetch-Mode": "navigate", "Sec-Fetch-Site": "same-origin", "Sec-Fetch-Dest": "document"}
EVENT_SOURCE = {"Accept": "text/event-stream", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Site": "same-origin"}


# -- the probe (a separate process, so the students' threads here do not delay it) ------------------


def probe(url: str, interval: float) -> None:
    """GET url every `interval` s until stdin closes; print JSON {"samples": [[sent, latency s or null], ...]}.

    `sent` is time.monotonic() (the same clock in every process on Linux). Open loop, as in
    hub_responsiveness.py: each request at its slot on its own connection.
    """
    import http.client

    u = urlparse(url)
    stop = threading.Event()
    samples: list[list[float | None]] = []

    def wait_for_eof() -> None:
        sys.stdin.read()
        stop.set()

    def one(slot: float) -> None:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=PROBE_TIMEOUT)
        try:
            conn.request("GET", u.path)
            r = conn.getresponse()
            r.read()
            latency = time.monotonic() - slot if r.status == 200 else None
        except (OSError, http.client.HTTPException):
            latency = None
        finally:
            conn.close()
        samples.append([slot, latency])

    threading.Thread(target=wait_for_eof, daemon=True).start()
    with ThreadPoolExecutor(max_workers=1024) as pool:
        slot = time.monotonic()
        while not stop.is_set():
            pool.submit(one, slot)
            slot += interval
            delay = slot - time.monotonic()
            if delay > 0:
                stop.wait(delay)
    samples.sort()
    json.dump({"samples": samples}, sys.stdout)


# -- a student ------------------------------------------------------------------------------------


class FormFields(HTMLParser):
    """What a browser sends from the form ``form_id``: inputs with their values, each select's selected
    (else first) option, checked radios and checkboxes. ``options`` keeps each select's values."""

    def __init__(self, form_id: str = "spawn_form"):
        super().__init__()
        self.form_id = form_id
        self.inside = False
        self.fields: dict[str, str] = {}
        self.options: dict[str, list[str]] = {}
        self._select: str | None = None
        self._chosen: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: (v or "") for k, v in attrs}
        if tag == "form" and a.get("id") == self.form_id:
            self.inside = True
        if not self.inside:
            return
        name = a.get("name")
        if tag == "input" and name:
            kind = a.get("type", "text").lower()
            if kind in ("submit", "button", "image", "file", "reset"):
                return
            if kind in ("radio", "checkbox"):
                if "checked" in a:
                    self.fields[name] = a.get("value", "on")
            else:
                self.fields[name] = a.get("value", "")
        elif tag == "select" and name:
            self._select = name
            self.options[name] = []
        elif tag == "option" and self._select:
            value = a.get("value", "")
            self.options[self._select].append(value)
            if "selected" in a:
                self.fields[self._select] = value
                self._chosen.add(self._select)

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self.inside = False
        elif tag == "select" and self._select:
            if self._select not in self._chosen and self.options[self._select]:
                self.fields[self._select] = self.options[self._select][0]
            self._select = None


def read_form(page: str) -> FormFields:
    parser = FormFields()
    parser.feed(page)
    return parser


def xsrf(session) -> str:
    """The session's ``_xsrf`` cookie (the last one set, whatever its path)."""
    value = ""
    for cookie in session.cookies:
        if cookie.name == "_xsrf":
            value = cookie.value
    return value


def place_in_line(message: str) -> tuple[str, int] | None:
    """("GPU line" or "start line", people ahead) from a progress message that gives a place, else None."""
    text = message.lower()
    if not any(phrase in text for phrase in IN_LINE):
        return None
    line = "start line" if "ahead of yours" in text else "GPU line"
    if "next in line" in text:
        return line, 0
    match = re.search(r"(\d+)\s+(?:[a-z]+\s+)?ahead of you", text)
    return line, int(match.group(1)) if match else -1


@dataclass
class Student:
    name: str
    url: str
    layout: str
    follow_seconds: float
    steps: dict[str, tuple[float, int | None]] = field(default_factory=dict)  # step -> (seconds, status)
    statuses: list[int] = field(default_factory=list)  # every response, progress streams included
    errors: list[str] = field(default_factory=list)
    login_done: float | None = None
    pressed_start: float | None = None
    outcome: str = "not started"
    outcome_at: float | None = None
    place: tuple[str, int] | None = None
    message: str = ""
    sent: dict[str, str] = field(default_factory=dict)

    def step(self, name: str, method: str, path: str, **kwargs):
        """One request, timed; None when it raised (counted as an error)."""
        import requests

        t = time.monotonic()
        try:
            r = self.session.request(method, path if "://" in path else self.url + path, timeout=TIMEOUT, **kwargs)
        except requests.RequestException as exc:  # refused, reset, timed out
            self.steps[name] = (time.monotonic() - t, None)
            self.errors.append(f"{name}: {type(exc).__name__}")
            return None
        self.steps[name] = (time.monotonic() - t, r.status_code)
        self.statuses.append(r.status_code)
        return r

    def done(self, outcome: str, message: str = "") -> None:
        self.outcome, self.outcome_at, self.message = outcome, time.monotonic(), message

    def run(self, go: threading.Event) -> None:
        import requests

        self.session = requests.Session()
        go.wait()
        try:
            self._run()
        except Exception as exc:  # noqa: BLE001 - a student's thread: one surprise is counted, the run goes on
            self.errors.append(f"{self.outcome}: {type(exc).__name__}: {exc}")
            self.done("error", str(exc)[:200])
        finally:
            self.session.close()

    def _run(self) -> None:
        r = self.step("login page", "GET", "/hub/login", headers=NAVIGATE, allow_redirects=False)
        if r is None or r.status_code != 200:
            return self.done("login failed", f"login page {r.status_code if r is not None else 'error'}")
        data = {"username": self.name, "password": PASSWORD, "_xsrf": xsrf(self.session)}
        r = self.step("login", "POST", "/hub/login", data=data, headers=NAVIGATE, allow_redirects=False)
        self.login_done = time.monotonic()
        if r is None or r.status_code != 302:
            return self.done("login failed", f"login {r.status_code if r is not None else 'error'}")
        r = self.step("home", "GET", "/hub/home", headers=NAVIGATE, allow_redirects=False)
        if r is None or r.status_code != 200:
            return self.done("error", f"home {r.status_code if r is not None else 'error'}")
        r = self.step("spawn form", "GET", "/hub/spawn", headers=NAVIGATE, allow_redirects=False)
        if r is None or r.status_code != 200:
            return self.done("error", f"spawn form {r.status_code if r is not None else 'error'}")
        form = read_form(r.text)
        fields = dict(form.fields)
        if "gpus" in fields:
            fields["gpus"] = "1"
        if self.layout == "mig" and "gpus" in fields:
            slices = [v for v in form.options.get("gpu_profile", []) if v]
            if not slices:
                return self.done("error", "the spawn form offers no MIG slice (no gpu_profile option)")
            fields["gpu_profile"] = slices[0]
        self.sent = {k: v for k, v in fields.items() if v}
        fields["_xsrf"] = xsrf(self.session)
        self.pressed_start = time.monotonic()
        r = self.step(
            "start",
            "POST",
            "/hub/spawn",
            files={k: (None, v) for k, v in fields.items()},
            headers=NAVIGATE,
            allow_redirects=False,
        )
        if r is None:
            return self.done("error", "Start: no answer")
        location = r.headers.get("Location", "")
        if r.status_code != 302:
            error = re.search(r'class="spawn-error-msg[^"]*">(.*?)</p>', r.text, re.S)
            return self.done(f"refused {r.status_code}", html.unescape(error.group(1)).strip() if error else "")
        progress = f"/hub/api/users/{self.name}/server/progress"
        if "spawn-pending" in location:
            r = self.step("pending page", "GET", location, headers=NAVIGATE, allow_redirects=False)
            if r is not None and r.status_code == 200:
                found = re.search(r'new EventSource\("([^"]+)"\)', r.text)
                if found:
                    progress = html.unescape(found.group(1))
            elif r is not None and r.status_code == 302 and "/user/" in r.headers.get("Location", ""):
                return self.done("served", "ready before the pending page")
        elif "/user/" in location:
            return self.done("served", "ready within Start")
        if "_xsrf=" not in progress:
            progress += f"?_xsrf={xsrf(self.session)}"
        self._follow(progress)

    def _follow(self, progress: str) -> None:
        import requests

        deadline = self.pressed_start + self.follow_seconds
        first = True
        while time.monotonic() < deadline:
            r = None
            try:
                if first:
                    r = self.step("progress", "GET", progress, headers=EVENT_SOURCE, stream=True)
                    first = False
                else:
                    r = self.session.get(self.url + progress, headers=EVENT_SOURCE, stream=True, timeout=(30, 30))
                    self.statuses.append(r.status_code)
                if r is None:  # no answer: try again, as EventSource does after a network error
                    time.sleep(1.0)
                    continue
                if r.status_code != 200:  # EventSource gives up on an answer that is not 200
                    detail = "not starting" if r.status_code == 400 else r.reason
                    return self.done(f"progress {r.status_code}", f"progress stream: {r.status_code} {detail}")
                for line in r.iter_lines(decode_unicode=True):
                    if line and line.startswith("data:"):
                        event = json.loads(line[5:])
                        message = event.get("message", "")
                        self.message = message
                        if event.get("ready"):
                            return self.done("served", message)
                        if event.get("failed"):
                            return self.done("spawn failed", message)
                        place = place_in_line(message)
                        if place is not None:
                            self.place = place
                            return self.done("in line", message)
                    if time.monotonic() > deadline:
                        break
            except (
                requests.RequestException,
                ValueError,
            ) as exc:  # a broken stream or event: reconnect, as EventSource does
                self.errors.append(f"progress: {type(exc).__name__}")
            finally:
                if r is not None:
                    r.close()
            time.sleep(1.0)  # EventSource reconnects after the stream ends
        self.done("no answer in time", self.message)


# -- one hub, one class start ---------------------------------------------------------------------


def spec_of(layout: str, args) -> str:
    return args.gpus if layout == "whole" else LAYOUTS[layout]


def units(spec: str) -> int:
    """What the spec offers to allocate: whole GPUs, or MIG slices."""
    from workbench_devices.inventory import parse_simulated_spec

    return len(parse_simulated_spec(spec))


def seed_students(hub, names: list[str]) -> None:
    """Authorized NativeAuthenticator sign-ups with one bcrypt hash (cost 12), and their hub users."""
    import bcrypt

    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(12))
    db = sqlite3.connect(hub.data_dir / "jupyterhub.sqlite", timeout=60)
    try:
        with db:
            db.executemany(
                "INSERT INTO users_info (username, password, is_authorized, login_email_sent, email, has_2fa, "
                "otp_secret) VALUES (?, ?, 1, 0, NULL, 0, ?)",
                [(name, hashed, base64.b32encode(os.urandom(10)).decode()) for name in names],
            )
    finally:
        db.close()
    for i in range(0, len(names), 100):
        hub.create_users(*names[i : i + 100])


def servers_ready(hub) -> int:
    count, offset = 0, 0
    while True:
        r = hub.api("GET", f"/users?state=ready&offset={offset}&limit=200")
        if r.status_code != 200:
            return -1
        page = r.json()
        count += len(page)
        if len(page) < 200:
            return count
        offset += 200


LOOP_LINE = re.compile(
    r"\[\w (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) .*Event loop was unresponsive for at least ([\d.]+)s"
)


def unresponsive(log: str) -> list[tuple[float, float]]:
    """(wall time, seconds) of each "Event loop was unresponsive" line in the hub log."""
    found = []
    for m in LOOP_LINE.finditer(log):
        when = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()
        found.append((when, float(m.group(2))))
    return found


def left_behind(data_dir: Path) -> list[tuple[int, str]]:
    """Live processes of this hub: hub_responsiveness.caused_by (environment, cwd), or the data dir in the command."""
    from hub_responsiveness import caused_by

    found = dict(caused_by(data_dir))
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid() or int(entry.name) in found:
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            state = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state != b"Z" and str(data_dir) in cmd:
            found[int(entry.name)] = cmd[:120]
    return sorted(found.items())


def shut_down(hub, data_dir: Path) -> str:
    """Stop the hub (as Ctrl-C), then every process it left (servers outlive it on purpose): TERM, then KILL."""
    try:
        hub.stop()
    except (OSError, subprocess.SubprocessError) as exc:  # already gone, or would not stop: the sweep still runs
        print(f"stopping the hub: {exc}", file=sys.stderr)
    pid_file = data_dir / "jupyterhub-proxy.pid"
    if pid_file.exists():
        with contextlib.suppress(ValueError, ProcessLookupError):
            os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = left_behind(data_dir)
        for pid, _ in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 10
        while left and time.monotonic() < deadline:
            time.sleep(0.3)
            left = left_behind(data_dir)
        if not left:
            return "no process of this hub left"
    return f"STILL RUNNING: {left}"


@dataclass
class Result:
    hub: str
    layout: str
    students: list[Student]
    t0: float  # monotonic at the class start
    wall0: float  # time.time() at the class start
    logins_end: float
    end: float
    samples: list[list[float | None]]
    loop_lines: list[tuple[float, float]]
    ready: int
    spawn_limit: int | None
    wall_seconds: float
    cleanup: str
    cpu_hub: float = float("nan")  # CPU seconds of the hub process during the login phase
    cpu_directory: float | None = None  # ... of slapd (directory hubs)
    course_members: int | None = None  # hub users in the course's group at the end (directory hubs)
    enroll_seconds: float | None = None  # adding the class to the directory
    costs: LoginCosts | None = None  # one login alone (the first directory hub of the invocation)


def class_start(hub_kind: str, layout: str, args, tmp: Path) -> Result:
    from tests.conftest import Hub

    spec = spec_of(layout, args)
    limit = units(spec)
    data_dir = tmp / f"{hub_kind}-{layout}"
    data_dir.mkdir()
    names = [f"student{i:03d}" for i in range(1, args.students + 1)]
    started = time.monotonic()
    directory = None
    enroll_seconds: float | None = None
    costs: LoginCosts | None = None
    # The queue timeout outlasts the run: students stay in line until the end.
    ours_env = {"WORKBENCH_SIMULATED_GPUS": spec, "WORKBENCH_QUEUE_TIMEOUT": "900"}
    if hub_kind in DIRECTORY_HUBS:
        directory = start_directory(tmp / f"slapd-{hub_kind}-{layout}")
        enroll_seconds = enroll(directory, names, PASSWORD)
        if not args.measured_costs:
            costs = args.measured_costs = measure_login_costs(directory, names, PASSWORD)
        hub = Hub(data_dir, {**ours_env, **hub_env(directory, hub_kind)}, [])
    elif hub_kind == "ours":
        hub = Hub(data_dir, ours_env, [])
    else:
        hub = Hub(data_dir, {}, [f"--JupyterHub.concurrent_spawn_limit={limit}"], config_file=PLAIN_CONFIG)
    probe_proc: subprocess.Popen | None = None
    sampler: CpuSampler | None = None
    students: list[Student] = []
    threads: list[threading.Thread] = []
    members: int | None = None
    try:
        hub.start()
        if directory is None:
            seed_students(hub, names)
        else:
            # Students who used the hub before, as on the other hubs; their passwords are the directory's.
            for i in range(0, len(names), 100):
                hub.create_users(*names[i : i + 100])
            set_course_quota(hub)
        import requests

        for _ in range(10):
            requests.get(f"{hub.url}/hub/api/", timeout=10)
        print(f"{hub_kind}/{layout}: hub up, {len(names)} students made; class starts", flush=True)
        go = threading.Event()
        students = [Student(n, hub.url, layout, args.follow_seconds) for n in names]
        threads = [threading.Thread(target=s.run, args=(go,), daemon=True) for s in students]
        for t in threads:
            t.start()
        probe_proc = subprocess.Popen(
            [sys.executable, str(HERE), "--probe", f"{hub.url}/hub/api/", str(args.probe_interval)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert hub.proc is not None
        sampler = CpuSampler({"hub": hub.proc.pid, "directory": slapd_pid(directory) if directory else None}).start()
        time.sleep(2.0)  # the probe's first samples: the idle hub
        t0, wall0 = time.monotonic(), time.time()
        go.set()
        for t in threads:
            t.join(timeout=max(1.0, t0 + TIMEOUT + args.follow_seconds + 60 - time.monotonic()))
        end = time.monotonic()
        sampler.stop()
        if directory is not None:
            members = course_members(hub)
        out, _ = probe_proc.communicate(timeout=PROBE_TIMEOUT + 60)
        probe_proc = None
        samples = json.loads(out)["samples"]
        ready = servers_ready(hub)
        if args.hub_logs:
            args.hub_logs.mkdir(parents=True, exist_ok=True)
            shutil.copy(hub.log_path, args.hub_logs / f"{hub_kind}-{layout}.log")
        loop_lines = unresponsive(hub.log())
    finally:
        if probe_proc is not None:
            probe_proc.kill()
            probe_proc.wait()
        if sampler is not None:
            sampler.stop()
        cleanup = shut_down(hub, data_dir)
        if directory is not None:
            directory.stop()
        print(f"{hub_kind}/{layout}: cleanup: {cleanup}", flush=True)
    logins = [s.login_done for s in students if s.login_done is not None]
    logins_end = max(logins) if logins else t0
    return Result(
        hub=hub_kind,
        layout=layout,
        students=students,
        t0=t0,
        wall0=wall0,
        logins_end=logins_end,
        end=end,
        samples=samples,
        loop_lines=loop_lines,
        ready=ready,
        spawn_limit=None if hub_kind in OURS else limit,
        wall_seconds=time.monotonic() - started,
        cleanup=cleanup,
        cpu_hub=sampler.used("hub", t0, logins_end) if sampler is not None else float("nan"),
        cpu_directory=sampler.used("directory", t0, logins_end) if sampler and directory else None,
        course_members=members,
        enroll_seconds=enroll_seconds,
        costs=costs,
    )


# -- the report -----------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    from hub_responsiveness import percentile as nearest_rank

    return nearest_rank(values, q) if values else float("nan")


def secs(x: float) -> str:
    if x != x:  # nan
        return "-"
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s"


def p50_p95(values: list[float]) -> str:
    return f"{secs(percentile(values, 50))} / {secs(percentile(values, 95))}" if values else "-"


class Figures:
    """What the report says about one Result."""

    def __init__(self, r: Result):
        self.r = r
        st = r.students
        self.n = len(st)
        self.step = {
            name: [s.steps[name][0] for s in st if name in s.steps and s.steps[name][1] is not None]
            for name, _ in STEPS
        }
        codes = [c for s in st for c in s.statuses]
        self.n429 = sum(1 for c in codes if c == 429)
        self.n5xx = sum(1 for c in codes if c >= 500)
        self.errors = sum(len(s.errors) for s in st)
        self.outcomes: dict[str, int] = {}
        for s in st:
            self.outcomes[s.outcome] = self.outcomes.get(s.outcome, 0) + 1
        reached = [s for s in st if s.outcome in ("served", "in line") and s.pressed_start is not None]
        self.to_outcome = [s.outcome_at - s.pressed_start for s in reached]
        self.within_60 = sum(1 for x in self.to_outcome if x <= 60)
        self.all_reached = len(reached) == self.n
        self.until_all = max(s.outcome_at for s in reached) - r.t0 if reached else float("nan")
        pressed = [s.pressed_start - r.t0 for s in st if s.pressed_start is not None]
        self.pressed = f"{secs(min(pressed))} / {secs(max(pressed))}" if pressed else "-"
        self.lines: dict[str, list[int]] = {}
        for s in st:
            if s.place is not None:
                self.lines.setdefault(s.place[0], []).append(s.place[1])
        self.login_window = r.logins_end - r.t0
        self.lag_login = [lat for t, lat in r.samples if lat is not None and r.t0 <= t <= r.logins_end]
        self.lag_all = [lat for t, lat in r.samples if lat is not None and r.t0 <= t <= r.end]
        self.probe_failed = sum(1 for t, lat in r.samples if lat is None and r.t0 <= t <= r.end)
        self.probe_idle = [lat for t, lat in r.samples if lat is not None and t < r.t0]
        wall_login_end = r.wall0 + self.login_window
        wall_end = r.wall0 + (r.end - r.t0)
        self.loop_login = [d for w, d in r.loop_lines if r.wall0 <= w <= wall_login_end + 1]
        self.loop_all = [d for w, d in r.loop_lines if r.wall0 <= w <= wall_end + 1]
        messages: dict[str, int] = {}
        for s in st:
            if s.outcome not in ("served", "in line") and s.message:
                # One line per kind of message: a student's name and a port vary.
                text = re.sub(r"student\d+", "<student>", re.sub(r":\d{4,5}\b", ":<port>", s.message[:200]))
                key = f"{s.outcome}: {text}"
                messages[key] = messages.get(key, 0) + 1
        self.messages = sorted(messages.items(), key=lambda kv: -kv[1])[:5]
        placing: dict[str, int] = {}
        for s in st:
            if s.outcome == "in line":
                key = re.sub(r"\b\d+\b", "N", s.message[:200])
                placing[key] = placing.get(key, 0) + 1
        self.placing = sorted(placing.items(), key=lambda kv: -kv[1])
        self.sent = next((s.sent for s in st if s.sent), {})

    def places(self) -> str:
        if not self.lines:
            return "-"
        parts = []
        for line, values in sorted(self.lines.items()):
            distinct = len(set(values))
            verdict = "all distinct" if distinct == len(values) else "REPEATS"
            parts.append(
                f"{line}: {distinct} distinct of {len(values)} ({verdict}), {min(values)} to {max(values)} ahead"
            )
        return "; ".join(parts)

    def cpu(self, seconds: float | None) -> str:
        """CPU seconds in the login phase, and their share of what the host's cores had in that time."""
        if seconds is None or seconds != seconds or self.login_window <= 0:
            return "-"
        share = seconds / (self.login_window * (os.cpu_count() or 1))
        return f"{seconds:.1f} s ({share:.0%})"

    def lag(self, values: list[float]) -> str:
        if not values:
            return "-"
        return f"{secs(percentile(values, 50))} / {secs(percentile(values, 95))} / {secs(max(values))}"


def table(run: str, spec: str, figures: dict[str, Figures], students: int) -> str:
    hubs = list(figures)
    head = "| measure | " + " | ".join(hub_title(h, figures[h]) for h in hubs) + " |"
    rows = [head, "| --- |" + " --- |" * len(hubs)]

    def row(label: str, fn) -> None:
        rows.append(f"| {label} | " + " | ".join(fn(figures[h]) for h in hubs) + " |")

    for name, label in STEPS:
        row(f"{label}, p50 / p95", lambda f, name=name: p50_p95(f.step[name]))
    row("429 answers (any request)", lambda f: str(f.n429))
    row("5xx answers (any request)", lambda f: str(f.n5xx))
    row("request errors (no answer, broken stream)", lambda f: str(f.errors))
    row("outcomes", lambda f: ", ".join(f"{k} {v}" for k, v in sorted(f.outcomes.items(), key=lambda kv: -kv[1])))
    row(
        "Start -> served or in line, p50 / p95 / max",
        lambda f: f.lag(f.to_outcome) + f" ({len(f.to_outcome)} students)",
    )
    row("served or in line within 60 s of Start", lambda f: f"{f.within_60} of {f.n}")
    row(
        "class start -> every student served or in line",
        lambda f: secs(f.until_all) if f.all_reached else f"not all ({f.n - len(f.to_outcome)} never)",
    )
    row("Start pressed, first / last, after the class start", lambda f: f.pressed)
    row("places in line", lambda f: f.places())
    row("login phase (class start -> last login answered)", lambda f: secs(f.login_window))
    row("hub loop lag during logins, p50 / p95 / max", lambda f: f.lag(f.lag_login) + f" ({len(f.lag_login)} probes)")
    row("hub loop lag, whole class start, p50 / p95 / max", lambda f: f.lag(f.lag_all))
    row("hub loop lag idle (2 s before), p50", lambda f: secs(percentile(f.probe_idle, 50)))
    row("hub process CPU in the login phase (share of the cores)", lambda f: f.cpu(f.r.cpu_hub))
    if any(figures[h].r.cpu_directory is not None for h in hubs):
        row("directory (slapd) CPU in the login phase", lambda f: f.cpu(f.r.cpu_directory))
        row(
            f"class in the directory's {COURSE} (added in one ldapmodify)",
            lambda f: f"{f.n} people, {f.r.enroll_seconds:.2f} s" if f.r.enroll_seconds is not None else "-",
        )
        row(
            f"hub users in the hub group {COURSE} at the end",
            lambda f: "-" if f.r.course_members is None else f"{f.r.course_members} of {f.n}",
        )
    row("probes unanswered (or not 200) in the class start", lambda f: str(f.probe_failed))
    row(
        '"Event loop was unresponsive" lines during logins (max)',
        lambda f: f"{len(f.loop_login)}" + (f" ({max(f.loop_login):.2f} s)" if f.loop_login else ""),
    )
    row(
        '"Event loop was unresponsive" lines, whole class start (max)',
        lambda f: f"{len(f.loop_all)}" + (f" ({max(f.loop_all):.2f} s)" if f.loop_all else ""),
    )
    row("servers ready at the end", lambda f: str(f.r.ready))
    row("form fields sent", lambda f: " ".join(f"{k}={v}" for k, v in f.sent.items()) or "-")
    row("hub's wall time (start, accounts, class, stop)", lambda f: f"{f.r.wall_seconds:.0f} s")
    row("cleanup", lambda f: f.r.cleanup)
    out = [f"### {run}: `WORKBENCH_SIMULATED_GPUS={spec}` ({units(spec)} to hand out), {students} students", "", *rows]
    for h in hubs:
        if figures[h].placing:
            out += ["", f"{hub_title(h, figures[h])}, the message that gave each student in line a place:"]
            out += [f"* {count} x {msg}" for msg, count in figures[h].placing]
        if figures[h].messages:
            out += ["", f"{hub_title(h, figures[h])}, students neither served nor in line, by message:"]
            out += [f"* {count} x {msg}" for msg, count in figures[h].messages]
    for h in hubs:
        if h in TARGETED:
            out += ["", targets(figures[h], figures.get("plain"), h)]
    if "ldap-blocking" in figures:
        blocking95 = secs(percentile(figures["ldap-blocking"].lag_login, 95))
        out += ["", f"(stock LDAPAuthenticator's loop lag p95 during the logins: {blocking95}; no target.)"]
    return "\n".join(out)


def hub_title(hub: str, f: Figures) -> str:
    if hub == "ours":
        return "our hub (`make run` config)"
    if hub == "ldap":
        return "our hub, LDAP (`WORKBENCH_AUTHENTICATOR=ldap`)"
    if hub == "ldap-blocking":
        return "our hub, stock LDAPAuthenticator"
    return f"plain JupyterHub 6.1.1 (limit {f.r.spawn_limit})"


def targets(ours: Figures, plain: Figures | None, hub: str = "ours") -> str:
    lag95 = percentile(ours.lag_login, 95)
    checks = [
        ("0 x 429", ours.n429 == 0, str(ours.n429)),
        ("0 x 5xx", ours.n5xx == 0, str(ours.n5xx)),
        (
            "every student served or in line within 60 s of Start",
            ours.within_60 == ours.n,
            f"{ours.within_60} of {ours.n}",
        ),
        ("hub loop lag p95 < 250 ms during the logins", lag95 < 0.25, secs(lag95)),
    ]
    if plain is not None:
        ours50, plain50 = percentile(ours.step["spawn form"], 50), percentile(plain.step["spawn form"], 50)
        checks.append(
            (
                "spawn form p50 <= 1.5 x plain's",
                ours50 <= 1.5 * plain50,
                f"{secs(ours50)} vs {secs(plain50)} ({ours50 / plain50:.2f} x)",
            )
        )
        plain95 = percentile(plain.lag_login, 95)
        checks.append(("(plain JupyterHub's loop lag p95 during logins, issue: over 20 s)", None, secs(plain95)))
    lines = [f"| target ({hub_title(hub, ours)}) | result | |", "| --- | --- | --- |"]
    for label, ok, value in checks:
        verdict = "" if ok is None else ("met" if ok else "**NOT met**")
        lines.append(f"| {label} | {value} | {verdict} |")
    return "\n".join(lines)


def machine() -> str:
    cpu = ""
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
        mem = f", {kb / 1024 / 1024:.0f} GiB memory"
    except (OSError, IndexError, ValueError):
        pass
    return f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores{', ' + cpu if cpu else ''}{mem})"


def versions(directory: bool = False) -> str:
    from importlib.metadata import version

    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain"], capture_output=True, text=True)
    ldap = ""
    if directory:
        slapd = subprocess.run(["slapd", "-VV"], capture_output=True, text=True, env=sbin_path())
        found = re.search(r"slapd ([\w.+~-]+)", slapd.stderr + slapd.stdout)
        ldap = (
            f"jupyterhub-ldapauthenticator {version('jupyterhub-ldapauthenticator')}, ldap3 {version('ldap3')}, "
            f"OpenLDAP slapd {found.group(1) if found else '?'}, "
        )
    return (
        f"Python {platform.python_version()}, JupyterHub {version('jupyterhub')}, "
        f"NativeAuthenticator {version('jupyterhub-nativeauthenticator')}, bcrypt {version('bcrypt')}, {ldap}"
        f"configurable-http-proxy from node_modules; checkout {commit.stdout.strip() or '?'}"
        f"{' (with uncommitted changes)' if dirty.stdout.strip() else ''}"
    )


def sbin_path() -> dict[str, str]:
    """The environment with /usr/sbin and /sbin on PATH (slapd is not on an ordinary account's)."""
    return {**os.environ, "PATH": f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"}


def login_costs(c: LoginCosts) -> str:
    """The report's lines on what one login costs alone, measured before the timed part."""
    cores = os.cpu_count() or 1
    return "\n".join(
        [
            f"One login alone, before the timed part (p50 of {c.count} in a row, nothing else running; "
            "what the hub's own code does, outside the hub):",
            "",
            "| one login | wall | CPU of the client (the hub's process) | CPU of slapd |",
            "| --- | --- | --- | --- |",
            f"| directory, StartTLS: service-account search, then the student's bind, then the group search "
            f"(what each directory login worker does) | {secs(c.ldap_tls)} | {secs(c.ldap_tls_cpu)} "
            f"| {secs(c.slapd_cpu)} |",
            f"| the same without TLS (`WORKBENCH_LDAP_STARTTLS=0`, loopback only) | {secs(c.ldap_plain)} "
            f"| {secs(c.ldap_plain_cpu)} | - |",
            f"| one bcrypt check at NativeAuthenticator's cost 12 | {secs(c.bcrypt)} | (the same) | - |",
            "",
            f"Groups the directory gave the first student: {', '.join(c.groups) or 'none'}. Workers: "
            f"NativeAuthenticator's bcrypt pool has {cores} threads (one per core, nice +10); the LDAP login runs in "
            "WorkbenchLDAPAuthenticator's worker processes (`login_processes`, default 1, nice +10; "
            "hub/workbench_hub/directory_workers.py).",
        ]
    )


def interrupted(signum, frame) -> None:
    raise KeyboardInterrupt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=200)
    parser.add_argument("--runs", default="whole,mig", help="comma list of whole, mig")
    parser.add_argument("--hubs", default="ours,plain", help="comma list of ours, plain (run in that order)")
    parser.add_argument("--gpus", default="8", help="WORKBENCH_SIMULATED_GPUS of the whole run (default 8)")
    parser.add_argument("--out", type=Path, help="append the markdown report to this file")
    parser.add_argument(
        "--follow-seconds", type=float, default=150.0, help="how long after Start a student watches the stream"
    )
    parser.add_argument("--probe-interval", type=float, default=0.1, help="seconds between GET /hub/api/ probes")
    parser.add_argument("--hub-logs", type=Path, help="copy each hub's log into this folder")
    args = parser.parse_args()
    args.measured_costs = None  # one login alone: measured with the first directory hub (class_start)
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    hubs = [h.strip() for h in args.hubs.split(",") if h.strip()]
    if args.students < 1 or not runs or not hubs:
        parser.error("--students must be positive, --runs and --hubs not empty")
    if unknown := [r for r in runs if r not in LAYOUTS] + [h for h in hubs if h not in HUBS]:
        parser.error(f"unknown: {', '.join(unknown)} (runs: {', '.join(LAYOUTS)}; hubs: {', '.join(HUBS)})")

    sys.path.insert(0, str(REPO))
    signal.signal(signal.SIGTERM, interrupted)
    date = datetime.now().strftime("%Y-%m-%d %H:%M")
    command = shlex.join([".venv/bin/python", "benchmarks/class_start.py", *sys.argv[1:]])
    load_before = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    began = time.monotonic()
    sections = []
    with tempfile.TemporaryDirectory(prefix="class-start-") as tmp:
        for run in runs:
            figures = {}
            for hub_kind in hubs:
                figures[hub_kind] = Figures(class_start(hub_kind, run, args, Path(tmp)))
            sections.append(table(run, spec_of(run, args), figures, args.students))
            print("\n" + sections[-1] + "\n", flush=True)
    if args.measured_costs is not None:
        sections.append(login_costs(args.measured_costs))
    directory = any(h in DIRECTORY_HUBS for h in hubs)
    order = ", then ".join(hubs)
    report = "\n".join(
        [
            f"## Class start, {args.students} students ({date})",
            "",
            f"* Machine: {machine()}; load average before {load_before}.",
            f"* Versions: {versions(directory)}.",
            f"* Command: `{command}`; wall time {time.monotonic() - began:.0f} s.",
            f"* Each hub alone on the machine, in this order: {order}; the students' threads and the probe run on "
            "the same host" + (", and so does the directory (slapd)." if directory else "."),
            "",
            *[s + "\n" for s in sections],
        ]
    )
    if args.out:
        with open(args.out, "a") as fh:
            fh.write(report + "\n")
        print(f"appended to {args.out}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--probe":
        probe(sys.argv[2], float(sys.argv[3]))
    else:
        main()
