"""Fixtures the unit tests share."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import SimpleNamespace
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


@pytest.fixture
def local_spawner(tmp_path) -> Iterator[Callable[[str], Any]]:
    """``local_spawner(user)``: a local-backend GPU spawner of ``user`` on one simulated GPU, outside a hub
    (a GPU database in ``tmp_path``, homes under ``tmp_path/homes``); the process-wide policies are forgotten
    before and after."""
    from workbench_spawner.backends.local.spawner import LocalGPUSpawner
    from workbench_spawner.policy.gpu_policy import _policies

    _policies.clear()

    def make(user: str) -> LocalGPUSpawner:
        return LocalGPUSpawner(
            user=SimpleNamespace(name=user, url=f"/user/{user}/", escaped_name=user),
            hub=SimpleNamespace(public_host="", api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/"),
            orm_spawner=SimpleNamespace(name="", server=None),
            gpu_db_url=f"sqlite:///{tmp_path / 'wb.sqlite'}",
            simulated_gpus="1",
            home_dir_template=str(tmp_path / "homes" / "{username}"),
        )

    yield make
    _policies.clear()
