"""Which releases of GPU Workbench opened this GPU database: ``workbench_releases`` (migration 0009).

One row per release (``release.version()``), written the first time that
release opens the database, with the schema revision it left it at. When a
database comes from a newer release (an operator went back to an older one
without restoring the backup), the older release finds a schema revision it
does not know and names the release that made it from this table
(``migrations.upgrade``): "was last migrated by GPU Workbench 2026.12.20".
The backup manifest lists the rows too.

Because an older release reads this table to explain its refusal, its name
and these three columns must never change: a later revision may add
columns, never rename or drop these.

The functions take a ``Connection`` in a transaction that is already open:
``migrations.upgrade`` calls them inside its migration's transaction, so a
release is recorded together with the schema it left, or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Connection, DateTime, String, insert, inspect, select
from sqlalchemy.orm import Mapped, mapped_column

from workbench_spawner.ledger.store import Base

RELEASES_TABLE = "workbench_releases"


class ReleaseRow(Base):
    """A release that opened this database: its version, the schema revision it left, when it first did."""

    __tablename__ = RELEASES_TABLE

    version: Mapped[str] = mapped_column(String(64), primary_key=True)
    revision: Mapped[str] = mapped_column(String(32))
    first_opened: Mapped[datetime] = mapped_column(DateTime(timezone=True))


@dataclass(frozen=True)
class Release:
    version: str
    revision: str
    first_opened: datetime


def record_release(connection: Connection, version: str, revision: str) -> None:
    """Add ``version`` (at schema ``revision``) unless it is there already: one write per release and database."""
    if connection.execute(select(ReleaseRow.version).where(ReleaseRow.version == version)).first() is None:
        connection.execute(
            insert(ReleaseRow).values(version=version, revision=revision, first_opened=datetime.now(UTC))
        )


def releases(connection: Connection) -> list[Release]:
    """Every release recorded, the most recent first; none where the table is not there (before 0009)."""
    if not inspect(connection).has_table(RELEASES_TABLE):
        return []
    rows = connection.execute(select(ReleaseRow.version, ReleaseRow.revision, ReleaseRow.first_opened))
    found = [
        Release(version, revision, opened if opened.tzinfo else opened.replace(tzinfo=UTC))
        for version, revision, opened in rows
    ]
    return sorted(found, key=lambda r: r.first_opened, reverse=True)


def release_at(connection: Connection, revision: str) -> str | None:
    """The release that left the database at schema ``revision`` (the most recent, if several); None if unknown."""
    for release in releases(connection):
        if release.revision == revision:
            return release.version
    return None
