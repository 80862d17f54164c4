"""``workbench backup DIR``: a consistent copy of what the hub keeps, taken while it runs, into a new directory.

    workbench backup /srv/backups/workbench-2026-12-07          # before an upgrade (docs/upgrading.md)
    workbench backup /srv/backups/wb --data-dir /srv/workbench/data --db-url postgresql+psycopg://...

What goes in, each under the name it has in the data directory, so that
going back is copying the files back (docs/upgrading.md, Going back):

* ``jupyterhub.sqlite``: JupyterHub's database (users, groups, API tokens,
  the servers it runs, NativeAuthenticator's sign-ups and password hashes);
* ``workbench.sqlite``: the GPU database (leases, the usage ledger, quotas,
  reservations, drains, notices, the published settings, the hub's id); on
  PostgreSQL ``workbench.pgdump`` instead (``pg_dump --format=custom``, put
  back with ``pg_restore``);
* ``jupyterhub_cookie_secret``: without it every user is logged out;
* ``jupyterhub_config.local.py``, the local config file, if there is one;
* ``manifest.json``: the release, the date, what each file is (size,
  SHA-256), the GPU database's schema revision and the releases that opened
  it, and the ``WORKBENCH_*`` settings this command saw, secrets left out.

SQLite databases are copied with SQLite's online backup
(``sqlite3.Connection.backup``): one consistent snapshot even while the hub
writes, never a half-written page as a file copy could take. ``pg_dump``
reads PostgreSQL in one snapshot too. Each database is consistent in
itself; the two are taken a moment apart, which a restart reconciles (the
hub compares the GPU ledger with the servers that run).

Not copied: the users' homes and volumes (their notebooks and data: back
them up with the site's usual tools) and Caddy's certificates.

Every file is written readable by its owner only (0600, the directory
0700): the databases hold password hashes and tokens. The backup is
written into a temporary sibling of DIR and renamed into place when it is
complete, so DIR either holds a whole backup or does not exist. Bad input
(no data directory, an existing or unwritable DIR) is a sentence and exit
code 2; a database that cannot be copied (pg_dump missing or failing) is
exit code 1.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import create_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from workbench_spawner.ledger.migrations import HEAD, current
from workbench_spawner.ledger.release_book import releases
from workbench_spawner.release import version

# hub/workbench_hub/backup.py -> the checkout, where `make run` keeps ./data and hub/jupyterhub_config.local.py.
CHECKOUT = Path(__file__).resolve().parents[2]
HUB_DB = "jupyterhub.sqlite"
GPU_DB = "workbench.sqlite"
GPU_DUMP = "workbench.pgdump"
COOKIE_SECRET = "jupyterhub_cookie_secret"
LOCAL_CONFIG = "jupyterhub_config.local.py"
MANIFEST = "manifest.json"
# A setting whose name says it holds a secret is recorded as set, never with its value.
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD", re.IGNORECASE)
# user:password@ in any URL-like value (WORKBENCH_DB_URL, a proxy URL...).
URL_PASSWORD = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://[^:/@\s]*):[^@\s]*@", re.IGNORECASE)


class BackupError(Exception):
    """A backup that could not be made: ``code`` 2 for bad input, 1 for a database that could not be copied."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Sources:
    """Where the hub keeps what is backed up, as the hub's config finds it (``configurer``)."""

    data_dir: Path
    hub_db_url: str
    gpu_db_url: str
    local_config: Path | None  # None: the hub has no local config file

    @property
    def cookie_secret(self) -> Path:
        return self.data_dir / COOKIE_SECRET


def default_data_dir(env: Mapping[str, str]) -> Path:
    """$WORKBENCH_DATA_DIR, else the checkout's ``data`` (as ``make run`` keeps it)."""
    return Path(env.get("WORKBENCH_DATA_DIR") or CHECKOUT / "data")


def find_sources(
    env: Mapping[str, str],
    data_dir: Path | None = None,
    gpu_db_url: str | None = None,
    hub_db_url: str | None = None,
    local_config: Path | None = None,
) -> Sources:
    """What to back up: the arguments given, else where the hub's config puts each (its environment's rules)."""
    data = (data_dir or default_data_dir(env)).resolve()
    if not data.is_dir():
        raise BackupError(
            f"there is no data directory at {data}: pass the hub's with --data-dir or set WORKBENCH_DATA_DIR "
            "as the hub has it",
            2,
        )
    if local_config is None:
        named = env.get("WORKBENCH_LOCAL_CONFIG")
        local_config = Path(named) if named else CHECKOUT / "hub" / LOCAL_CONFIG
        if not named and not local_config.is_file():
            local_config = None  # the hub has none either: it is optional
    if local_config is not None and not local_config.is_file():
        raise BackupError(f"the local config file {local_config} is not a file", 2)
    return Sources(
        data_dir=data,
        hub_db_url=hub_db_url or f"sqlite:///{data / HUB_DB}",
        gpu_db_url=gpu_db_url or env.get("WORKBENCH_DB_URL") or f"sqlite:///{data / GPU_DB}",
        local_config=local_config,
    )


def settings_without_secrets(env: Mapping[str, str]) -> dict[str, str]:
    """The ``WORKBENCH_*`` settings: tokens and passwords left out, URLs without their password."""
    settings = {}
    for name in sorted(env):
        if not name.startswith("WORKBENCH_"):
            continue
        if SECRET_NAME.search(name):
            settings[name] = "(set; not recorded)" if env[name] else ""
        else:
            settings[name] = URL_PASSWORD.sub(r"\g<scheme>:***@", env[name])
    return settings


def _url(text: str, what: str) -> URL:
    try:
        return make_url(text)
    except ArgumentError:
        raise BackupError(
            f"{what} {text!r} is not a database URL (e.g. sqlite:///path or postgresql+psycopg://...)", 2
        ) from None


def _sqlite_path(url: URL, what: str) -> Path:
    if not url.database or url.database == ":memory:":
        raise BackupError(f"{what} {url} is not a SQLite file", 2)
    path = Path(url.database).resolve()
    if not path.is_file():
        raise BackupError(f"there is no {what} at {path}: is this the hub's data directory, and its database URL?", 2)
    return path


def copy_sqlite(source: Path, dest: Path, what: str) -> None:
    """SQLite's online backup of ``source`` into ``dest``: one snapshot, also while another process writes."""
    try:
        # mode=rw: never create an empty database where the hub's should be.
        src = sqlite3.connect(f"file:{quote(str(source))}?mode=rw", uri=True, timeout=30)
        try:
            src.execute("PRAGMA busy_timeout=30000")
            out = sqlite3.connect(dest)
            try:
                src.backup(out)
                ok = out.execute("PRAGMA quick_check").fetchone()[0]
            finally:
                out.close()
        finally:
            src.close()
    except sqlite3.Error as exc:
        raise BackupError(f"could not copy the {what} {source}: {exc}") from None
    if ok != "ok":
        raise BackupError(f"the copy of the {what} {source} fails SQLite's check ({ok}); the database may be damaged")


def dump_postgres(url: URL, dest: Path, what: str, pg_dump: str | None = None) -> None:
    """``pg_dump --format=custom`` of ``url`` into ``dest`` (one snapshot); the password goes by PGPASSWORD."""
    program = pg_dump or shutil.which("pg_dump")
    if not program:
        raise BackupError(
            f"the {what} is PostgreSQL ({url.render_as_string(hide_password=True)}) and pg_dump is not installed: "
            "install PostgreSQL's client tools (Debian: apt install postgresql-client) and run the backup again"
        )
    libpq = url.set(drivername="postgresql", password=None).render_as_string(hide_password=False)
    env = {**os.environ, **({"PGPASSWORD": str(url.password)} if url.password else {})}
    try:
        done = subprocess.run(
            [program, "--format=custom", f"--file={dest}", f"--dbname={libpq}"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError as exc:
        raise BackupError(f"could not run {program} for the {what}: {exc}") from None
    if done.returncode != 0:
        said = next((line for line in done.stderr.splitlines() if line.strip()), f"exit code {done.returncode}")
        raise BackupError(f"pg_dump could not dump the {what} {url.render_as_string(hide_password=True)}: {said}")


def copy_database(text: str, dest_dir: Path, sqlite_name: str, dump_name: str, what: str) -> tuple[Path, str]:
    """Back up the database at URL ``text`` into ``dest_dir``; the file written and its kind."""
    url = _url(text, what)
    backend = url.get_backend_name()
    if backend == "sqlite":
        dest = dest_dir / sqlite_name
        copy_sqlite(_sqlite_path(url, what), dest, what)
    elif backend == "postgresql":
        dest = dest_dir / dump_name
        dump_postgres(url, dest, what)
    else:
        raise BackupError(f"the {what} is {backend}; workbench backup copies SQLite and PostgreSQL databases", 2)
    dest.chmod(0o600)
    return dest, backend


def gpu_schema(text: str) -> dict[str, Any]:
    """The GPU database's schema revision and the releases that opened it (``release_book``), as it is now."""
    engine = create_engine(text)
    try:
        with engine.connect() as connection:
            recorded = [
                {"version": r.version, "revision": r.revision, "first_opened": r.first_opened.isoformat()}
                for r in releases(connection)
            ]
        return {"schema_revision": current(engine), "this_release_knows_up_to": HEAD, "releases": recorded}
    except SQLAlchemyError as exc:
        return {"schema_revision": None, "unreadable": str(exc).splitlines()[0]}
    finally:
        engine.dispose()


def _described(path: Path, what: str) -> dict[str, Any]:
    return {
        "file": path.name,
        "what": what,
        "bytes": path.stat().st_size,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }


def _new_directory(target: Path) -> Path:
    """A temporary sibling of ``target`` to write into (renamed to ``target`` when complete)."""
    if target.exists():
        raise BackupError(f"{target} already exists: a backup goes into a new directory", 2)
    parent = target.parent
    if not parent.is_dir():
        raise BackupError(f"{parent} does not exist: create it, or name a backup directory in one that does", 2)
    partial = parent / f".{target.name}.partial-{os.getpid()}"
    try:
        partial.mkdir(mode=0o700)
    except OSError as exc:
        raise BackupError(f"cannot write a backup into {parent}: {exc.strerror or exc}", 2) from None
    return partial


def backup(
    sources: Sources,
    target: Path,
    env: Mapping[str, str],
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> dict[str, Any]:
    """Write the backup of ``sources`` into the new directory ``target``; returns its manifest."""
    target = target.absolute()
    partial = _new_directory(target)
    try:
        started = now()
        files = []
        hub_file, hub_kind = copy_database(sources.hub_db_url, partial, HUB_DB, "jupyterhub.pgdump", "hub database")
        files.append(_described(hub_file, f"JupyterHub's database ({hub_kind}): users, passwords, tokens, servers"))
        gpu_file, gpu_kind = copy_database(sources.gpu_db_url, partial, GPU_DB, GPU_DUMP, "GPU database")
        files.append(_described(gpu_file, f"the GPU database ({gpu_kind}): leases, ledger, quotas, reservations"))
        absent = []
        if sources.cookie_secret.is_file():
            secret = partial / COOKIE_SECRET
            secret.write_bytes(sources.cookie_secret.read_bytes())
            secret.chmod(0o600)
            files.append(_described(secret, "the cookie secret (without it every user is logged out)"))
        else:
            absent.append(f"{COOKIE_SECRET}: none at {sources.cookie_secret} (the hub makes one at its first start)")
        if sources.local_config is not None:
            config = partial / LOCAL_CONFIG
            config.write_bytes(sources.local_config.read_bytes())
            config.chmod(0o600)
            files.append(_described(config, f"the local config file ({sources.local_config})"))
        else:
            absent.append(f"{LOCAL_CONFIG}: the hub has no local config file")
        schema_source = f"sqlite:///{gpu_file}" if gpu_kind == "sqlite" else sources.gpu_db_url
        manifest = {
            "gpu_workbench_version": version(),
            "created": started.isoformat(timespec="seconds"),
            "host": socket.gethostname(),
            "data_dir": str(sources.data_dir),
            "gpu_database": {
                "url": _url(sources.gpu_db_url, "GPU database").render_as_string(hide_password=True),
                **gpu_schema(schema_source),
            },
            "files": files,
            "not_included": [
                *absent,
                "the users' homes and volumes (their notebooks and data): back them up with the site's own tools",
            ],
            "settings": settings_without_secrets(env),
            "restore": "docs/upgrading.md, Going back: stop the hub, put these files back, start the release "
            "named in gpu_workbench_version",
        }
        manifest_path = partial / MANIFEST
        manifest_path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        manifest_path.chmod(0o600)
        partial.rename(target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return manifest


def add_backup_parser(top: Any) -> None:
    """``workbench backup DIR`` and its options, on the CLI's subcommands."""
    p = top.add_parser(
        "backup",
        help="copy the hub's databases, cookie secret and local config into a new directory (also while it runs)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dir", type=Path, help="the backup directory to create (it must not exist)")
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="the hub's data directory (default $WORKBENCH_DATA_DIR, else the checkout's data/)",
    )
    p.add_argument(
        "--db-url",
        default=None,
        help="the GPU database (default $WORKBENCH_DB_URL, else workbench.sqlite in the data directory)",
    )
    p.add_argument(
        "--hub-db-url",
        default=None,
        help="JupyterHub's database, if a local config moved it (default jupyterhub.sqlite in the data directory)",
    )
    p.add_argument(
        "--local-config",
        type=Path,
        default=None,
        help="the local config file (default $WORKBENCH_LOCAL_CONFIG, else hub/jupyterhub_config.local.py if any)",
    )


def run_backup(args: argparse.Namespace, error: Callable[[str, int], Exception]) -> tuple[object, str]:
    """Make the backup ``args`` describe; a ``BackupError`` becomes the CLI's ``error`` with its exit code."""
    env = dict(os.environ)
    try:
        sources = find_sources(env, args.data_dir, args.db_url, args.hub_db_url, args.local_config)
        manifest = backup(sources, args.dir, env)
    except BackupError as exc:
        raise error(f"backup: {exc}", exc.code) from None
    schema = manifest["gpu_database"]
    lines = [
        f"Backed up GPU Workbench {manifest['gpu_workbench_version']} into {args.dir.absolute()}:",
        *(f"  {f['file']} ({f['bytes']} bytes): {f['what']}" for f in manifest["files"]),
        f"The GPU database is at schema revision {schema.get('schema_revision')}.",
        "To go back to this release: stop the hub, put these files back, start this release "
        "(docs/upgrading.md, Going back).",
    ]
    return manifest, "\n".join(lines)
