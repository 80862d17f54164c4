"""Alembic migrations for the workbench database (leases, usage ledger, quotas).

``upgrade(engine)`` brings any database to the newest schema; the allocation
store calls it on start, so operators never run Alembic by hand. A database
created before migrations existed (by ``create_all``) is adopted: the first
revision creates only the tables that are missing.

To write a new revision after changing a table (from the repository root)::

    alembic -c spawner/workbench_spawner/ledger/migrations/alembic.ini revision -m "what changed"

and fill in ``upgrade``/``downgrade`` by hand (autogenerate works too:
``--autogenerate`` with ``WORKBENCH_DB_URL`` pointing at a current database).
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

HERE = Path(__file__).resolve().parent
HEAD = "0008"

# Alembic's command API is not thread-safe: ``command.upgrade`` installs the running
# environment in module globals (``alembic.context``, ``alembic.op``), so two upgrades in
# threads of one process break each other (``KeyError: 'config'``). Every upgrade or
# downgrade in this process goes through this lock, whatever database it is for: the
# hub's spawners, the workbench service and tests build stores from several threads.
_ALEMBIC_LOCK = threading.Lock()

# Across processes (the hub and the workbench service start together, or several hubs share
# one PostgreSQL database) the database itself serialises: on PostgreSQL a transaction-level
# advisory lock under this key, held until the upgrade's transaction ends; SQLite's
# BEGIN IMMEDIATE (store.make_engine) already makes a second writer wait. A fixed 63-bit key
# derived from a name, so no other application's advisory locks collide with it by accident.
ADVISORY_LOCK_KEY = zlib.crc32(b"gpu-workbench:alembic-migrations") | (0x5742 << 32)


def alembic_config(url: str | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(HERE))
    if url:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


@contextmanager
def _migrating(engine: Engine) -> Iterator[Connection]:
    """A transaction on ``engine`` that no other migration runs beside, in this process or another.

    The in-process lock comes first, so threads of one process queue here instead of each
    holding a database connection while they wait for the advisory lock."""
    with _ALEMBIC_LOCK, engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # Released by PostgreSQL when this transaction commits or rolls back, also when the
            # process dies mid-upgrade: a crash can never leave the lock held.
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADVISORY_LOCK_KEY})
        yield connection


def upgrade(engine: Engine, revision: str = "head", retries: int = 5) -> None:
    """Run ``alembic upgrade head`` on ``engine``; safe when several stores start at once,
    in threads of one process or in several processes (see ``_migrating``)."""
    for attempt in range(retries):
        try:
            with _migrating(engine) as connection:
                config = alembic_config()
                config.attributes["connection"] = connection
                command.upgrade(config, revision)
            return
        except (OperationalError, IntegrityError, ProgrammingError):
            # A database without advisory locks that another process migrated at the same
            # moment, or one that was busy past SQLite's busy_timeout: look again.
            if attempt == retries - 1:
                raise
            time.sleep(0.2 * (attempt + 1))


def downgrade(engine: Engine, revision: str) -> None:
    """Run ``alembic downgrade <revision>`` on ``engine``: how a test makes a database of an older release."""
    with _migrating(engine) as connection:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.downgrade(config, revision)


def current(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()
