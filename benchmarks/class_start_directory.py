"""The class start with a directory: the LDAP side of ``benchmarks/class_start.py``.

``class_start.py --hubs ours,ldap`` runs the same class start twice side by side: on our hub with
NativeAuthenticator (bcrypt in a niced pool of one thread per core) and on our hub with
``WORKBENCH_AUTHENTICATOR=ldap`` (``WorkbenchLDAPAuthenticator``: the whole directory login in a
worker thread). ``ldap-blocking`` adds ldapauthenticator's own ``LDAPAuthenticator`` as it comes, whose
login runs on the hub's event loop (``stock_ldap_config.py``), to show what the worker thread buys.

The directory is the tests' private slapd (``tests/identity``: StartTLS and LDAPS on loopback, its own
CA), a new one for each LDAP hub, with the class added in one ldapmodify: N people in the course group
``ml-course``, which has a group quota in the workbench before anyone logs in. The hub's settings are
those of ``tests/integration/test_university_login.py``'s ``ldap_env``: StartTLS, a service account
finds the person's DN, then the person binds, then the groups are searched.

This module also measures, before the timed part, what one login costs when nothing else runs (the
directory login through the hub's own authenticator code, with and without TLS; one bcrypt check at
NativeAuthenticator's cost), and samples the CPU time of the hub and of slapd during the class start,
so the report can say why the logins took what they took.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
STOCK_CONFIG = HERE / "stock_ldap_config.py"
COURSE = "ml-course"
COURSE_QUOTA = {"max_gpus": 1, "gpu_hours_per_week": None, "allowed_models": None}
DIRECTORY_HUBS = ("ldap", "ldap-blocking")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def start_directory(run_dir: Path) -> Any:
    """A new private slapd (``tests.identity.servers.Directory``) on two free loopback ports, started.
    Raises SystemExit with the sentence of what is missing where slapd is not installed."""
    from tests.conftest import free_port
    from tests.identity.servers import Directory, slapd_missing

    reason = slapd_missing()
    if reason:
        raise SystemExit(f"class_start.py --hubs ldap: {reason}")
    directory = Directory(run_dir, free_port(), free_port())
    directory.start()
    return directory


def enroll(directory: Any, names: list[str], password: str) -> float:
    """The class in the directory: each name a person with ``password``, all in the course group; seconds taken."""
    began = time.monotonic()
    directory.add_users(names, groups=[COURSE], password=password)
    return time.monotonic() - began


def hub_env(directory: Any, hub_kind: str) -> dict[str, str]:
    """The hub's login settings for this directory (``ldap_env`` of the university-login tests); the
    stock authenticator's hub also gets ``stock_ldap_config.py`` as its local config."""
    env = {
        "WORKBENCH_AUTHENTICATOR": "ldap",
        "WORKBENCH_ADMIN_USERS": "tina",
        "WORKBENCH_LDAP_URL": directory.url,
        "WORKBENCH_LDAP_CA_FILE": str(directory.ca_file),
        "WORKBENCH_LDAP_USER_BASE": directory.people_dn,
        "WORKBENCH_LDAP_BIND_DN": directory.reader_dn,
        "WORKBENCH_LDAP_BIND_PASSWORD": directory.reader_password,
        "WORKBENCH_LDAP_GROUP_BASE": directory.groups_dn,
    }
    if hub_kind == "ldap-blocking":
        env["WORKBENCH_LOCAL_CONFIG"] = str(STOCK_CONFIG)
    return env


def set_course_quota(hub: Any) -> None:
    """The course group's GPU quota in the workbench, set before any member logged in (as staff would)."""
    r = hub.service("PUT", f"api/quotas/groups/{COURSE}", json=COURSE_QUOTA)
    if r.status_code not in (200, 201):
        raise RuntimeError(f"setting {COURSE}'s quota answered {r.status_code}: {r.text[:300]}")


def course_members(hub: Any) -> int:
    """How many hub users the course's hub group has (the directory's groups, synced at each login)."""
    r = hub.api("GET", f"/groups/{COURSE}")
    return len(r.json().get("users", [])) if r.status_code == 200 else 0


# -- what one login costs, alone ------------------------------------------------------------------


@dataclass
class LoginCosts:
    """Wall and CPU time of one login when nothing else runs (p50 over ``count`` logins, in seconds)."""

    count: int
    ldap_tls: float  # what a directory login worker does over StartTLS: wall
    ldap_tls_cpu: float  # ... the client's CPU (this process)
    ldap_plain: float  # the same without TLS (WORKBENCH_LDAP_STARTTLS=0, loopback only)
    ldap_plain_cpu: float
    slapd_cpu: float  # slapd's CPU per login over StartTLS
    bcrypt: float  # one bcrypt.checkpw at NativeAuthenticator's cost (12)
    groups: list[str] = field(default_factory=list)  # what the directory gave the first student


def _authenticator(directory: Any, starttls: bool) -> Any:
    """The hub's own authenticator class, configured from the hub's environment as the hub does."""
    from traitlets.config import Config

    from workbench_hub.ldap_login import WorkbenchLDAPAuthenticator
    from workbench_hub.login_settings import update_ldap

    env = hub_env(directory, "ldap")
    if not starttls:
        env["WORKBENCH_LDAP_STARTTLS"] = "0"
    c = Config()
    update_ldap(c, env)
    return WorkbenchLDAPAuthenticator(config=c)


def measure_login_costs(directory: Any, names: list[str], password: str, count: int = 20) -> LoginCosts:
    """One directory login at a time (``count`` of them, over StartTLS and in the clear), and 5 bcrypt checks."""
    import bcrypt
    from ldapauthenticator import LDAPAuthenticator

    def series(starttls: bool) -> tuple[list[float], list[float], float, list[str]]:
        auth = _authenticator(directory, starttls)
        walls: list[float] = []
        cpus: list[float] = []
        groups: list[str] = []
        slapd_before = process_cpu(slapd_pid(directory))
        for name in names[:count]:
            w, c = time.monotonic(), time.process_time()
            # ldapauthenticator's login itself, in this process, as each hub worker process runs it.
            model = asyncio.run(LDAPAuthenticator.authenticate(auth, None, {"username": name, "password": password}))
            walls.append(time.monotonic() - w)
            cpus.append(time.process_time() - c)
            if model is None:
                raise RuntimeError(f"{name} could not log in to the directory with the benchmark's password")
            groups = groups or list(model["auth_state"]["user_attributes"].get("_groups") or [])
        slapd = (process_cpu(slapd_pid(directory)) - slapd_before) / len(walls)
        return walls, cpus, slapd, groups

    tls_walls, tls_cpus, slapd, groups = series(True)
    plain_walls, plain_cpus, _, _ = series(False)
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(12))
    checks = []
    for _ in range(5):
        t = time.monotonic()
        bcrypt.checkpw(password.encode(), hashed)
        checks.append(time.monotonic() - t)
    return LoginCosts(
        count=len(tls_walls),
        ldap_tls=statistics.median(tls_walls),
        ldap_tls_cpu=statistics.median(tls_cpus),
        ldap_plain=statistics.median(plain_walls),
        ldap_plain_cpu=statistics.median(plain_cpus),
        slapd_cpu=slapd,
        bcrypt=statistics.median(checks),
        groups=groups,
    )


# -- CPU time of the hub and of slapd during the class start --------------------------------------


def slapd_pid(directory: Any) -> int | None:
    try:
        return int((directory.run_dir / "slapd.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def process_cpu(pid: int | None) -> float:
    """User plus system CPU seconds of a process (all its threads) so far; 0 when it is gone."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime (fields 14 and 15 of stat)


class CpuSampler:
    """Samples the CPU seconds of some processes every ``interval`` s in a thread, so that the CPU they used
    in a window known only afterwards (the login phase) can be read back with :meth:`used`."""

    def __init__(self, pids: dict[str, int | None], interval: float = 0.25) -> None:
        self.pids = pids
        self.interval = interval
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        self.samples.append((time.monotonic(), {k: process_cpu(pid) for k, pid in self.pids.items()}))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def start(self) -> CpuSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling, with one last sample; once (later calls do nothing)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        self._sample()

    def used(self, name: str, start: float, end: float) -> float:
        """CPU seconds ``name`` used between the samples nearest ``start`` and ``end`` (monotonic); NaN for a
        window too short for the samples to say."""
        if not self.samples or end - start < 4 * self.interval:
            return float("nan")
        first = min(self.samples, key=lambda s: abs(s[0] - start))
        last = min(self.samples, key=lambda s: abs(s[0] - end))
        return last[1][name] - first[1][name]
