"""JupyterHub's SQLite database runs in WAL mode with synchronous=NORMAL."""

from sqlalchemy import create_engine, text

from workbench_hub.hub_db import tune_sqlite


def test_every_sqlite_engine_gets_wal_and_normal_sync(tmp_path):
    tune_sqlite()
    tune_sqlite()  # idempotent
    engine = create_engine(f"sqlite:///{tmp_path / 'jupyterhub.sqlite'}")
    with engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA synchronous")).scalar() == 1  # NORMAL
    engine.dispose()
