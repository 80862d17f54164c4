"""Connections to the GPU database: engines tuned for SQLite's and PostgreSQL's ways of sharing one database.

The store (``store.py``) and the other books open their database through ``make_engine``; a write
transaction that reads the leases and then changes them takes ``lock_leases`` first. Kept apart from
the store's rows and queries because this is about how the two databases let several writers (threads,
the hub and the workbench service, several hubs) work on one database at once, not about leases.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.orm import Session

# The lease table (``store.LeaseRow``): its name is needed here to lock it.
LEASES_TABLE = "gpu_leases"


def make_engine(url: str, *, readonly: bool = False) -> Engine:
    """An engine that is safe to share between threads and processes.

    ``readonly`` engines (SQLite) open deferred transactions: with WAL a
    reader sees the last commit and takes no lock a writer waits for.
    """
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:  # DB-API objects: untyped
            # Let pysqlite leave transactions to us, so BEGIN IMMEDIATE is ours.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            _switch_to_wal(cur)
            # In WAL mode a crash may lose the last commits, never the database.
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Connection) -> None:
            conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")

        return engine
    return create_engine(url, pool_pre_ping=True)


def _switch_to_wal(cursor: Any, within: float = 30.0) -> None:
    """``PRAGMA journal_mode=WAL``, waiting while another connection holds the database: on a new file, two
    processes starting at once (the hub and the workbench service) both switch it, and SQLite answers the
    second "database is locked" at once, without its busy timeout. Once a file is in WAL mode it stays so,
    and the pragma is a no-op."""
    deadline = time.monotonic() + within
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def lock_leases(session: Session) -> None:
    """Make this write transaction the only one that reads and then changes the leases, until it ends.

    On SQLite BEGIN IMMEDIATE does it already. On PostgreSQL, at READ COMMITTED, a transaction's reads do
    not wait for another's writes: an allocation could pick a device from what it read, while a MIG layout
    change (``inventory_refresh.held_for_layout``) read the leases without it and put a layout in force
    that no longer has the device. The table lock (SHARE ROW EXCLUSIVE conflicts with itself, not with
    plain reads) queues such writers instead; readers (the form, the fleet view) never wait."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text(f"LOCK TABLE {LEASES_TABLE} IN SHARE ROW EXCLUSIVE MODE"))
