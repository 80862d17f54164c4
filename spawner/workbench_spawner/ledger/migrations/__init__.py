"""Alembic migrations for the workbench database (leases, usage ledger, quotas).

``upgrade(engine)`` brings any database to the newest schema; the allocation
store calls it on start, so operators never run Alembic by hand. A database
created before migrations existed (by ``create_all``) is adopted: the first
revision creates only the tables that are missing.

To write a new revision after changing a table (from the repository root)::

    alembic -c spawner/workbench_spawner/ledger/migrations/alembic.ini revision -m "what changed"

and fill in ``upgrade``/``downgrade`` by hand (autogenerate works too:
``--autogenerate`` with ``WORKBENCH_DB_URL`` pointing at a current database),
and move ``HEAD`` on.

A database this release cannot use is refused with one sentence for the
operator (``UnusableDatabaseError``; the hub's config and the workbench
service print it as ``GPU Workbench: ...`` and stop): one from a newer
release, at a revision this one does not know (after a downgrade without
restoring the backup), named by the release recorded in it
(``ledger/release_book.py``); one whose migration fails; one that cannot be
opened at all. Every upgrade is one transaction, so a refused or failed
migration leaves the database as it was.
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
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError, ProgrammingError, SQLAlchemyError

from workbench_spawner.ledger.release_book import record_release, release_at
from workbench_spawner.release import version

HERE = Path(__file__).resolve().parent
HEAD = "0010"
# Where an operator reads how to go back (README links it).
GOING_BACK = "docs/upgrading.md, Going back"

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


class UnusableDatabaseError(ValueError):
    """A GPU database this release cannot use; its text is one sentence for the operator (what, and what to do).

    A ``ValueError``, as a bad setting is: the hub's config ends with it as with any
    other value it cannot run with (``finish.finish_hub`` prints ``GPU Workbench: ...``
    and exits with status 2), and so does the workbench service."""


def _first_line(exc: BaseException) -> str:
    """The database's own words for ``exc`` (its driver's message), on one line and short."""
    text = str(exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc)
    line = next((part.strip() for part in text.splitlines() if part.strip()), type(exc).__name__)
    return line if len(line) <= 200 else line[:197] + "..."


def known_revisions() -> set[str]:
    """Every schema revision this release has a migration for."""
    return {script.revision for script in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def too_new(where: str, revision: str, made_by: str | None) -> UnusableDatabaseError:
    """The sentence for a database at ``revision``, which this release does not know."""
    ours = version()
    if made_by:
        return UnusableDatabaseError(
            f"the GPU database {where} was last migrated by GPU Workbench {made_by} (schema revision {revision}), "
            f"a newer release than this one ({ours}, which knows revisions up to {HEAD}), so this release cannot use "
            f"it: to go back to {ours}, restore the backup taken before the upgrade and start {ours} again "
            f"({GOING_BACK}), or run GPU Workbench {made_by} or newer"
        )
    return UnusableDatabaseError(
        f"the GPU database {where} is at schema revision {revision}, which GPU Workbench {ours} does not know "
        f"(it knows revisions up to {HEAD}) and no release is recorded in it: it was made by a newer release, or it "
        f"is another program's database (check WORKBENCH_DB_URL); to go back to {ours}, restore the backup taken "
        f"before the upgrade ({GOING_BACK})"
    )


def migration_failed(where: str, found: str | None, exc: BaseException) -> UnusableDatabaseError:
    """The sentence for a migration that failed: the database is left as it was (one transaction)."""
    return UnusableDatabaseError(
        f"the GPU database {where} could not be migrated from schema revision {found or '(none)'} to {HEAD} "
        f"by GPU Workbench {version()} ({_first_line(exc)}); the migration was undone and the database is as it "
        f"was: start the release that made it again, or restore the backup taken before the upgrade ({GOING_BACK}), "
        "and report the error"
    )


def cannot_open(where: str, exc: BaseException) -> UnusableDatabaseError:
    """The sentence for a database that cannot be reached or read at all (nothing was migrated)."""
    return UnusableDatabaseError(
        f"cannot open the GPU database {where} ({_first_line(exc)}): check WORKBENCH_DB_URL (the hub's "
        f"gpu_db_url), that the file's directory can be written or the database server answers"
    )


def _refuse_unknown(connection: Connection, where: str) -> str | None:
    """The database's revision; raises ``UnusableDatabaseError`` when this release does not know it."""
    found = MigrationContext.configure(connection).get_current_heads()
    unknown = sorted(set(found) - known_revisions())
    if unknown:
        raise too_new(where, unknown[0], release_at(connection, unknown[0]))
    return found[0] if found else None


def upgrade(engine: Engine, revision: str = "head", retries: int = 5) -> None:
    """Run ``alembic upgrade head`` on ``engine``; safe when several stores start at once,
    in threads of one process or in several processes (see ``_migrating``).

    Refuses (``UnusableDatabaseError``) a database at a revision this release does not
    know, one whose migration fails and one that cannot be opened. Upgraded to the head,
    the database records this release (``release_book``), in the same transaction."""
    where = engine.url.render_as_string(hide_password=True)
    for attempt in range(retries):
        opened, found = False, None
        try:
            with _migrating(engine) as connection:
                opened = True
                found = _refuse_unknown(connection, where)
                config = alembic_config()
                config.attributes["connection"] = connection
                command.upgrade(config, revision)
                if revision == "head":
                    record_release(connection, version(), HEAD)
            return
        except (OperationalError, IntegrityError, ProgrammingError) as exc:
            # A database without advisory locks that another process migrated at the same
            # moment, or one that was busy past SQLite's busy_timeout: look again.
            if attempt == retries - 1:
                raise (migration_failed(where, found, exc) if opened else cannot_open(where, exc)) from exc
            time.sleep(0.2 * (attempt + 1))
        except (SQLAlchemyError, CommandError) as exc:
            # Not a race: a file that is not a database, a server that refused us, a migration that met a
            # schema it cannot change (a table missing, a view in the way): the operator's sentence, the
            # cause chained for a debugger.
            raise (migration_failed(where, found, exc) if opened else cannot_open(where, exc)) from exc


def downgrade(engine: Engine, revision: str) -> None:
    """Run ``alembic downgrade <revision>`` on ``engine``: how a test makes a database of an older release."""
    with _migrating(engine) as connection:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.downgrade(config, revision)


def current(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()
