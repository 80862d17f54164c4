"""bcrypt off the hub's event loop: password checks and hashes run in a thread pool.

NativeAuthenticator checks a password with bcrypt (cost 12: ~0.2 s of CPU on
a modest host) on JupyterHub's event loop, and hashes one the same way at
sign-up and password change. While it does, the hub answers nothing else: a
class of 200 logging in at once stalled the loop for 55 s, and every login
and every other request to the hub waited that long. bcrypt releases the GIL
while it hashes, so these calls can run in threads side by side with the
loop; the pool has one thread per core (``os.cpu_count()``), as many hashes
as the host can compute at once. A burst of logins queues here, in the
pool, while the hub keeps serving everything else.

The pool's threads run at a lower CPU priority (``NICENESS``, Linux's
per-thread nice value): when the host is saturated, as it is while a class
logs in and its servers start on the same cores, the scheduler gives the
hub's event loop its turn before the next hash, so the hub stays responsive
and the logins take the CPU that is left. On an idle host they run at full
speed; nothing about the hashes changes.

Only bcrypt runs in the pool: the callers read and write the hub's database
(its SQLAlchemy session is not thread-safe) on the loop, before and after.
The hashes and their cost are NativeAuthenticator's: ``bcrypt.gensalt()``
(cost 12), and stored hashes are checked with ``bcrypt.checkpw``, which
compares in constant time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import bcrypt

_pool: ThreadPoolExecutor | None = None
# How much lower the pool's threads run than the hub's loop (nice +10: about a tenth of its CPU share
# when both want the CPU).
NICENESS = 10


def _lower_priority() -> None:
    """Runs in each new pool thread: nice it (a thread's own nice value on Linux; elsewhere nothing)."""
    # no setpriority (not Unix), or not allowed: full priority, still off the loop
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICENESS)


def pool() -> ThreadPoolExecutor:
    """The process's password pool, one thread per core, made at first use."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(
            max_workers=os.cpu_count() or 1, thread_name_prefix="password-check", initializer=_lower_priority
        )
    return _pool


def _matches(password: str, hashed: bytes) -> bool:
    try:
        return bcrypt.checkpw(password.encode(), hashed)
    except ValueError:
        # bcrypt refuses passwords over 72 bytes (and a stored value that is no bcrypt hash):
        # such a password matches nothing NativeAuthenticator could have stored.
        return False


async def check_password(password: str, hashed: bytes) -> bool:
    """Whether ``password`` is the one ``hashed`` (a stored bcrypt hash) was made from; in the pool."""
    return await asyncio.get_running_loop().run_in_executor(pool(), _matches, password, bytes(hashed))


def _hash(password: str) -> bytes:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt())


async def hash_password(password: str) -> bytes:
    """A new bcrypt hash of ``password``, as NativeAuthenticator stores it (``bcrypt.gensalt()``: cost 12);
    made in the pool. Raises ValueError where bcrypt refuses the password (over 72 bytes)."""
    return await asyncio.get_running_loop().run_in_executor(pool(), _hash, password)
