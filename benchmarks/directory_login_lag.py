"""Where the directory logins run, and what that does to an event loop in the same process.

``class_start.py --hubs ours,ldap`` found the hub's loop lagging by seconds while 200 students logged in
through LDAP, although ``WorkbenchLDAPAuthenticator`` runs each login in a worker thread. The reason is
the GIL: ldap3 is pure Python (about 37 ms of CPU per login, most of it holding the GIL; the TLS
handshakes themselves release it), and asyncio's default executor runs six such threads at once on a
2-core host. The loop thread gives the GIL up at every socket call, SQLite statement and log write,
and must then win it back against six busy threads each time. bcrypt, by contrast, releases the GIL
for the whole hash, so NativeAuthenticator's pool leaves the loop alone.

This script shows it without a hub: the tests' private slapd with N students in ``ml-course``, the
hub's own authenticator code (``WorkbenchLDAPAuthenticator._authenticate_in_thread``, configured from
the same environment as ``class_start.py``'s ldap hub), N logins submitted at once from an asyncio
loop, in turn through each way of running them. Meanwhile the loop measures itself every 20 ms: how
late ``asyncio.sleep(0.02)`` wakes (the lag), and how long 20 SQLite statements take (each one
releases and retakes the GIL, as the hub's database queries do).

    .venv/bin/python benchmarks/directory_login_lag.py [--students 200] [--ways default,threads-6-nice,...]

Ways: ``idle`` (no logins, 5 s), ``default`` (``asyncio.to_thread``: the default executor,
min(32, cores + 4) threads, as the hub does today), ``threads-N`` and ``threads-N-nice`` (a pool of N
threads, optionally at nice +10 as ``password_checks.py`` does for bcrypt), ``processes-N-nice`` (N
worker processes at nice +10, each with its own authenticator: no GIL shared with the loop). About
1.5 minutes for all of them at 200 students.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PASSWORD = "correct-horse-battery-staple"
NICENESS = 10
TICK = 0.02
STATEMENTS = 20
WAYS = ("idle", "default", "threads-6-nice", "threads-2", "threads-2-nice", "threads-1", "processes-2-nice")

_authenticator: Any = None  # this process's WorkbenchLDAPAuthenticator (the main one, or a worker's)


def make_authenticator(env: dict[str, str]) -> None:
    """The hub's authenticator class, configured from the hub's environment as the hub does."""
    global _authenticator
    from traitlets.config import Config

    from workbench_hub.ldap_login import WorkbenchLDAPAuthenticator
    from workbench_hub.login_settings import update_ldap

    c = Config()
    update_ldap(c, env)
    _authenticator = WorkbenchLDAPAuthenticator(config=c)


def login(name: str) -> str:
    """One student's directory login as the hub's worker thread does it; their name."""
    model = _authenticator._authenticate_in_thread({"username": name, "password": PASSWORD})
    if model is None:
        raise RuntimeError(f"{name} could not log in to the directory")
    return str(model["name"])


def lower_priority() -> None:
    """Nice the calling thread (a thread's own nice value on Linux)."""
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICENESS)


def worker_start(env: dict[str, str]) -> None:
    """A worker process: lower its priority, make its own authenticator."""
    lower_priority()
    make_authenticator(env)


def submitter(loop: asyncio.AbstractEventLoop, executor: Executor) -> Callable[[str], Awaitable[str]]:
    """A student's login sent to ``executor``."""

    def submit(name: str) -> Awaitable[str]:
        return loop.run_in_executor(executor, login, name)

    return submit


async def measure(way: str, submit: Callable[[str], Awaitable[Any]], names: list[str]) -> str:
    """Submit every login at once; the loop measures itself meanwhile. One markdown table row."""
    db = sqlite3.connect(":memory:")
    lags: list[float] = []
    statements: list[float] = []
    done = asyncio.Event()

    async def probe() -> None:
        while not done.is_set():
            t = time.monotonic()
            await asyncio.sleep(TICK)
            lags.append(time.monotonic() - t - TICK)
            t = time.monotonic()
            for _ in range(STATEMENTS):
                db.execute("SELECT 1").fetchall()
            statements.append(time.monotonic() - t)

    probing = asyncio.create_task(probe())
    await asyncio.sleep(0.5)
    lags.clear()
    statements.clear()
    began = time.monotonic()
    await asyncio.gather(*(submit(name) for name in names))
    total = time.monotonic() - began
    done.set()
    await probing
    db.close()

    def ms(values: list[float], q: float) -> str:
        from hub_responsiveness import percentile

        return f"{percentile(values, q) * 1000:.1f}"

    return (
        f"| {way} | {total:.1f} s | {ms(lags, 50)} / {ms(lags, 95)} / {max(lags) * 1000:.0f} ms "
        f"| {ms(statements, 50)} / {ms(statements, 95)} ms | {len(lags)} |"
    )


def executor_for(way: str, env: dict[str, str]) -> Executor | None:
    """The executor a way names (None: asyncio's default executor)."""
    if way == "default":
        return None
    kind, count, *nice = way.split("-")
    if kind == "threads":
        return ThreadPoolExecutor(int(count), initializer=lower_priority if nice else None)
    if kind == "processes" and nice:
        return ProcessPoolExecutor(int(count), initializer=worker_start, initargs=(env,))
    raise SystemExit(f"unknown way {way!r}: threads-N, threads-N-nice, processes-N-nice or default")


async def main_async(args: argparse.Namespace) -> list[str]:
    from class_start_directory import enroll, hub_env, start_directory

    names = [f"student{i:03d}" for i in range(1, args.students + 1)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="directory-login-lag-") as tmp:
        directory = start_directory(Path(tmp) / "slapd")
        try:
            enroll(directory, names, PASSWORD)
            env = hub_env(directory, "ldap")
            make_authenticator(env)
            loop = asyncio.get_running_loop()
            for way in args.ways:
                if way == "idle":  # no logins: the loop alone for 5 s
                    rows.append(await measure(way, lambda n: asyncio.sleep(5.0), names[:1]))
                elif (executor := executor_for(way, env)) is None:
                    rows.append(await measure(way, lambda n: asyncio.to_thread(login, n), names))
                else:
                    with executor:
                        if isinstance(executor, ProcessPoolExecutor):  # the workers started before the clock
                            await asyncio.gather(*(loop.run_in_executor(executor, login, n) for n in names[:4]))
                        rows.append(await measure(way, submitter(loop, executor), names))
                print(rows[-1], flush=True)
        finally:
            directory.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=200)
    parser.add_argument("--ways", default=",".join(WAYS), help=f"comma list (default {','.join(WAYS)})")
    args = parser.parse_args()
    args.ways = [w.strip() for w in args.ways.split(",") if w.strip()]
    sys.path.insert(0, str(REPO))
    rows = asyncio.run(main_async(args))
    cores = os.cpu_count() or 1
    print(
        "\n".join(
            [
                "",
                f"{args.students} directory logins submitted at once; {cores} cores; the default executor has "
                f"min(32, cores + 4) = {min(32, cores + 4)} threads.",
                "",
                f"| way | all logins done | loop lag (sleep {TICK * 1000:.0f} ms wakes late) p50 / p95 / max "
                f"| {STATEMENTS} SQLite statements on the loop, p50 / p95 | ticks |",
                "| --- | --- | --- | --- | --- |",
                *rows,
            ]
        )
    )


if __name__ == "__main__":
    main()
