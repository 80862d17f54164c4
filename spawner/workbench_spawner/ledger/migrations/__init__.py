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

import time
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

HERE = Path(__file__).resolve().parent
HEAD = "0007"


def alembic_config(url: str | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(HERE))
    if url:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(engine, revision: str = "head", retries: int = 5) -> None:
    """Run ``alembic upgrade head`` on ``engine`` (safe to race with another process)."""
    for attempt in range(retries):
        try:
            with engine.begin() as connection:
                config = alembic_config()
                config.attributes["connection"] = connection
                command.upgrade(config, revision)
            return
        except (OperationalError, IntegrityError, ProgrammingError):
            # Another process (the hub and the workbench service start
            # together) migrated at the same moment: look again.
            if attempt == retries - 1:
                raise
            time.sleep(0.2 * (attempt + 1))


def downgrade(engine, revision: str) -> None:
    """Run ``alembic downgrade <revision>`` on ``engine``: how a test makes a database of an older release."""
    with engine.begin() as connection:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.downgrade(config, revision)


def current(engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()
