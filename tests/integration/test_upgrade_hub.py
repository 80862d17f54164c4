"""Upgrading and going back with a real hub: the steps of docs/upgrading.md, as an operator takes them.

1. The GPU database of the release of 2026-12-06 (``tests/fixtures/releases``, made by
   that release's own code) is the data directory's when this release's hub starts: it
   is migrated, and the service answers with the quotas and reservations set then.
2. Users sign up and start servers; ``workbench backup`` runs while the hub does.
3. The hub stops (servers keep running); a newer release migrates the database
   (stood in for here: its schema revision and its release row), and the operator goes
   back without restoring: this release's real hub refuses with one sentence, status 2.
4. The operator restores the backup as the docs say (the files copied back, SQLite's
   ``-wal``/``-shm`` left behind removed) and starts this release: the running server is
   re-attached with its GPU, the password logs in, the quotas hold.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest
import requests

from tests.conftest import REPO, hub_form, hub_pool, native_sign_up
from workbench_spawner.ledger.migrations import HEAD
from workbench_spawner.release import version

pytestmark = pytest.mark.integration

FIXTURE = REPO / "tests" / "fixtures" / "releases" / "2026-12-06.sql"
NEWER = "2027.1.5"
PASSWORD = "admin-pass-1234"
DATABASES = ("jupyterhub.sqlite", "workbench.sqlite")


def release_database(hub) -> None:
    """The data directory starts with the 2026-12-06 release's GPU database (hub_pool's prepare)."""
    connection = sqlite3.connect(hub.data_dir / "workbench.sqlite")
    try:
        connection.executescript(FIXTURE.read_text(encoding="utf-8"))
    finally:
        connection.close()


def a_newer_release_migrates(path: Path) -> None:
    """What a newer release leaves: a schema revision this one does not know, and its row in workbench_releases."""
    connection = sqlite3.connect(path)
    try:
        connection.execute("UPDATE alembic_version SET version_num = '0042'")
        connection.execute(
            "INSERT INTO workbench_releases (version, revision, first_opened) VALUES (?, ?, ?)",
            (NEWER, "0042", "2027-01-05 10:00:00"),
        )
        connection.commit()
    finally:
        connection.close()


def revision(data: Path) -> str:
    """The GPU database's schema revision, read with a connection closed at once (the hub replaces the file)."""
    with closing(sqlite3.connect(data / "workbench.sqlite")) as db:
        return db.execute("SELECT version_num FROM alembic_version").fetchone()[0]


def quotas(hub) -> dict[tuple[str, str], tuple]:
    """Every stored quota, as the service lists it: (kind, name) -> (max GPUs, GPU-hours a week, MIG profiles)."""
    listed = hub.service("GET", "api/quotas").json()
    return {
        (kind, q["name"]): (q["max_gpus"], q["gpu_hours_per_week"], q["allowed_profiles"])
        for kind in ("user", "group")
        for q in listed[f"{kind}s"]
    }


def logs_in(hub) -> bool:
    r = hub_form(requests.Session(), hub.url, "/hub/login", {"username": "admin", "password": PASSWORD})
    return r.status_code == 302


def test_upgrade_back_up_go_back_and_restore(tmp_path):
    with hub_pool(tmp_path, prepare=release_database) as start:
        hub = start({"WORKBENCH_SIMULATED_GPUS": "4"})
        data = hub.data_dir
        # 1. Migrated on start, recorded as this release's; the quotas and reservations of 2026-12-06 answer.
        assert revision(data) == HEAD
        with closing(sqlite3.connect(data / "workbench.sqlite")) as db:
            assert (version(), HEAD) in db.execute("SELECT version, revision FROM workbench_releases").fetchall()
        assert quotas(hub) == {
            ("user", "alice"): (2, 10.0, None),
            ("group", "ml-course"): (1, 5.0, ["1g.18gb"]),
        }
        listed = hub.service("GET", "api/reservations").json()["reservations"]
        assert sorted((r["group"], r["gpus"], r["window"]) for r in listed) == [
            ("ml-course", 2, "Tue 10:00-12:00"),
            ("research", 1, "2026-12-08 14:00-16:00"),
        ]

        # 2. A user with a password, a running server with a GPU, and a backup while the hub runs.
        native_sign_up(requests.Session(), hub.url, "admin", PASSWORD)
        assert logs_in(hub)
        hub.create_users("grace")  # no quota of her own (alice's lease of 2026-12-01 spent her 10 GPU-hours)
        spawned = hub.spawn("grace", gpus=1)
        assert spawned.status_code in (201, 202), spawned.text
        hub.wait_ready("grace")
        pid = int(hub.server("grace")["state"]["pid"])
        held = hub.leases()["grace"]
        backup = tmp_path / "backup-before-upgrade"
        done = subprocess.run(
            [str(Path(sys.executable).parent / "workbench"), "backup", str(backup)],
            env={**hub.env, "WORKBENCH_DB_URL": ""},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert f"Backed up GPU Workbench {version()} into {backup}:" in done.stdout

        # 3. Stopped (the server keeps running), migrated by a newer release, then this release again.
        hub.stop()
        a_newer_release_migrates(data / "workbench.sqlite")
        logged = len(hub.log())
        with pytest.raises(RuntimeError, match="the hub exited with 2"):
            hub.start()
        said = [line for line in hub.log()[logged:].splitlines() if "GPU Workbench:" in line]
        assert said == [
            f"GPU Workbench: the GPU database sqlite:///{data / 'workbench.sqlite'} was last migrated by GPU "
            f"Workbench {NEWER} (schema revision 0042), a newer release than this one ({version()}, which knows "
            f"revisions up to {HEAD}), so this release cannot use it: to go back to {version()}, restore the "
            f"backup taken before the upgrade and start {version()} again (docs/upgrading.md, Going back), or run "
            f"GPU Workbench {NEWER} or newer"
        ]
        assert "Traceback" not in hub.log()[logged:]
        assert os.path.exists(f"/proc/{pid}"), "grace's server did not outlive the hub"

        # 4. Going back: the newer files removed, with SQLite's -wal and -shm beside them, and the backup's
        # copied in (docs/upgrading.md, Going back).
        for name in (*DATABASES, "jupyterhub_cookie_secret"):
            for gone in (name, f"{name}-wal", f"{name}-shm"):
                (data / gone).unlink(missing_ok=True)
            shutil.copy2(backup / name, data / name)
        hub.start()
        hub.wait_ready("grace")
        assert int(hub.server("grace")["state"]["pid"]) == pid
        assert hub.leases()["grace"] == held
        assert logs_in(hub)
        assert quotas(hub)[("user", "alice")] == (2, 10.0, None)
        assert revision(data) == HEAD
