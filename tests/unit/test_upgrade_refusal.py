"""A GPU database this release cannot use stops the hub and the service with one ``GPU Workbench:`` sentence.

Issue 45: after a downgrade, a database a newer release had migrated stopped
the hub with a 60-line Alembic traceback ending in "Can't locate revision
identified by '0008'". Now the store refuses it with one sentence that names
the release that made it (``workbench_releases``) and says what to do; a
migration that fails is undone and said the same way; the hub's config
(``finish.finish_hub``) and the workbench service print it and end with
status 2. The real hub's start on such a data directory is
``tests/integration/test_upgrade_hub.py``.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import create_engine, insert, text
from sqlalchemy.engine import make_url

from tests.conftest import REPO, free_port
from workbench_hub import finish
from workbench_spawner.ledger.migrations import HEAD, UnusableDatabaseError, current
from workbench_spawner.ledger.release_book import ReleaseRow
from workbench_spawner.ledger.store import AllocationStore
from workbench_spawner.release import version

NEWER = "2027.1.5"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "releases"


def made_by_a_newer_release(url: str, revision: str = "0042", release: str | None = NEWER) -> None:
    """Make ``url`` a database as a newer release leaves it: at ``revision``, with ``release`` recorded."""
    AllocationStore(url).dispose()
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(text("UPDATE alembic_version SET version_num = :r"), {"r": revision})
            if release:
                connection.execute(
                    insert(ReleaseRow).values(
                        version=release, revision=revision, first_opened=datetime(2027, 1, 5, tzinfo=UTC)
                    )
                )
    finally:
        engine.dispose()


def where(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def refusal(url: str) -> str:
    """The sentence for the database ``made_by_a_newer_release`` leaves."""
    ours = version()
    return (
        f"the GPU database {where(url)} was last migrated by GPU Workbench {NEWER} (schema revision 0042), a newer "
        f"release than this one ({ours}, which knows revisions up to {HEAD}), so this release cannot use it: to go "
        f"back to {ours}, restore the backup taken before the upgrade and start {ours} again (docs/upgrading.md, "
        f"Going back), or run GPU Workbench {NEWER} or newer"
    )


def state(url: str) -> tuple[str | None, list[tuple]]:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(text("SELECT version, revision FROM workbench_releases ORDER BY version"))
            return current(engine), [tuple(row) for row in rows]
    finally:
        engine.dispose()


def test_a_database_from_a_newer_release_is_refused_naming_that_release(db_url):
    made_by_a_newer_release(db_url)
    before = state(db_url)
    with pytest.raises(UnusableDatabaseError) as refused:
        AllocationStore(db_url)
    assert str(refused.value) == refusal(db_url)
    assert state(db_url) == before == ("0042", sorted([(NEWER, "0042"), (version(), HEAD)]))


def test_an_unknown_revision_with_no_release_recorded_is_refused_too(tmp_path):
    url = f"sqlite:///{tmp_path / 'gpu.sqlite'}"
    made_by_a_newer_release(url, revision="4621fec11365", release=None)  # e.g. JupyterHub's own database
    with pytest.raises(UnusableDatabaseError) as refused:
        AllocationStore(url)
    assert str(refused.value) == (
        f"the GPU database {url} is at schema revision 4621fec11365, which GPU Workbench {version()} does not "
        f"know (it knows revisions up to {HEAD}) and no release is recorded in it: it was made by a newer release, "
        f"or it is another program's database (check WORKBENCH_DB_URL); to go back to {version()}, restore the "
        "backup taken before the upgrade (docs/upgrading.md, Going back)"
    )


def test_a_migration_that_fails_is_undone_and_said_in_one_sentence(tmp_path):
    """The 2026-12-04 release's database with a view over gpu_quotas: migration 0005 alters gpu_leases and
    gpu_usage, then cannot rebuild gpu_quotas under the view; everything it did is undone."""
    path = tmp_path / "gpu.sqlite"
    connection = sqlite3.connect(path)
    connection.executescript((FIXTURES / "2026-12-04.sql").read_text(encoding="utf-8"))
    connection.execute("CREATE VIEW quota_report AS SELECT name, max_gpus FROM gpu_quotas")
    connection.commit()
    connection.close()
    url = f"sqlite:///{path}"
    with pytest.raises(UnusableDatabaseError) as refused:
        AllocationStore(
            url,
        )
    assert str(refused.value) == (
        f"the GPU database {url} could not be migrated from schema revision 0004 to {HEAD} by GPU Workbench "
        f"{version()} (error in view quota_report: no such table: main.gpu_quotas); the migration was undone and "
        "the database is as it was: start the release that made it again, or restore the backup taken before the "
        "upgrade (docs/upgrading.md, Going back), and report the error"
    )
    connection = sqlite3.connect(path)
    try:
        assert connection.execute("SELECT version_num FROM alembic_version").fetchall() == [("0004",)]
        assert "share" not in {row[1] for row in connection.execute("PRAGMA table_info(gpu_leases)")}
        assert connection.execute("SELECT COUNT(*) FROM gpu_quotas").fetchone() == (2,)
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda tmp: tmp / "missing" / "gpu.sqlite", "unable to open database file"),
        (
            lambda tmp: (tmp / "junk.sqlite").write_text("not a database " * 100) and tmp / "junk.sqlite",
            "file is not a database",
        ),
    ],
    ids=["no-directory", "not-a-database"],
)
def test_a_database_that_cannot_be_opened_is_said(tmp_path, make, said):
    url = f"sqlite:///{make(tmp_path)}"
    with pytest.raises(UnusableDatabaseError) as refused:
        AllocationStore(url)
    assert str(refused.value) == (
        f"cannot open the GPU database {url} ({said}): check WORKBENCH_DB_URL (the hub's gpu_db_url), that the "
        "file's directory can be written or the database server answers"
    )


def test_the_hub_config_ends_with_the_sentence_and_status_2(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'wb.sqlite'}"
    made_by_a_newer_release(url)
    c = finish.Config()
    c.JupyterHub.spawner_class = "gpu-local"
    c.GPUSpawnerMixin.gpu_db_url = url
    c.GPUSpawnerMixin.simulated_gpus = "2"
    with pytest.raises(SystemExit) as exited:
        finish.finish_hub(c, c)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.strip() == f"GPU Workbench: {refusal(url)}"


def test_the_workbench_service_ends_with_the_same_sentence_and_status_2(tmp_path):
    url = f"sqlite:///{tmp_path / 'wb.sqlite'}"
    made_by_a_newer_release(url)
    done = subprocess.run(
        [sys.executable, "-m", "workbench_hub.service", f"--db-url={url}", f"--port={free_port()}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    said = [line for line in done.stderr.splitlines() if "GPU Workbench:" in line]
    assert said == [f"GPU Workbench: {refusal(url)}"], done.stderr
    assert "Traceback" not in done.stderr
