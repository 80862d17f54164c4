"""Shared fixtures: a real JupyterHub (with its real proxy) and a real browser.

`running_hub` starts `jupyterhub -f hub/jupyterhub_config.py` exactly as
`make run` does, on free loopback ports with a private data dir, and cleans
up every process it caused: the hub, configurable-http-proxy and the user
servers (which outlive the hub on purpose, so they are found by their cwd).
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import random
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
import requests

from workbench_spawner.policy import gpu_policy as _gpu_policy


class _StoppingPolicies(dict):
    """The process-wide policies (``gpu_policy._policies``), whose ``clear()`` (what tests call to forget them)
    also ends each one's reconciler thread. A forgotten policy's thread otherwise went on after its test, on a
    database the test had dropped, logging a traceback each pass; on Python 3.11 formatting a traceback runs
    ``ast.parse`` (the carets), whose recursion-depth check is one state per interpreter, so a test parsing
    source in the main thread meanwhile failed with "SystemError: AST constructor recursion depth mismatch"
    (the clean-clone CI's test_ledger_tables under the newest dependencies)."""

    def clear(self) -> None:
        for policy in list(self.values()):
            stop = getattr(policy, "stop_reconciler", None)  # a test may store a stand-in
            if stop is not None:
                stop()
        super().clear()


# Before any test module imports ``_policies`` by name (this file is imported first).
_gpu_policy._policies = _StoppingPolicies(_gpu_policy._policies)

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "tests" / "artifacts"
STRICT = os.environ.get("WORKBENCH_STRICT_TESTS") == "1" or os.environ.get("CI") == "true"
CHROMIUM = os.environ.get("WORKBENCH_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def missing(reason: str):
    """Skip where a part is simply not installed, fail in CI where it must be."""
    if STRICT:
        pytest.fail(f"required for this test run: {reason}")
    pytest.skip(reason)


def hub_form(session: requests.Session, url: str, path: str, data: dict) -> requests.Response:
    """Send one of the hub's forms (``/hub/login``, ``/hub/signup``) as a browser does: GET the page for
    its ``_xsrf`` cookie, then POST the fields with it. Redirects are not followed (a login answers 302)."""
    session.get(f"{url}{path}", timeout=30)
    return session.post(
        f"{url}{path}", data={**data, "_xsrf": session.cookies.get("_xsrf", "")}, allow_redirects=False, timeout=30
    )


def native_sign_up(session: requests.Session, url: str, name: str, password: str) -> str:
    """NativeAuthenticator's sign-up form; the page it answers with (200)."""
    r = hub_form(
        session,
        url,
        "/hub/signup",
        {"username": name, "signup_password": password, "signup_password_confirmation": password},
    )
    assert r.status_code == 200, r.text
    return r.text


def hub_xsrf(session: requests.Session) -> str:
    """The hub's own ``_xsrf`` cookie (path /hub/): a session that also opened a service or a server holds theirs."""
    return next((c.value or "" for c in session.cookies if c.name == "_xsrf" and c.path.startswith("/hub")), "")


def sign_up_decision(session: requests.Session, url: str, name: str, action: str) -> requests.Response:
    """An admin's Authorize, Unauthorize or Discard button on ``/hub/authorize`` (``action``: ``authorize``,
    ``unauthorize`` or ``discard``): a POST with the page's ``_xsrf``, as the browser sends it (not followed)."""
    session.get(f"{url}/hub/authorize", timeout=30)
    xsrf = hub_xsrf(session)
    path, data = (f"/hub/discard/{name}", {}) if action == "discard" else (f"/hub/authorize/{name}", {"action": action})
    return session.post(f"{url}{path}", data={**data, "_xsrf": xsrf}, allow_redirects=False, timeout=30)


def write_utilization(path: Path, table: dict) -> None:
    """Script the simulated GPU source's utilization (``WORKBENCH_SIMULATED_UTILIZATION``): UUID or "*" ->
    percent, None for no reading. Written atomically: the source never reads half a file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(table))
    os.replace(tmp, path)


def wait_until(predicate, timeout: float, what: str, log=None, every: float = 0.3):
    """Poll until ``predicate()`` is truthy and return its value; fail naming what did not happen.

    ``log`` (a callable returning text, e.g. ``hub.log``) adds the end of that log to the failure."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    tail = f":\n{log()[-4000:]}" if log else ""
    raise AssertionError(f"not within {timeout} s: {what}{tail}")


def let_users_reach(*paths: Path) -> None:
    """Give other users traverse (x) on the directories above these paths, and nothing more.

    Tests that run something as another account (Slurm jobs as the test users, a hub run as an
    ordinary account) use this checkout and its venv. On this machine kind the venv's interpreter
    is pyenv's under /root (mode 0700); traverse rights are the least that lets another account
    run it (it still cannot list /root)."""
    for path in paths:
        for parent in [path, *path.parents] if path.is_dir() else path.parents:
            mode = parent.stat().st_mode
            if not mode & stat.S_IXOTH:
                parent.chmod(mode | stat.S_IXOTH)


# Ports the tests' hubs, proxies and services listen on: below the kernel's ephemeral range (32768-60999 here),
# where every outgoing connection takes its source port, and below Kubernetes' NodePort range (30000-32767).
# A port-0 bind handed out an ephemeral port that an outgoing connection of the other lane could take before
# the hub bound it ("Address already in use" at the hub's start).
TEST_PORTS = range(20000, 30000)
_handed_out: set[int] = set()  # never the same port twice in one test process (one hub asks for several)


def free_port() -> int:
    """A loopback TCP port no one listens on now, picked at random from ``TEST_PORTS``."""
    for _ in range(200):
        port = random.choice(TEST_PORTS)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port in {TEST_PORTS.start}-{TEST_PORTS.stop - 1} after 200 tries")


class Hub:
    def __init__(
        self,
        data_dir: Path,
        env: dict[str, str],
        args: list[str],
        run_as: str | None = None,
        config_file: Path = REPO / "hub" / "jupyterhub_config.py",
    ):
        self.data_dir = data_dir
        self.config_file = config_file  # another file: a plain JupyterHub (the benchmarks' baselines)
        self.run_as = run_as
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "WORKBENCH_DATA_DIR": str(data_dir),
            "WORKBENCH_PORT": str(self.port),
            "WORKBENCH_HUB_API_PORT": str(free_port()),
            "WORKBENCH_PROXY_API_PORT": str(free_port()),
            # Every test hub its own workbench service: two hubs on 10101 would share one service,
            # and the proxy of one would send its requests to the other's.
            "WORKBENCH_SERVICE_PORT": str(free_port()),
            "WORKBENCH_ADMIN_TOKEN": self.token,
            "WORKBENCH_CULL_IDLE_SECONDS": "0",
            **env,
        }
        self.args = args
        self.proc: subprocess.Popen | None = None
        self.log_path = data_dir / "hub.log"

    # -- process ----------------------------------------------------------------
    def start(self, timeout: float = 90) -> Hub:
        chp = REPO / "node_modules" / ".bin" / "configurable-http-proxy"
        if not chp.exists():
            missing("configurable-http-proxy is not installed (run `npm install` or `make test`)")
        account = {}
        if self.run_as:
            entry = pwd.getpwnam(self.run_as)
            account = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
            self.env.update(HOME=entry.pw_dir, USER=self.run_as, LOGNAME=self.run_as)
        # The hub writes to its own copy of the log's descriptor: this one is closed once it started.
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [str(Path(sys.executable).parent / "jupyterhub"), "-f", str(self.config_file), *self.args],
                cwd=REPO,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **account,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the hub exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                if requests.get(f"{self.url}/hub/api/", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"the hub did not answer within {timeout} s:\n{self.log()[-3000:]}")

    def stop(self) -> None:
        """Stop the hub and its proxy, as Ctrl-C would; user servers keep running."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill_everything(self) -> None:
        paths = [
            f"/users/{user['name']}/servers/{name}" if name else f"/users/{user['name']}/server"
            for user in (self.api("GET", "/users").json() if self.proc else [])
            for name in user.get("servers", {})
        ]
        # A few at a time: one by one, a class of 300 servers took two and a half minutes of teardown.
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda path: self.api("DELETE", path), paths))
        self.stop()
        for pid in self.server_pids():
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        pid_file = self.data_dir / "jupyterhub-proxy.pid"
        if pid_file.exists():
            with suppress(ValueError, ProcessLookupError):
                os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)

    def server_pids(self) -> list[int]:
        """Single-user servers this hub started: their cwd is a home under the data dir."""
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            if cwd.startswith(str(self.data_dir / "homes")):
                pids.append(int(entry.name))
        return pids

    # -- REST API -------------------------------------------------------------------
    def api(self, method: str, path: str, **kwargs) -> requests.Response:
        headers = {"Authorization": f"token {self.token}", **kwargs.pop("headers", {})}
        return requests.request(method, f"{self.url}/hub/api{path}", headers=headers, timeout=30, **kwargs)

    def service(self, method: str, path: str, **kwargs) -> requests.Response:
        """A call to the workbench service through the hub's proxy, as the hub's admin."""
        headers = {"Authorization": f"token {self.token}", **kwargs.pop("headers", {})}
        return requests.request(method, f"{self.url}/services/workbench/{path}", headers=headers, timeout=30, **kwargs)

    def create_users(self, *names: str) -> None:
        r = self.api("POST", "/users", json={"usernames": list(names)})
        assert r.status_code in (201, 409), r.text

    def spawn(self, user: str, **options) -> requests.Response:
        return self.api("POST", f"/users/{user}/server", json=options)

    def server(self, user: str) -> dict | None:
        return self.api("GET", f"/users/{user}").json()["servers"].get("")

    def wait_ready(self, user: str, timeout: float = 90) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            server = self.server(user)
            if server and server.get("ready"):
                return server
            if server is None:
                raise AssertionError(f"{user}'s server went away:\n{self.log()[-3000:]}")
            time.sleep(0.5)
        raise AssertionError(f"{user}'s server was not ready within {timeout} s:\n{self.log()[-3000:]}")

    def wait_stopped(self, user: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.server(user) is None:
                return
            time.sleep(0.5)
        raise AssertionError(f"{user}'s server still listed after {timeout} s:\n{self.log()[-4000:]}")

    def progress_messages(self, user: str, until: str | None = None, timeout: float = 30) -> list[str]:
        """Read the spawn progress stream the spawn page shows, up to a message containing ``until``
        (or to the ready or failed event). Empty when no spawn is pending: the hub answers 400."""
        messages: list[str] = []
        with self.api("GET", f"/users/{user}/server/progress", stream=True) as r:
            deadline = time.monotonic() + timeout
            for line in r.iter_lines(decode_unicode=True):
                if line and line.startswith("data:"):
                    event = json.loads(line[5:])
                    messages.append(event.get("message", ""))
                    if (until is not None and until in messages[-1]) or event.get("failed") or event.get("ready"):
                        break
                if time.monotonic() > deadline:
                    break
        return messages

    def user_token(self, user: str) -> str:
        r = self.api("POST", f"/users/{user}/tokens", json={"note": "tests", "expires_in": 3600})
        assert r.status_code == 201, r.text
        return r.json()["token"]

    def leases(self) -> dict[str, list[str]]:
        """What the allocation store holds, read straight from its SQLite file."""
        import sqlite3

        with sqlite3.connect(self.data_dir / "workbench.sqlite") as db:
            rows = db.execute("SELECT user, gpu_uuid FROM gpu_leases ORDER BY gpu_uuid").fetchall()
        result: dict[str, list[str]] = {}
        for user, uuid in rows:
            result.setdefault(user, []).append(uuid)
        return result

    def stop_box(self, user: str, server: str = "") -> str | None:
        """The sentence the spawn page's and the home page's stop box show ``user`` now (the newest ``done``
        notice, as the pages read it), or None."""
        from workbench_spawner.ledger.notices import NoticeBook
        from workbench_spawner.ledger.store import AllocationStore

        store = AllocationStore(f"sqlite:///{self.data_dir / 'workbench.sqlite'}")
        try:
            notice = NoticeBook(store).last_done(user, server)
            return None if notice is None else notice.message
        finally:
            store.dispose()

    def admin_pages(self, password: str = "admin-pass-1234") -> requests.Session:
        """A browser-like session of the hub's admin (signed up and logged in), for pages such as
        ``/hub/spawn/<user>`` that an API token does not render."""
        native_sign_up(requests.Session(), self.url, "admin", password)
        session = requests.Session()
        r = hub_form(session, self.url, "/hub/login", {"username": "admin", "password": password})
        assert r.status_code == 302, r.text[-2000:]
        return session

    def usage_reasons(self) -> dict[str, list[str]]:
        """Why each user's finished leases ended (the usage ledger's reasons, in order), from its SQLite file."""
        import sqlite3

        with sqlite3.connect(self.data_dir / "workbench.sqlite") as db:
            rows = db.execute("SELECT user, reason FROM gpu_usage ORDER BY id").fetchall()
        found: dict[str, list[str]] = {}
        for user, reason in rows:
            found.setdefault(user, []).append(reason)
        return found


def process_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


@contextmanager
def hub_pool(tmp_path: Path, prepare=None):
    """start(env, args) -> a started Hub with its own data dir; every hub cleaned up at the end.

    ``prepare(hub)`` may adjust a hub before it starts (its URL scheme, say); ``start(..., prepare=...)`` one
    hub (tell a login provider its address)."""
    hubs: list[Hub] = []
    owned: list[Path] = []

    def start(
        env: dict[str, str] | None = None,
        args: list[str] | None = None,
        run_as: str | None = None,
        prepare_one=None,
    ) -> Hub:
        if run_as:
            # pytest's own temp dirs are root's (0700); the data dir lies in the account's home, as
            # the default data dir does on a workstation (sshd's StrictModes walks up to that home).
            entry = pwd.getpwnam(run_as)
            data_dir = Path(tempfile.mkdtemp(prefix="workbench-hub-", dir=entry.pw_dir))
            os.chown(data_dir, entry.pw_uid, entry.pw_gid)
            let_users_reach(Path(sys.executable).resolve(), REPO)
            owned.append(data_dir)
            hub = Hub(data_dir, env or {}, args or [], run_as=run_as)
        else:
            hub = Hub(tmp_path / f"hub{len(hubs)}", env or {}, args or [])
            hub.data_dir.mkdir()
        for adjust in (prepare, prepare_one):
            if adjust:
                adjust(hub)
        hubs.append(hub)
        return hub.start()

    try:
        yield start
    finally:
        for hub in hubs:
            try:
                hub.kill_everything()
            except requests.RequestException:  # the hub is gone: stop what is left
                hub.stop()
            if os.environ.get("WORKBENCH_KEEP_TEST_LOGS"):
                ARTIFACTS.mkdir(parents=True, exist_ok=True)
                shutil.copy(hub.log_path, ARTIFACTS / f"{hub.data_dir.parent.name}-{hub.data_dir.name}.log")
        for data_dir in owned:
            shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture
def running_hub(tmp_path):
    """A factory: running_hub(env={...}, args=[...]) -> a started Hub."""
    with hub_pool(tmp_path) as start:
        yield start


@pytest.fixture
def chromium_browser():
    """Debian's Chromium driven by Playwright (no browser download needed)."""
    if not Path(CHROMIUM).exists():
        missing(f"{CHROMIUM} is not installed (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("the playwright Python package is not installed")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


# -- the one Docker Engine, shared by the lanes (tests/lanes.py) ----------------------------------------------

ENGINE_LOCKS = Path("/run/lock")


@contextmanager
def docker_engine_use(exclusive: bool):
    """Hold the Docker Engine for a test that needs it steady (shared) or that restarts it (exclusive).

    The lanes run side by side on one dockerd: the Kubernetes tests' pods are Docker containers
    (dockershim) in one lane, and a docker test in the other restarts dockerd, which stops every
    container and fails a pod starting then ("failed to start sandbox container"). A restart waits for
    the Kubernetes test under way and keeps new ones out until dockerd is back. A gate lock in front
    keeps the restart from waiting behind an endless line of Kubernetes tests: a waiting restart holds
    the gate, so no new one starts."""
    ENGINE_LOCKS.mkdir(parents=True, exist_ok=True)
    with open(ENGINE_LOCKS / "wb-dockerd-gate.lock", "a") as gate, open(ENGINE_LOCKS / "wb-dockerd.lock", "a") as held:
        fcntl.flock(gate, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            fcntl.flock(held, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            if not exclusive:
                fcntl.flock(gate, fcntl.LOCK_UN)  # in: the next test of the lane may come in too
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)


@pytest.fixture
def thread_hops(monkeypatch) -> list:
    """The functions handed to ``asyncio.to_thread`` from now on, in order: a test counts the worker-thread
    hops of one render (each hop waits in the default executor's queue, which every spawn's database work
    shares at a class start). Clear it after a warm-up call to count only what follows."""
    import asyncio

    hops: list = []
    to_thread = asyncio.to_thread

    async def counted(func, /, *args, **kwargs):
        hops.append(func)
        return await to_thread(func, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", counted)
    return hops


@pytest.fixture(autouse=True)
def _pods_keep_the_docker_engine(request):
    """A Kubernetes test holds the Docker Engine shared for its length (its pods run there), so the other
    lane's dockerd restart (tests/docker/conftest.py ``restart_dockerd``) waits until it ends."""
    if request.node.get_closest_marker("kubernetes") is None:
        yield
        return
    with docker_engine_use(exclusive=False):
        yield
