"""Which releases opened the database: ``workbench_releases``.

Issue 45: a database that a newer release migrated, opened again by an
older one after a downgrade, stopped the hub with Alembic's "Can't locate
revision identified by '0010'" and a long traceback. From this revision on,
every release writes its version here the first time it opens the database
(``ledger/release_book.py``), so an older release can name the release that
made the schema it does not know, and say to restore the backup taken
before the upgrade. Databases of earlier releases have no rows until the
first release with this revision opens them.

The table's name and its three columns are read by every later release's
refusal: never rename or drop them.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if not sa.inspect(op.get_bind()).has_table("workbench_releases"):
        op.create_table(
            "workbench_releases",
            sa.Column("version", sa.String(64), primary_key=True),
            sa.Column("revision", sa.String(32), nullable=False),
            sa.Column("first_opened", sa.DateTime(timezone=True), nullable=False),
        )


def downgrade() -> None:
    op.drop_table("workbench_releases")
