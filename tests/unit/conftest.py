"""Fixtures the unit tests share."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.postgres.server import fresh_database
from workbench_spawner.ledger.store import AllocationStore

# The GPU database's two engines. The store promises the same behaviour on both, so every test
# that takes ``db_url`` or ``store`` runs once per engine: test_x[sqlite] and test_x[postgresql].
DATABASES = ("sqlite", "postgresql")


@pytest.fixture(params=DATABASES)
def db_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    """The URL of a fresh, empty GPU database for one test: a SQLite file in ``tmp_path``, or a new
    database on the tests' PostgreSQL server (tests/postgres/cluster.sh), dropped afterwards."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'wb.sqlite'}"
        return
    with fresh_database() as url:
        yield url


@pytest.fixture
def store(db_url: str) -> Iterator[AllocationStore]:
    """A fresh GPU database (migrated to the newest revision) for one test, on each engine."""
    s = AllocationStore(db_url)
    yield s
    s.dispose()


@pytest.fixture
def listen() -> Iterator[Callable[[Any], int]]:
    """``listen(app)``: a tornado app served on a free loopback port (returned), stopped after the test."""
    from tests.unit.test_quota_service import _free_port

    servers = []

    def start(app: Any) -> int:
        port = _free_port()
        servers.append(app.listen(port, "127.0.0.1"))
        return port

    yield start
    for server in servers:
        server.stop()
