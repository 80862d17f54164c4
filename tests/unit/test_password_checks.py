"""WorkbenchAuthenticator's bcrypt runs in a thread pool (workbench_hub/password_checks.py) and
NativeAuthenticator's rules all still hold: the right password logs in, a wrong one is refused and
counted, an unauthorized or unknown sign-up is refused, a name is blocked after
``allowed_failed_logins`` failures (also when the guesses arrive at once), 2FA tokens are checked;
sign-up and password change store a hash made in the pool under the same rules."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from datetime import datetime, timedelta

import bcrypt
import onetimepass
import pytest
from jupyterhub.orm import new_session_factory
from nativeauthenticator import NativeAuthenticator
from nativeauthenticator.orm import UserInfo
from sqlalchemy import event

from workbench_hub import auth as workbench_auth
from workbench_hub import password_checks
from workbench_hub.auth import WorkbenchAuthenticator

PASSWORD = "a-long-enough-passphrase-42"
# Stored hashes for the login tests at bcrypt's lowest cost: checkpw reads the cost from the hash, so
# the rules are the same and the tests fast. Sign-up and password change hash at NativeAuthenticator's 12.
FAST = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4))


def new_db():
    return new_session_factory("sqlite://")()


def authenticator(db=None, **config) -> WorkbenchAuthenticator:
    auth = WorkbenchAuthenticator(db=db if db is not None else new_db())
    for name, value in config.items():
        setattr(auth, name, value)
    return auth


def sign_up(auth, name: str, authorized: bool = True, **fields) -> UserInfo:
    info = UserInfo(username=name, password=FAST, is_authorized=authorized, **fields)
    auth.db.add(info)
    auth.db.commit()
    return info


async def log_in(auth, name: str, password: str = PASSWORD, **extra):
    return await auth.authenticate(None, {"username": name, "password": password, **extra})


async def test_the_right_password_logs_in_and_clears_earlier_failures():
    auth = authenticator()
    sign_up(auth, "ann")
    assert await log_in(auth, "ann", "wrong password") is None
    assert auth.login_attempts["ann"]["count"] == 1
    assert await log_in(auth, "ann") == "ann"
    assert "ann" not in auth.login_attempts


async def test_a_wrong_password_is_refused_and_counted():
    auth = authenticator()
    sign_up(auth, "ann")
    for count in (1, 2):
        assert await log_in(auth, "ann", PASSWORD + "x") is None
        assert auth.login_attempts["ann"]["count"] == count


async def test_an_unknown_name_is_refused_and_not_counted():
    auth = authenticator()
    assert await log_in(auth, "nobody") is None
    assert auth.login_attempts == {}


async def test_an_unauthorized_sign_up_is_refused_with_the_right_password_and_counted():
    auth = authenticator()
    sign_up(auth, "ben", authorized=False)
    assert await log_in(auth, "ben") is None
    assert auth.login_attempts["ben"]["count"] == 1


async def test_names_are_normalized_as_before():
    auth = authenticator()
    sign_up(auth, "ann")
    assert await log_in(auth, "ANN") == "ann"


async def test_blocked_after_allowed_failed_logins_until_the_wait_is_over():
    auth = authenticator(allowed_failed_logins=2, seconds_before_next_try=600)
    sign_up(auth, "ann")
    assert await log_in(auth, "ann", "wrong") is None
    assert await log_in(auth, "ann", "wrong") is None
    assert await log_in(auth, "ann") is None  # blocked: even the right password
    assert auth.login_attempts["ann"]["count"] == 2  # a blocked try is not counted, as before
    auth.login_attempts["ann"]["time"] = datetime.now() - timedelta(seconds=601)
    assert await log_in(auth, "ann") == "ann"


async def test_guesses_sent_at_once_get_no_more_tries_than_allowed(monkeypatch):
    """The checks of one name wait for each other: a guess waiting for the pool must not slip past
    the block before the guesses ahead of it are counted (as NativeAuthenticator's synchronous check)."""
    checked = []
    real = password_checks._matches
    monkeypatch.setattr(password_checks, "_matches", lambda pw, hashed: checked.append(pw) or real(pw, hashed))
    # seconds_before_next_try set as the configurer sets it: the trait's real default is 0 (its help's "600" is
    # a tag, not the value), which is no wait at all
    auth = authenticator(allowed_failed_logins=3, seconds_before_next_try=600)
    sign_up(auth, "ann")
    sign_up(auth, "ben")
    results = await asyncio.gather(
        *(log_in(auth, "ann", f"guess {i}") for i in range(10)), log_in(auth, "ann"), log_in(auth, "ben")
    )
    assert results[:11] == [None] * 11  # blocked after 3 guesses, the right password too
    assert results[11] == "ben"  # other names are not held up
    assert auth.login_attempts["ann"]["count"] == 3
    assert len([pw for pw in checked if pw != PASSWORD]) == 3  # only 3 guesses were ever checked
    assert auth._turns._checking == {}  # nothing kept per name once its checks are done


async def test_2fa_needs_the_current_token():
    auth = authenticator()
    info = sign_up(auth, "ann", has_2fa=True)
    token = onetimepass.get_totp(info.otp_secret, as_string=True).decode()
    assert await log_in(auth, "ann", **{"2fa": token}) == "ann"
    wrong = f"{(int(token) + 1) % 1_000_000:06d}"
    assert await log_in(auth, "ann", **{"2fa": wrong}) is None
    assert auth.login_attempts["ann"]["count"] == 1
    assert await log_in(auth, "ann", "wrong", **{"2fa": token}) is None


async def test_the_check_runs_in_a_pool_thread_and_the_loop_keeps_running(monkeypatch):
    threads = []
    real = bcrypt.checkpw
    monkeypatch.setattr(
        bcrypt, "checkpw", lambda pw, hashed: threads.append(threading.current_thread()) or real(pw, hashed)
    )
    auth = authenticator()
    names = [f"s{i}" for i in range(4)]
    cost12 = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(12))  # ~0.2 s a check on a modest core
    for name in names:
        auth.db.add(UserInfo(username=name, password=cost12, is_authorized=True))
    auth.db.commit()

    gaps = []

    async def ticker(done: asyncio.Event):
        last = time.monotonic()
        while not done.is_set():
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    done = asyncio.Event()
    ticking = asyncio.create_task(ticker(done))
    assert await asyncio.gather(*(log_in(auth, name) for name in names)) == names
    done.set()
    await ticking
    assert len(threads) == 4
    assert all(t is not threading.main_thread() and t.name.startswith("password-check") for t in threads)
    # The loop ran all along: no gap near one check's time (~0.2 s), let alone four.
    assert max(gaps) < 0.1, max(gaps)


def test_the_pool_has_a_thread_per_core():
    assert password_checks.pool()._max_workers == (os.cpu_count() or 1)


def test_the_pool_threads_yield_the_cpu_to_the_hubs_loop():
    # Nice +10 per thread: on a saturated host the loop gets its turn before the next hash.
    def niceness() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    loop_niceness = niceness()
    assert password_checks.pool().submit(niceness).result(5) == loop_niceness + password_checks.NICENESS
    assert niceness() == loop_niceness, "only the pool's threads are niced, not the hub's"


async def test_checkpw_agrees_with_nativeauthenticators_check():
    info = UserInfo(username="ann", password=FAST)
    for candidate in (PASSWORD, PASSWORD + " ", "", "x" * 72):
        assert await password_checks.check_password(candidate, FAST) == info.is_valid_password(candidate)
    # bcrypt refuses passwords over 72 bytes: they match nothing (NativeAuthenticator's check raised).
    assert await password_checks.check_password("x" * 73, FAST) is False


async def test_a_new_hash_has_nativeauthenticators_cost():
    hashed = await password_checks.hash_password(PASSWORD)
    assert hashed.startswith(b"$2b$12$")
    assert UserInfo(username="ann", password=hashed).is_valid_password(PASSWORD)


# -- sign-up and password change: the hash made in the pool, NativeAuthenticator's rules ----------------------


def no_hashing_here(monkeypatch):
    """Fail any bcrypt hash made on this (the loop's) thread."""
    real = bcrypt.hashpw
    loop_thread = threading.current_thread()

    def hashpw(password, salt):
        assert threading.current_thread() is not loop_thread, "bcrypt.hashpw on the loop's thread"
        return real(password, salt)

    monkeypatch.setattr(bcrypt, "hashpw", hashpw)


async def test_sign_up_stores_the_hash_made_in_the_pool(monkeypatch):
    no_hashing_here(monkeypatch)
    auth = authenticator()
    hashed = await workbench_auth._hash_in_pool(PASSWORD)
    with workbench_auth._using_hash(PASSWORD, hashed):
        info = auth.create_user("Ann", PASSWORD, email="", has_2fa=False)
    assert info.username == "ann"
    assert info.password == hashed
    assert not info.is_authorized
    assert bcrypt.checkpw(PASSWORD.encode(), UserInfo.find(auth.db, "ann").password)


def test_without_a_hash_from_the_pool_sign_up_hashes_as_before():
    auth = authenticator()
    with workbench_auth._using_hash("another password", b"$2b$12$unused"):
        info = auth.create_user("ann", PASSWORD)
    assert info.is_valid_password(PASSWORD)


SIGN_UP_CASES = {
    "plain": ({}, "ann", PASSWORD, {}),
    "name taken": ({"taken": True}, "ann", PASSWORD, {}),
    "comma in name": ({}, "a,nn", PASSWORD, {}),
    "space in name": ({}, "a nn", PASSWORD, {}),
    "too short": ({"minimum_password_length": 40}, "ann", PASSWORD, {}),
    "common password": ({"check_common_password": True}, "ann", "password", {}),
    "sign-up closed": ({"enable_signup": False}, "ann", PASSWORD, {}),
    "admin": ({"admin_users": {"ann"}}, "ann", PASSWORD, {}),
    "allowed user": ({"allowed_users": {"ann"}}, "ann", PASSWORD, {}),
    "open sign-up": ({"open_signup": True}, "ann", PASSWORD, {}),
    "bad e-mail": ({}, "ann", PASSWORD, {"email": "not an address"}),
    "2fa": ({}, "ann", PASSWORD, {"has_2fa": True}),
}


@pytest.mark.parametrize("case", SIGN_UP_CASES)
async def test_sign_up_rules_are_nativeauthenticators(case, monkeypatch):
    # Both sides hash with bcrypt.gensalt(): here at the lowest cost, to keep the table fast.
    gensalt = bcrypt.gensalt
    monkeypatch.setattr(bcrypt, "gensalt", lambda rounds=12, prefix=b"2b": gensalt(4, prefix))
    config, name, password, fields = SIGN_UP_CASES[case]
    taken = config.pop("taken", False)
    outcomes = []
    for cls in (NativeAuthenticator, WorkbenchAuthenticator):
        auth = cls(db=new_db())
        for key, value in config.items():
            setattr(auth, key, value)
        if taken:
            sign_up(auth, name)
        hashed = await password_checks.hash_password(password)
        with workbench_auth._using_hash(password, hashed):
            info = auth.create_user(name, password, **fields)
        outcomes.append(
            None
            if info is None
            else (info.username, info.is_authorized, info.has_2fa, info.email, info.is_valid_password(password))
        )
        if cls is WorkbenchAuthenticator and info is not None:
            assert info.password == hashed
    assert outcomes[0] == outcomes[1]


async def test_password_change_stores_the_hash_made_in_the_pool_under_the_same_rules(monkeypatch):
    no_hashing_here(monkeypatch)
    auth = authenticator(minimum_password_length=8)
    sign_up(auth, "ann")
    new = "another-long-passphrase"
    hashed = await workbench_auth._hash_in_pool(new)
    with workbench_auth._using_hash(new, hashed):
        assert auth.change_password("ann", new) is True
        assert auth.change_password("nobody", new) is None
    assert UserInfo.find(auth.db, "ann").password == hashed
    assert await log_in(auth, "ann", new) == "ann"
    short = "short"
    with workbench_auth._using_hash(short, await workbench_auth._hash_in_pool(short)):
        assert auth.change_password("ann", short) is None
    assert UserInfo.find(auth.db, "ann").password == hashed


# -- work that grew with the number of sign-ups -------------------------------------------------------------


def count_queries(db):
    seen = []
    event.listen(db.get_bind(), "before_cursor_execute", lambda *args: seen.append(args[2]))
    return seen


def test_authed_users_are_one_query_and_nativeauthenticators_set():
    db = new_db()
    ours = authenticator(db, admin_users={"boss"}, allowed_users={"guest"})
    native = NativeAuthenticator(db=db)
    native.admin_users, native.allowed_users = {"boss"}, {"guest"}
    for i in range(30):
        sign_up(ours, f"s{i}", authorized=i % 3 != 0)
    expected = native.get_authed_users()
    queries = count_queries(db)
    assert ours.get_authed_users() == expected
    assert len(queries) == 1
    assert ours.get_unauthed_amount() == native.get_unauthed_amount() == 10
