"""Several stores starting at once: the schema migration must be serialised.

The hub's spawners, the workbench service and several hubs on one PostgreSQL database all build an
``AllocationStore`` when they start, and each runs ``alembic upgrade head``. Alembic's command API
keeps its running environment in module globals, so two upgrades in threads of one process break
each other (``KeyError: 'config'``); two processes both create the same tables in the same moment.
SQLite's BEGIN IMMEDIATE happened to hide both; on PostgreSQL nothing did. Each test here runs on
both engines (the ``db_url`` fixture) and, on PostgreSQL, failed before the migration lock.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

from sqlalchemy import create_engine, inspect, text

from tests.postgres.server import fresh_database
from workbench_spawner.ledger.migrations import ADVISORY_LOCK_KEY, HEAD, current
from workbench_spawner.ledger.store import AllocationStore

THREADS = 8


def build_stores_at_once(urls: list[str]) -> list[BaseException]:
    """Build one AllocationStore per URL, each in its own thread, all released by one barrier."""
    barrier = threading.Barrier(len(urls))
    errors: list[BaseException] = []

    def one(url: str) -> None:
        try:
            barrier.wait()
            AllocationStore(url).dispose()
        except BaseException as exc:  # noqa: BLE001 - a thread's error, handed to the test's assertion
            errors.append(exc)

    # Daemon threads: a migration that deadlocks (as unserialised upgrades on PostgreSQL did, one
    # thread's transaction left open by Alembic's broken globals) must fail the test, not hang pytest.
    threads = [threading.Thread(target=one, args=(url,), daemon=True) for url in urls]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = sum(t.is_alive() for t in threads)
    assert not stuck, f"{stuck} of {len(threads)} stores still migrating after 60 s (errors: {errors!r})"
    return errors


def test_stores_built_in_threads_at_once_migrate_one_database(db_url):
    errors = build_stores_at_once([db_url] * THREADS)
    assert not errors, [repr(e) for e in errors]
    store = AllocationStore(db_url)
    assert current(store.engine) == HEAD
    assert store.allocate("alice", "", 1, ["GPU-a"]) is not None
    store.dispose()


def test_stores_on_separate_databases_in_threads_at_once(tmp_path):
    """Alembic's globals are per process, not per database: separate SQLite files broke each other too."""
    urls = [f"sqlite:///{tmp_path / f'wb{i}.sqlite'}" for i in range(THREADS)]
    errors = build_stores_at_once(urls)
    assert not errors, [repr(e) for e in errors]
    for url in urls:
        engine = create_engine(url)
        assert current(engine) == HEAD
        engine.dispose()


# One process of the race: waits for the common start time, then upgrades once, without the retry
# that used to paper over a lost race (a second CREATE TABLE of the same table fails).
PROCESS = textwrap.dedent(
    """
    import sys, time
    from workbench_spawner.ledger.migrations import upgrade
    from workbench_spawner.ledger.store import make_engine
    url, go = sys.argv[1], float(sys.argv[2])
    engine = make_engine(url)
    time.sleep(max(0.0, go - time.time()))
    upgrade(engine, retries=1)
    engine.dispose()
    print("migrated")
    """
)


def start_processes(url: str, count: int, delay: float = 3.0) -> list[subprocess.Popen]:
    go = time.time() + delay  # after every interpreter has imported SQLAlchemy and Alembic
    return [
        subprocess.Popen(
            [sys.executable, "-c", PROCESS, url, str(go)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for _ in range(count)
    ]


def finish(procs: list[subprocess.Popen], timeout: float = 120) -> list[tuple[int, str]]:
    return [(p.returncode, out) for p in procs for out in [p.communicate(timeout=timeout)[0]]]


def test_two_processes_migrate_one_database_at_once(db_url):
    results = finish(start_processes(db_url, 2))
    assert all(rc == 0 for rc, _ in results), results
    engine = create_engine(db_url)
    assert current(engine) == HEAD
    engine.dispose()


def test_on_postgresql_a_migration_waits_for_the_advisory_lock():
    """The cross-process guarantee itself: while another session holds the migration lock, a starting
    store migrates nothing; once it is released, both processes finish. (PostgreSQL only: SQLite
    serialises writers with BEGIN IMMEDIATE, which the test above covers.)"""
    with fresh_database() as db_url:
        waits_for_the_lock(db_url)


def waits_for_the_lock(db_url: str) -> None:
    holder = create_engine(db_url)
    with holder.connect() as conn:
        conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": ADVISORY_LOCK_KEY})
        conn.commit()
        procs = start_processes(db_url, 2, delay=1.0)
        time.sleep(4.0)  # long enough for an unserialised upgrade to have created its tables
        still_waiting = [p.poll() is None for p in procs]
        tables = inspect(holder).get_table_names()
        conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": ADVISORY_LOCK_KEY})
        conn.commit()
        results = finish(procs)
    holder.dispose()
    assert still_waiting == [True, True], results
    assert "gpu_leases" not in tables, tables
    assert "alembic_version" not in tables, tables
    assert all(rc == 0 for rc, _ in results), results
    engine = create_engine(db_url)
    assert current(engine) == HEAD
    engine.dispose()
