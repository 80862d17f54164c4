"""Directory logins in worker processes, so that a class logging in at once does not stall the hub.

ldap3 is pure Python: a login over TLS (the service account's search, the
user's bind, the group search) holds the interpreter's lock for about 37 ms
of CPU on this machine kind. Run in threads, 200 students logging in at once
kept that lock busy from six threads and the hub's event loop waited for it
at every step: loop lag p95 5.2 s during the logins (the class-start
benchmark, benchmarks/results/2026-12-07-class-start-ldap.md). bcrypt, by
contrast, releases the lock, which is why NativeAuthenticator's thread pool
is enough.

So the directory work runs in worker processes (the authenticator's
``login_processes``, default 1), each with its own interpreter and lock, started with ``spawn``
(a fork of the hub, with its threads and loop, is not safe) and at a lower
priority (nice 10) so that the hub's own loop wins the CPU. Each worker
builds the same authenticator from the hub's settings and runs
ldapauthenticator's login there; only the login's data and its answer
cross the pipe. A worker that dies is replaced at the next login.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

# The worker's own authenticator, built once by _start_worker from the hub's settings.
_worker_authenticator: Any = None

# How much lower than the hub the workers run: the hub's event loop answers everyone, a login may wait.
WORKER_NICENESS = 10


class DirectoryUnreachableError(Exception):
    """The directory did not answer a login (unreachable, TLS failed): the sentence for the log."""


def _start_worker(authenticator_class: type, settings: dict[str, Any]) -> None:
    """In each new worker: lower priority, log lines that say where they come from, the authenticator."""
    global _worker_authenticator
    os.nice(WORKER_NICENESS)
    logging.basicConfig(level=logging.WARNING, format="[W %(asctime)s directory login worker] %(message)s")
    _worker_authenticator = authenticator_class(**settings)


def _login(data: dict[str, str]) -> tuple[str, Any]:
    """In a worker: ldapauthenticator's whole login; ("done", model or None) or ("unreachable", why)."""
    from ldap3.core.exceptions import LDAPException
    from ldapauthenticator import LDAPAuthenticator

    try:
        # LDAPAuthenticator.authenticate never awaits: it runs to its end in this process's own loop.
        return "done", asyncio.run(LDAPAuthenticator.authenticate(_worker_authenticator, None, data))
    except LDAPException as exc:
        return "unreachable", f"{type(exc).__name__}: {exc}"


def _ready() -> bool:
    return _worker_authenticator is not None


class DirectoryWorkers:
    """A small pool of worker processes that run ``authenticator_class(**settings)``'s directory logins."""

    def __init__(self, authenticator_class: type, settings: dict[str, Any], processes: int = 1) -> None:
        self._class = authenticator_class
        self._settings = settings
        self._processes = processes
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=self._processes,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker,
                initargs=(self._class, self._settings),
            )
        return self._pool

    def warm_up(self) -> None:
        """Start the workers now (at hub start), so the first login does not wait for an interpreter."""
        for _ in range(self._processes):
            self._executor().submit(_ready)

    async def login(self, data: dict[str, str]) -> dict[str, Any] | None:
        """The login's model (None: refused by the directory); raises DirectoryUnreachableError."""
        loop = asyncio.get_running_loop()
        for attempt in (1, 2):
            try:
                outcome, answer = await loop.run_in_executor(self._executor(), _login, data)
                break
            except BrokenProcessPool:
                # A worker died (killed, out of memory): a new pool, and this login once more.
                self._pool = None
                if attempt == 2:
                    raise DirectoryUnreachableError("the directory login workers keep dying") from None
        if outcome == "unreachable":
            raise DirectoryUnreachableError(answer)
        return answer

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
