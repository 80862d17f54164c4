"""The real hub with its GPU database on PostgreSQL (WORKBENCH_DB_URL=postgresql+psycopg://...).

The README promises one store for SQLite and PostgreSQL. This runs the whole path once on a real
PostgreSQL 15 (tests/postgres/cluster.sh): the hub and the workbench service start together on a new,
empty database (both migrate it at once), a server gets a simulated GPU, its lease is read back from
PostgreSQL itself, and stopping it moves the lease to the usage ledger there. Nothing may fall back
to the default SQLite file.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text

from tests.conftest import process_env
from tests.postgres.server import fresh_database
from workbench_spawner.ledger.migrations import HEAD

pytestmark = pytest.mark.integration


@pytest.fixture
def postgres_db_url() -> Iterator[str]:
    """A new database for the hub; requested before ``running_hub``, so it is dropped after the hub stopped."""
    with fresh_database("wb_hub") as url:
        yield url


def test_the_hub_keeps_leases_and_usage_in_postgresql(postgres_db_url, running_hub):
    hub = running_hub({"WORKBENCH_SIMULATED_GPUS": "2", "WORKBENCH_DB_URL": postgres_db_url})
    hub.create_users("alice")
    assert hub.spawn("alice", gpus=1).status_code in (201, 202)
    server = hub.wait_ready("alice")
    gpus = process_env(int(server["state"]["pid"]))["WORKBENCH_GPUS"].split(",")
    assert len(gpus) == 1, gpus
    assert gpus[0].startswith("GPU-sim-"), gpus

    engine = create_engine(postgres_db_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == HEAD
            leases = conn.execute(text('SELECT "user", server, gpu_uuid FROM gpu_leases')).all()
        assert [tuple(row) for row in leases] == [("alice", "", gpus[0])]
        assert not (hub.data_dir / "workbench.sqlite").exists(), "the GPU database fell back to SQLite"
        # The workbench service reads the same PostgreSQL database.
        r = hub.service("GET", "api/allocations")
        assert r.status_code == 200, r.text
        assert "alice" in r.text, r.text
        assert gpus[0] in r.text, r.text

        assert hub.api("DELETE", "/users/alice/server").status_code in (202, 204)
        hub.wait_stopped("alice")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM gpu_leases")).scalar_one() == 0
            usage = conn.execute(text('SELECT "user", gpu_uuid, started, ended, reason FROM gpu_usage')).all()
    finally:
        engine.dispose()
    assert len(usage) == 1, usage
    user, uuid, started, ended, reason = usage[0]
    assert (user, uuid) == ("alice", gpus[0])
    assert started <= ended, usage
    assert reason, usage
