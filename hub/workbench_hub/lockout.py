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

The counting itself is ``auth.WorkbenchAuthenticator``'s (guesses sent at
once are checked one after another, so none slips past the count); this
module says how long is left and words it for the login page.
"""

from __future__ import annotations

import math
from datetime import datetime

from traitlets.config import Config

from .env_values import Env, number

ATTEMPTS_DEFAULT = "5"
LOCKOUT_SECONDS_DEFAULT = "300"


def update_lockout(c: Config, env: Env) -> None:
    """NativeAuthenticator's ``allowed_failed_logins`` and ``seconds_before_next_try`` from the environment."""
    attempts = number(env, "WORKBENCH_LOGIN_ATTEMPTS", ATTEMPTS_DEFAULT, int)
    seconds = number(env, "WORKBENCH_LOGIN_LOCKOUT_SECONDS", LOCKOUT_SECONDS_DEFAULT, int)
    # 0 failed logins allowed is NativeAuthenticator's "no lock-out"; a wait of 0 s would be none either.
    c.NativeAuthenticator.allowed_failed_logins = attempts if seconds else 0
    c.NativeAuthenticator.seconds_before_next_try = seconds


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


def locked_out_sentence(username: str, seconds: float) -> str:
    """What the login page says to a name that is locked out for ``seconds`` more."""
    return (
        f"Too many failed logins for {username}: you may try again in {duration(seconds)}. "
        "Until then no password is checked for this name."
    )
