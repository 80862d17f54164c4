"""The tests' PostgreSQL: where it is, and a fresh database for each test that needs one.

The server is the private one ``tests/postgres/cluster.sh start`` runs (``.ci/run`` starts it and
exports ``WORKBENCH_TEST_POSTGRES_URL``). Without it, or without psycopg, a PostgreSQL test is
skipped with the command that starts it, and fails under ``WORKBENCH_STRICT_TESTS=1``, where every
part must be present: the store's promise to work on PostgreSQL is only kept if CI checks it.

Each test gets its own database (``CREATE DATABASE wb_test_<random>``, dropped afterwards, with any
connection it left), so PostgreSQL tests stay as independent as SQLite files in ``tmp_path``.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import secrets
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from tests.conftest import missing

CLUSTER = Path(__file__).resolve().parent / "cluster.sh"
START_HINT = f"start it with `{CLUSTER.relative_to(CLUSTER.parents[2])} start` (or set WORKBENCH_TEST_POSTGRES_URL)"


@functools.cache
def server_url() -> str | None:
    """The test server's URL (a database every test may create databases from), or None.

    WORKBENCH_TEST_POSTGRES_URL wins; otherwise the server this checkout's cluster.sh runs, if any,
    so a developer does not have to export anything after starting it. Asked once per test run:
    a missing server must not cost every one of hundreds of tests a subprocess."""
    url = os.environ.get("WORKBENCH_TEST_POSTGRES_URL", "").strip()
    if url:
        return url
    try:
        done = subprocess.run([str(CLUSTER), "url"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def require_server() -> str:
    """The server's URL; skips (fails under WORKBENCH_STRICT_TESTS=1) with a sentence where it is missing."""
    if importlib.util.find_spec("psycopg") is None:  # SQLAlchemy's postgresql+psycopg driver
        missing("psycopg is not installed: the PostgreSQL tests need the postgres extra (make install)")
    url = server_url()
    if url is None:
        missing(f"no PostgreSQL server for the tests: {START_HINT}")
    if make_url(url).drivername != "postgresql+psycopg":
        raise ValueError(f"WORKBENCH_TEST_POSTGRES_URL must be a postgresql+psycopg:// URL, not {url!r}")
    return url


@contextmanager
def fresh_database(prefix: str = "wb_test") -> Iterator[str]:
    """A new, empty database on the test server for one test: its URL; dropped afterwards."""
    base = make_url(require_server())
    name = f"{prefix}_{secrets.token_hex(6)}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except SQLAlchemyError as exc:  # refused, or no such role
        admin.dispose()
        missing(f"the PostgreSQL server at {base.render_as_string()} refused CREATE DATABASE ({exc}): {START_HINT}")
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        # FORCE (PostgreSQL 13+): a store the test forgot to dispose must not keep its database alive.
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
