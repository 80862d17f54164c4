"""JupyterHub's own SQLite database, tuned so a burst of spawns does not stall the hub.

JupyterHub commits to its database on the event loop several times per spawn
(the spawner row, the server's API token, its OAuth client). In SQLite's
default rollback-journal mode every commit waits for fsync, and with 30
students pressing Start at once those waits line up on the loop: measured
with ``benchmarks/hub_responsiveness.py``, most of the hub's stall was there.
WAL with ``synchronous=NORMAL`` turns each commit into one append to the
write-ahead log, synced at checkpoints; a power loss may lose the last few
commits, never the database. The GPU database (``workbench_spawner.ledger.store``)
sets the same pragmas on its own connections.
"""

from __future__ import annotations

import sqlite3

from sqlalchemy import event
from sqlalchemy.engine import Engine

_installed = False


def _pragmas(dbapi_connection, _record) -> None:
    if not isinstance(dbapi_connection, sqlite3.Connection):
        return
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
    finally:
        cursor.close()


def tune_sqlite() -> None:
    """Apply WAL and synchronous=NORMAL to every SQLite connection this process opens."""
    global _installed
    if not _installed:
        event.listen(Engine, "connect", _pragmas)
        _installed = True
