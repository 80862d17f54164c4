"""Hub responsiveness: `GET /hub/api/` latency while a course lab spawns at once, against an idle hub.

One real hub (the `make run` config, local backend, `WORKBENCH_SIMULATED_GPUS=4`, a queue timeout
longer than the run). A separate probe process asks `GET /hub/api/` through the public proxy URL,
unauthenticated (JupyterHub answers with its version), at a fixed rate (every 50 ms) for a fixed
window in two phases of the same hub process:

1. **idle**: users created, nobody spawning;
2. **load**: N users (default 30) POST `/hub/api/users/<u>/server` with `{"gpus": 1}` all at once
   (admin token, a thread pool): 4 get a GPU and start, the rest wait in the GPU queue for the
   whole window, re-checking the database every `gpu_queue_recheck_interval`. A third of them
   render the spawn form (`GET /hub/spawn/<u>` with a logged-in cookie) just before their POST, as
   a student does, and a third read their progress stream (`/hub/api/users/<u>/server/progress`)
   for the rest of the window, as the spawn-pending page does.

Idle first, then load, rather than interleaved rounds: the load is one burst followed by a long
wait in line (which is the course-lab case), and a round would need all N servers stopped and the
queue emptied in between, which is itself a load (N stops, N lease releases) that the idle rounds
would then measure. Machine load is printed before and after each phase instead.

Prints p50/p95 of both phases, the ratios p95_load/p95_idle and p50_load/p50_idle (target: at most
2), and the load phase split into the spawn burst (the first 10 s) and the wait after it.

    .venv/bin/python benchmarks/hub_responsiveness.py [--servers standin|real] [--users 30] [--seconds 25]

`--servers standin` (default) runs a tiny HTTP server from this file as each user server (it
answers 200 on every path), so the figure isolates the hub; `--servers real` runs the local
backend's default command, jupyterhub-singleuser, so 4 JupyterLabs starting on the same cores are
part of the figure. At the end every server and the hub are stopped, and the script checks that no
process it caused is left (it finds them by the private data dir in their environment or cwd).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve()
PASSWORD = "correct-horse-battery-staple"
BURST_SECONDS = 10.0


# -- the stand-in user server (runs as the hub's Spawner.cmd) -----------------------------------


def standin_server() -> None:
    """Answer 200 on every path, on the port the hub gave in JUPYTERHUB_SERVICE_URL."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import urlparse

    url = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            body = b'{"version": "standin"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _answer

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer((url.hostname or "127.0.0.1", url.port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


# -- the probe (a separate process, so the spawning threads here do not delay it) ---------------


def probe(url: str, seconds: float, interval: float) -> None:
    """GET url every `interval` s for `seconds`; print JSON {"samples": [[offset, latency s or null], ...]}.

    Open loop: each request is sent at its slot on its own connection, whether or not earlier ones
    have been answered (as many browsers would), so a stall of the hub shows as every request sent
    during it being slow, not as one slow sample followed by a gap.
    """
    import http.client
    from concurrent.futures import ThreadPoolExecutor
    from urllib.parse import urlparse

    u = urlparse(url)
    samples: list[list[float | None]] = []
    t0 = time.perf_counter()

    def one(slot_time: float) -> None:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        try:
            conn.request("GET", u.path)
            r = conn.getresponse()
            r.read()
            latency = time.perf_counter() - t0 - slot_time if r.status == 200 else None
        except (OSError, http.client.HTTPException):
            latency = None
        finally:
            conn.close()
        samples.append([slot_time, latency])

    with ThreadPoolExecutor(max_workers=256) as pool:
        slot = 0
        while slot * interval < seconds:
            delay = t0 + slot * interval - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            pool.submit(one, slot * interval)
            slot += 1
    samples.sort()
    json.dump({"samples": samples}, sys.stdout)


# -- the benchmark --------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[k]


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def ms(x: float) -> str:
    return f"{x * 1000:.1f} ms"


class Phase:
    def __init__(self, name: str, result: dict):
        self.name = name
        self.samples = result["samples"]
        self.ok = [lat for _, lat in self.samples if lat is not None]
        self.failed = len(self.samples) - len(self.ok)

    def p(self, q: float, since: float = 0.0, until: float = float("inf")) -> float:
        values = [lat for t, lat in self.samples if lat is not None and since <= t < until]
        return percentile(values, q) if values else float("nan")

    def line(self) -> str:
        return (
            f"{self.name:<5} p50 {ms(self.p(50)):>9}  p95 {ms(self.p(95)):>9}  max {ms(max(self.ok)):>9}  "
            f"({len(self.ok)} answers, {self.failed} failed)"
        )


def run_probe(url: str, seconds: float, interval: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(HERE), "--probe", url, str(seconds), str(interval)], stdout=subprocess.PIPE, text=True
    )


def finish_probe(proc: subprocess.Popen, seconds: float) -> dict:
    out, _ = proc.communicate(timeout=seconds + 60)
    if proc.returncode != 0:
        raise RuntimeError(f"the probe exited with {proc.returncode}")
    return json.loads(out)


def log_in(hub, user: str):
    """Sign up (open sign-up) and log in like a browser; returns a session holding the hub cookie."""
    import requests

    s = requests.Session()
    s.get(f"{hub.url}/hub/signup", timeout=30)
    r = s.post(
        f"{hub.url}/hub/signup",
        timeout=60,
        data={
            "username": user,
            "signup_password": PASSWORD,
            "signup_password_confirmation": PASSWORD,
            "email": "",
            "_xsrf": s.cookies.get("_xsrf", ""),
        },
    )
    r.raise_for_status()
    s.get(f"{hub.url}/hub/login", timeout=30)
    r = s.post(
        f"{hub.url}/hub/login",
        timeout=60,
        allow_redirects=False,
        data={"username": user, "password": PASSWORD, "_xsrf": s.cookies.get("_xsrf", "")},
    )
    if r.status_code != 302:
        raise RuntimeError(f"login of {user} failed: {r.status_code} {r.text[:300]}")
    return s


def caused_by(data_dir: Path) -> list[tuple[int, str]]:
    """Live processes this run caused: the data dir is in their environment, or their cwd is in it."""
    marker = f"WORKBENCH_DATA_DIR={data_dir}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes()
            cwd = os.readlink(entry / "cwd")
            state = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if state == b"Z":
            continue
        if marker in env.split(b"\0") or cwd.startswith(str(data_dir)):
            found.append((int(entry.name), cmd[:120]))
    return found


def clean_up(hub, data_dir: Path) -> None:
    import requests

    try:
        hub.kill_everything()
    except requests.RequestException as exc:  # the hub may be gone already; the sweep below still runs
        print(f"stopping through the API failed ({exc}); stopping the hub and sweeping", file=sys.stderr)
        hub.stop()
    deadline = time.monotonic() + 15
    left = caused_by(data_dir)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = caused_by(data_dir)
    if left:
        print("left behind, killing:", *(f"  {pid} {cmd}" for pid, cmd in left), sep="\n", file=sys.stderr)
        for pid, _ in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(1)
        left = caused_by(data_dir)
    print("cleanup: " + ("no process of this run left" if not left else f"STILL RUNNING: {left}"))


def interrupted(signum, frame) -> None:
    raise KeyboardInterrupt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", choices=("standin", "real"), default="standin")
    parser.add_argument("--users", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=25.0, help="probe window of each phase")
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between probe requests")
    parser.add_argument(
        "--hub-arg",
        action="append",
        default=[],
        help="extra hub command-line option, e.g. --hub-arg=--JupyterHub.log_level=DEBUG",
    )
    parser.add_argument("--hub-log", type=Path, help="copy the hub's log here at the end")
    parser.add_argument(
        "--py-spy",
        type=Path,
        metavar="OUT",
        help="sample the hub process with py-spy (pip install py-spy) during the load "
        "window and write its raw (collapsed) stacks to OUT; py-spy's own CPU adds load",
    )
    args = parser.parse_args()
    if args.users < 1 or args.seconds <= 0:
        parser.error("--users and --seconds must be positive")

    import requests

    sys.path.insert(0, str(HERE.parent.parent))
    from tests.conftest import Hub

    # SIGTERM ends the run like Ctrl-C, so the finally below stops everything.
    signal.signal(signal.SIGTERM, interrupted)
    users = [f"student{i:02d}" for i in range(1, args.users + 1)]
    form_users = users[::3]
    progress_users = users[1::3]
    hub_args = ["--NativeAuthenticator.open_signup=True", *args.hub_arg]  # so the form users can log in
    if args.servers == "standin":
        hub_args += [f"--Spawner.cmd={sys.executable}", f"--Spawner.cmd={HERE}", "--Spawner.cmd=--standin-server"]
    env = {"WORKBENCH_SIMULATED_GPUS": "4", "WORKBENCH_QUEUE_TIMEOUT": str(int(max(300, 4 * args.seconds)))}

    with tempfile.TemporaryDirectory(prefix="hub-resp-") as tmp:
        data_dir = Path(tmp) / "data"
        data_dir.mkdir()
        hub = Hub(data_dir, env, hub_args)
        probe_proc: subprocess.Popen | None = None
        spy: subprocess.Popen | None = None
        streams: list = []
        try:
            hub.start()
            hub.create_users(*users)
            sessions = {u: log_in(hub, u) for u in form_users}
            for u, s in sessions.items():
                r = s.get(f"{hub.url}/hub/spawn/{u}", timeout=30)
                if r.status_code != 200 or "workbench-gpus" not in r.text:
                    raise RuntimeError(f"no spawn form for {u}: {r.status_code} {r.url}")
            api_url = f"{hub.url}/hub/api/"
            for _ in range(20):
                requests.get(api_url, timeout=10)
            time.sleep(3)

            # -- idle --------------------------------------------------------------------------
            before = loadavg()
            probe_proc = run_probe(api_url, args.seconds, args.interval)
            idle = Phase("idle", finish_probe(probe_proc, args.seconds))
            probe_proc = None
            print(f"idle phase done (load average {before} -> {loadavg()})", flush=True)

            # -- load --------------------------------------------------------------------------
            before = loadavg()
            headers = {"Authorization": f"token {hub.token}"}
            form_times: list[float] = []
            posts: dict[str, tuple[int, float]] = {}
            progress_events: dict[str, int] = {u: 0 for u in progress_users}
            first_event: dict[str, float] = {}
            stop = threading.Event()
            probe_proc = run_probe(api_url, args.seconds, args.interval)
            if args.py_spy:
                spy = subprocess.Popen(
                    [
                        str(Path(sys.executable).parent / "py-spy"),
                        "record",
                        "--pid",
                        str(hub.proc.pid),
                        "--duration",
                        str(int(args.seconds)),
                        "--rate",
                        "50",
                        "--format",
                        "raw",
                        "--output",
                        str(args.py_spy),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            t0 = time.perf_counter()

            def spawn(user: str) -> None:
                if user in sessions:
                    start = time.perf_counter()
                    sessions[user].get(f"{hub.url}/hub/spawn/{user}", timeout=120)
                    form_times.append(time.perf_counter() - start)
                start = time.perf_counter()
                r = requests.post(
                    f"{hub.url}/hub/api/users/{user}/server", json={"gpus": 1}, headers=headers, timeout=120
                )
                posts[user] = (r.status_code, time.perf_counter() - start)

            def follow(user: str) -> None:
                time.sleep(1.0)  # after its POST has reached the hub
                while not stop.is_set():
                    try:
                        r = requests.get(
                            f"{hub.url}/hub/api/users/{user}/server/progress",
                            headers=headers,
                            stream=True,
                            timeout=(10, args.seconds + 30),
                        )
                        streams.append(r)
                        for line in r.iter_lines(decode_unicode=True):
                            if line and line.startswith("data:"):
                                progress_events[user] += 1
                                first_event.setdefault(user, time.perf_counter() - t0)
                                if json.loads(line[5:]).get("ready"):
                                    return
                    except (requests.RequestException, AttributeError, ValueError):
                        pass
                    stop.wait(1.0)  # not pending yet, or the stream ended: the page would reconnect

            pool = ThreadPoolExecutor(max_workers=len(users) + len(progress_users))
            futures = [pool.submit(spawn, u) for u in users] + [pool.submit(follow, u) for u in progress_users]
            load = Phase("load", finish_probe(probe_proc, args.seconds))
            probe_proc = None
            after = loadavg()
            stop.set()
            for r in list(streams):
                r.close()
            pool.shutdown(wait=True)
            for f in futures:
                f.result()
            servers = {u["name"]: u["servers"].get("", {}) for u in hub.api("GET", "/users").json()}
            ready = sum(1 for u in users if servers.get(u, {}).get("ready"))
            pending = sum(1 for u in users if servers.get(u, {}).get("pending") == "spawn")
        finally:
            for proc in (probe_proc, spy):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                if proc is not None:
                    proc.wait()
            if args.hub_log and hub.log_path.exists():
                shutil.copy(hub.log_path, args.hub_log)
            for r in list(streams):
                r.close()
            clean_up(hub, data_dir)

    statuses: dict[int, int] = {}
    for code, _ in posts.values():
        statuses[code] = statuses.get(code, 0) + 1
    print()
    print(
        f"{args.users} users, {args.servers} servers, 4 simulated GPUs, probe every {args.interval * 1000:g} ms "
        f"for {args.seconds:g} s per phase, idle phase first, then load; nproc {os.cpu_count()}"
    )
    first = f"{percentile(list(first_event.values()), 50):.2f} s" if first_event else "-"
    print(
        f"load phase: POST answers {dict(sorted(statuses.items()))}, slowest "
        f"{max(t for _, t in posts.values()):.2f} s; "
        f"{len(form_times)} spawn forms rendered, median {ms(percentile(form_times, 50)) if form_times else '-'}; "
        f"{sum(progress_events.values())} progress events on {len(progress_users)} streams "
        f"(first one after median {first})"
    )
    print(f"at the end of the window: {ready} ready, {pending} waiting; load average {before} -> {after}")
    print(idle.line())
    print(load.line())
    print(
        f"load  first {BURST_SECONDS:g} s (the spawn burst): p50 {ms(load.p(50, 0, BURST_SECONDS))}, "
        f"p95 {ms(load.p(95, 0, BURST_SECONDS))}; after it (waiting in line): "
        f"p50 {ms(load.p(50, BURST_SECONDS))}, p95 {ms(load.p(95, BURST_SECONDS))}"
    )
    r95 = load.p(95) / idle.p(95)
    r50 = load.p(50) / idle.p(50)
    print(
        f"ratio p95_load/p95_idle {r95:.2f}, p50_load/p50_idle {r50:.2f}: target <= 2 "
        f"{'met' if max(r95, r50) <= 2 else 'NOT met'}"
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--standin-server":
        standin_server()
    elif len(sys.argv) == 5 and sys.argv[1] == "--probe":
        probe(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))
    else:
        main()
