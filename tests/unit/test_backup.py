"""``workbench backup``: a consistent copy of the hub's databases, cookie secret and local config, while it runs.

The hub's data directory here is made as the hub makes it: JupyterHub's own
database through ``jupyterhub.orm`` (a user, an API token, NativeAuthenticator's
sign-up with its password hash), the GPU database through ``AllocationStore``
(a quota, a lease, a ledger row), the cookie secret and a local config file.
The backup is read back as an operator going back would: the copies open,
hold every row, and the GPU database's copy is read by this release's books.
While the backup runs, another thread keeps writing to the GPU database, as
the hub does. PostgreSQL's ``pg_dump`` is checked by restoring its dump into
a new database with ``pg_restore``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import threading
from datetime import UTC, datetime
from pathlib import Path

import bcrypt
import pytest
from jupyterhub import orm
from nativeauthenticator.orm import UserInfo
from sqlalchemy import create_engine, text

from tests.postgres.server import fresh_database
from workbench_hub import backup as bk
from workbench_hub import cli
from workbench_spawner.ledger.migrations import HEAD
from workbench_spawner.ledger.quota_book import QuotaBook
from workbench_spawner.ledger.store import AllocationStore
from workbench_spawner.release import version
from workbench_spawner.rules.quota import Quota

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
SECRET = b"\x8f" * 32
LOCAL_CONFIG = 'c.GPUSpawnerMixin.servers_per_device = {"T4-16GB": 4}\n'


def hub_database(path: Path) -> None:
    """JupyterHub's database as a hub with NativeAuthenticator leaves it: alice signed up, authorized, a token."""
    session = orm.new_session_factory(f"sqlite:///{path}")()
    session.add(orm.OAuthClient(identifier="jupyterhub"))  # the hub's own client, which tokens name
    user = orm.User(name="alice")
    session.add(user)
    session.commit()
    orm.APIToken.new(user=user, token="alice-token-0123456789", note="a script")
    session.add(
        UserInfo(username="alice", password=bcrypt.hashpw(b"correct horse", bcrypt.gensalt(4)), is_authorized=True)
    )
    session.commit()
    session.close()


def gpu_database(url: str) -> None:
    store = AllocationStore(url)
    QuotaBook(store).set("user", "alice", Quota(max_gpus=2, gpu_hours_per_week=10.0), by="admin")
    store.allocate("alice", "", 1, ["GPU-0"], node="wbhost")
    store.allocate("bob", "", 1, ["GPU-1"], node="wbhost")
    store.release("bob", "", "stopped")
    store.dispose()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    hub_database(data / "jupyterhub.sqlite")
    gpu_database(f"sqlite:///{data / 'workbench.sqlite'}")
    (data / "jupyterhub_cookie_secret").write_bytes(SECRET)
    (data / "jupyterhub_cookie_secret").chmod(0o600)
    return data


@pytest.fixture
def local_config(tmp_path: Path) -> Path:
    path = tmp_path / "jupyterhub_config.local.py"
    path.write_text(LOCAL_CONFIG)
    return path


ENV = {
    "WORKBENCH_BACKEND": "local",
    "WORKBENCH_ADMIN_TOKEN": "0123456789abcdef0123",
    "WORKBENCH_DB_URL": "",
    "WORKBENCH_PROXY_URL_EXAMPLE": "http://proxyuser:hunter2@proxy.example.org:3128",
    "JUPYTERHUB_API_TOKEN": "not ours",
}


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def assert_gpu_rows(url: str) -> None:
    """The GPU database at ``url`` (a backup's copy or its restore) holds what the tests wrote, read by this
    release: alice's quota of 2, her lease of GPU-0, bob's ended lease."""
    store = AllocationStore(url)
    try:
        assert QuotaBook(store).get("user", "alice").quota.max_gpus == 2
        assert [(lease.user, lease.gpu_uuids) for lease in store.leases()] == [("alice", ("GPU-0",))]
        assert [(row.user, row.reason) for row in store.usage()] == [("bob", "stopped")]
    finally:
        store.dispose()


def test_a_backup_holds_both_databases_the_secret_the_config_and_a_manifest(data_dir, local_config, tmp_path):
    target = tmp_path / "backups" / "before-upgrade"
    target.parent.mkdir()
    sources = bk.find_sources({**ENV, "WORKBENCH_DATA_DIR": str(data_dir)}, local_config=local_config)
    manifest = bk.backup(sources, target, {**ENV, "WORKBENCH_DATA_DIR": str(data_dir)}, now=lambda: NOW)

    names = sorted(p.name for p in target.iterdir())
    assert names == [
        "jupyterhub.sqlite",
        "jupyterhub_config.local.py",
        "jupyterhub_cookie_secret",
        "manifest.json",
        "workbench.sqlite",
    ]
    assert [p.name for p in target.parent.iterdir()] == ["before-upgrade"]  # no partial directory left
    assert mode(target) == 0o700
    assert {name: mode(target / name) for name in names} == dict.fromkeys(names, 0o600)
    assert (target / "jupyterhub_cookie_secret").read_bytes() == SECRET
    assert (target / "jupyterhub_config.local.py").read_text() == LOCAL_CONFIG

    # JupyterHub's copy: the user, her token and NativeAuthenticator's password hash, which still checks.
    hub = sqlite3.connect(target / "jupyterhub.sqlite")
    try:
        assert hub.execute("SELECT name FROM users").fetchall() == [("alice",)]
        assert hub.execute("SELECT note FROM api_tokens").fetchall() == [("a script",)]
        [(password, authorized)] = hub.execute("SELECT password, is_authorized FROM users_info").fetchall()
    finally:
        hub.close()
    assert bcrypt.checkpw(b"correct horse", password)
    assert authorized == 1

    # The GPU database's copy, read by this release: the quota, the lease, the ledger.
    assert_gpu_rows(f"sqlite:///{target / 'workbench.sqlite'}")

    on_disk = json.loads((target / "manifest.json").read_text())
    assert on_disk == manifest
    assert manifest["gpu_workbench_version"] == version()
    assert manifest["created"] == "2026-12-07T12:00:00+00:00"
    assert manifest["gpu_database"]["schema_revision"] == HEAD
    assert [(r["version"], r["revision"]) for r in manifest["gpu_database"]["releases"]] == [(version(), HEAD)]
    assert [f["file"] for f in manifest["files"]] == [
        "jupyterhub.sqlite",
        "workbench.sqlite",
        "jupyterhub_cookie_secret",
        "jupyterhub_config.local.py",
    ]
    for described in manifest["files"]:
        assert described["bytes"] == (target / described["file"]).stat().st_size
    assert manifest["settings"] == {
        "WORKBENCH_ADMIN_TOKEN": "(set; not recorded)",
        "WORKBENCH_BACKEND": "local",
        "WORKBENCH_DATA_DIR": str(data_dir),
        "WORKBENCH_DB_URL": "",
        "WORKBENCH_PROXY_URL_EXAMPLE": "http://proxyuser:***@proxy.example.org:3128",
    }
    text_of_manifest = (target / "manifest.json").read_text()
    assert "0123456789abcdef0123" not in text_of_manifest
    assert "hunter2" not in text_of_manifest


def test_the_backup_is_consistent_while_the_hub_writes(data_dir, tmp_path):
    """A thread allocates and releases as fast as it can during the backup: the copy passes SQLite's check
    and holds a state the database really had (every ledger row's lease gone, nothing half-written)."""
    url = f"sqlite:///{data_dir / 'workbench.sqlite'}"
    store = AllocationStore(url)
    stop = threading.Event()
    written = []

    def keep_writing() -> None:
        i = 0
        while not stop.is_set():
            store.allocate(f"user{i}", "", 1, [f"GPU-w{i % 4}"], node="wbhost")
            store.release(f"user{i}", "", "stopped")
            written.append(i)
            i += 1

    writer = threading.Thread(target=keep_writing, daemon=True)
    writer.start()
    try:
        while len(written) < 5:
            stop.wait(0.01)
        for n in range(3):
            bk.backup(bk.find_sources({"WORKBENCH_DATA_DIR": str(data_dir)}), tmp_path / f"b{n}", {})
    finally:
        stop.set()
        writer.join(30)
        store.dispose()
    assert len(written) > 5
    for n in range(3):
        copy = sqlite3.connect(tmp_path / f"b{n}" / "workbench.sqlite")
        try:
            assert copy.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            ended = {user for (user,) in copy.execute("SELECT user FROM gpu_usage WHERE user LIKE 'user%'")}
            held = {user for (user,) in copy.execute("SELECT user FROM gpu_leases WHERE user LIKE 'user%'")}
        finally:
            copy.close()
        assert not ended & held  # a lease is either held or in the ledger, never both
        assert len(held) <= 1  # the writer holds at most one lease at a time


def test_the_cli_writes_a_backup_and_says_what_is_in_it(data_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORKBENCH_DATA_DIR", str(data_dir))
    monkeypatch.delenv("WORKBENCH_DB_URL", raising=False)
    monkeypatch.delenv("WORKBENCH_LOCAL_CONFIG", raising=False)
    monkeypatch.setattr(bk, "CHECKOUT", tmp_path)  # no local config file there
    assert cli.main(["backup", str(tmp_path / "wb")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Backed up GPU Workbench {version()} into {tmp_path / 'wb'}:\n")
    assert "  jupyterhub_cookie_secret (32 bytes): the cookie secret (without it every user is logged out)\n" in out
    assert f"The GPU database is at schema revision {HEAD}.\n" in out
    manifest = json.loads((tmp_path / "wb" / "manifest.json").read_text())
    assert "jupyterhub_config.local.py: the hub has no local config file" in manifest["not_included"]


@pytest.mark.parametrize(
    ("case", "said", "code"),
    [
        (
            "no-data-dir",
            "there is no data directory at {tmp}/nowhere: pass the hub's with --data-dir or set "
            "WORKBENCH_DATA_DIR as the hub has it",
            2,
        ),
        ("existing", "{tmp}/existing already exists: a backup goes into a new directory", 2),
        ("no-parent", "{tmp}/no/such does not exist: create it, or name a backup directory in one that does", 2),
        (
            "no-hub-db",
            "there is no hub database at {tmp}/empty/jupyterhub.sqlite: is this the hub's data "
            "directory, and its database URL?",
            2,
        ),
        ("not-sqlite", "could not copy the GPU database {tmp}/data/workbench.sqlite: file is not a database", 1),
    ],
)
def test_bad_input_is_a_sentence_and_an_exit_code(data_dir, tmp_path, capsys, monkeypatch, case, said, code):
    monkeypatch.delenv("WORKBENCH_DB_URL", raising=False)
    monkeypatch.delenv("WORKBENCH_LOCAL_CONFIG", raising=False)
    data, target = data_dir, tmp_path / "target"
    if case == "no-data-dir":
        data = tmp_path / "nowhere"
    elif case == "existing":
        target = tmp_path / "existing"
        target.mkdir()
    elif case == "no-parent":
        target = tmp_path / "no" / "such" / "target"
    elif case == "no-hub-db":
        data = tmp_path / "empty"
        data.mkdir()
    elif case == "not-sqlite":
        (data_dir / "workbench.sqlite").write_bytes(b"not a database " * 200)
        for leftover in ("workbench.sqlite-wal", "workbench.sqlite-shm"):
            (data_dir / leftover).unlink(missing_ok=True)
    assert cli.main(["backup", str(target), "--data-dir", str(data)]) == code
    err = capsys.readouterr().err
    assert err == f"workbench: backup: {said.format(tmp=tmp_path)}\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no partial directory


def test_an_unwritable_place_is_said(data_dir, tmp_path):
    if os.geteuid() == 0:
        parent = Path("/sys")  # root may write anywhere a mode allows: /sys refuses even root
    else:
        parent = tmp_path / "read-only"
        parent.mkdir(mode=0o500)
    with pytest.raises(bk.BackupError) as refused:
        bk.backup(bk.find_sources({"WORKBENCH_DATA_DIR": str(data_dir)}), parent / "wb", {})
    assert refused.value.code == 2
    assert str(refused.value).startswith(f"cannot write a backup into {parent}: ")


def test_a_postgresql_database_without_pg_dump_is_said(monkeypatch, tmp_path):
    monkeypatch.setattr(bk.shutil, "which", lambda name: None)
    url = bk.make_url("postgresql+psycopg://workbench:s3cret@db.example.org/workbench")
    with pytest.raises(bk.BackupError) as refused:
        bk.dump_postgres(url, tmp_path / "workbench.pgdump", "GPU database")
    assert refused.value.code == 1
    assert str(refused.value) == (
        "the GPU database is PostgreSQL (postgresql+psycopg://workbench:***@db.example.org/workbench) and pg_dump "
        "is not installed: install PostgreSQL's client tools (Debian: apt install postgresql-client) and run the "
        "backup again"
    )


def test_a_postgresql_gpu_database_is_dumped_and_restores(data_dir, tmp_path):
    pg_restore = bk.shutil.which("pg_restore")
    if not bk.shutil.which("pg_dump") or not pg_restore:
        pytest.skip("PostgreSQL's client tools (pg_dump, pg_restore) are not installed")
    with fresh_database() as url, fresh_database() as restored_url:
        gpu_database(url)
        manifest = bk.backup(
            bk.find_sources({"WORKBENCH_DATA_DIR": str(data_dir)}, gpu_db_url=url), tmp_path / "wb", {}
        )
        dump = tmp_path / "wb" / "workbench.pgdump"
        assert dump.read_bytes()[:5] == b"PGDMP"
        assert mode(dump) == 0o600
        assert manifest["gpu_database"]["schema_revision"] == HEAD
        assert [f["file"] for f in manifest["files"]][:2] == ["jupyterhub.sqlite", "workbench.pgdump"]
        target = bk.make_url(restored_url).set(drivername="postgresql")
        done = bk.subprocess.run(
            [pg_restore, "--no-owner", f"--dbname={target.render_as_string(hide_password=False)}", str(dump)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert_gpu_rows(restored_url)
        engine = create_engine(restored_url)
        try:
            with engine.connect() as connection:
                assert connection.execute(text("SELECT version_num FROM alembic_version")).scalar() == HEAD
        finally:
            engine.dispose()
