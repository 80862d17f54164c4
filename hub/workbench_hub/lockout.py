"""Lock-out after failed logins, on by default: the settings and the sentence a locked-out user reads.

NativeAuthenticator can refuse a name after ``allowed_failed_logins``
failures in a row for ``seconds_before_next_try`` seconds, but its default
is 0 (off): ten wrong passwords in 2.4 s and then the right one logged in.
The configurer now sets both from ``WORKBENCH_LOGIN_ATTEMPTS`` (default 5)
and ``WORKBENCH_LOGIN_LOCKOUT_SECONDS`` (default 300); either at 0 turns the
lock-out off. Five tries cover a student's typos; five guesses per name
every five minutes is at most 1,440 a day, against passwords that must have
eight characters and not be among the common ones NativeAuthenticator
refuses. The counts are per name and in the hub's memory (a restart forgets
them), as NativeAuthenticator keeps them; a guess refused during a lock-out
is not counted and does not restart the wait.

NativeAuthenticator counts in its own ``login_attempts``; the directory's
login (``ldap_login.py``) counts in a :class:`FailedLogins`, with the same
rule. Both check one login per name at a time (:class:`OneCheckAtATime`:
guesses sent at once are checked one after another, so none slips past the
count); this module also says how long is left and words it for the login
page.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

from traitlets.config import Config

from .env_values import Env, number

ATTEMPTS_DEFAULT = "5"
LOCKOUT_SECONDS_DEFAULT = "300"


def update_lockout(c: Config, env: Env, section: str = "NativeAuthenticator") -> None:
    """``allowed_failed_logins`` and ``seconds_before_next_try`` from the environment, on NativeAuthenticator
    (or on ``section``, the directory login's, which has the same two traits)."""
    attempts = number(env, "WORKBENCH_LOGIN_ATTEMPTS", ATTEMPTS_DEFAULT, int)
    seconds = number(env, "WORKBENCH_LOGIN_LOCKOUT_SECONDS", LOCKOUT_SECONDS_DEFAULT, int)
    # 0 failed logins allowed is NativeAuthenticator's "no lock-out"; a wait of 0 s would be none either.
    c[section].allowed_failed_logins = attempts if seconds else 0
    c[section].seconds_before_next_try = seconds


def seconds_left(last_failure: datetime | None, wait_seconds: float, now: datetime | None = None) -> float:
    """How long a lock-out that began at ``last_failure`` has to run (0 when it is over).

    NativeAuthenticator compares ``timedelta.seconds``, which drops whole days:
    a name that failed 24 h and 10 s ago read as 10 s ago and was locked again.
    Here the whole time counts.
    """
    if last_failure is None:
        return 0.0
    elapsed = ((now or datetime.now()) - last_failure).total_seconds()
    return max(0.0, wait_seconds - elapsed)


def _amount(count: int, unit: str) -> str:
    return f"{count} {unit}{'' if count == 1 else 's'}"


def duration(seconds: float) -> str:
    """``4 minutes and 5 seconds``, ``1 minute``, ``30 seconds``: whole seconds, rounded up."""
    total = max(1, math.ceil(seconds))
    minutes, rest = divmod(total, 60)
    if not minutes:
        return _amount(rest, "second")
    return _amount(minutes, "minute") + (f" and {_amount(rest, 'second')}" if rest else "")


def log_refusal(log: Any, username: str, attempts: int, seconds: float, unasked: str) -> None:
    """The hub log's line for a login refused during a lock-out (``unasked``: what was not consulted)."""
    log.warning(
        "Login refused for %s without %s: locked out after %s failed logins, for %s more",
        username,
        unasked,
        attempts,
        duration(seconds),
    )


def locked_out_sentence(username: str, seconds: float) -> str:
    """What the login page says to a name that is locked out for ``seconds`` more."""
    return (
        f"Too many failed logins for {username}: you may try again in {duration(seconds)}. "
        "Until then no password is checked for this name."
    )


class FailedLogins:
    """Failed logins per name since its last success, and when the last one was: NativeAuthenticator's
    ``login_attempts`` rule for an authenticator that has none (the directory's login)."""

    def __init__(self) -> None:
        self._failures: dict[str, tuple[int, datetime]] = {}

    def failed(self, username: str) -> None:
        count = self._failures.get(username, (0, datetime.now()))[0]
        self._failures[username] = (count + 1, datetime.now())

    def succeeded(self, username: str) -> None:
        self._failures.pop(username, None)

    def seconds_left(self, username: str, attempts: int, wait_seconds: float) -> float:
        """How long ``username`` is still locked out after ``attempts`` failures in a row (0: it may try)."""
        count, last = self._failures.get(username, (0, None))
        if count < attempts:
            return 0.0
        return seconds_left(last, wait_seconds)


class OneCheckAtATime:
    """One login check per name at a time: a check that waits (for the bcrypt pool, for the directory)
    must not let the next guess of that name past the lock-out before it is counted. Other names are
    not held up."""

    def __init__(self) -> None:
        # username -> [lock, holders and waiters]
        self._checking: dict[str, list] = {}

    @asynccontextmanager
    async def turn(self, username: str) -> AsyncIterator[None]:
        turn = self._checking.get(username)
        if turn is None:
            turn = self._checking[username] = [asyncio.Lock(), 0]
        turn[1] += 1
        try:
            async with turn[0]:
                yield
        finally:
            turn[1] -= 1
            if not turn[1]:
                del self._checking[username]
