"""The node on every lease and ledger row; the hub's resolved policy settings.

Rows written before this revision came from single-host deployments, so
their node is this machine's host name.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03
"""

import socket

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    host = socket.gethostname()[:255]
    inspector = sa.inspect(op.get_bind())
    for table in ("gpu_leases", "gpu_usage"):
        if "node" in {c["name"] for c in inspector.get_columns(table)}:
            continue  # made by a create_all of the current models
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("node", sa.String(255), nullable=False, server_default=""))
        op.execute(sa.text(f"UPDATE {table} SET node = :host").bindparams(host=host))
    if inspector.has_table("workbench_settings"):
        return
    op.create_table(
        "workbench_settings",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
        sa.Column("updated", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("workbench_settings")
    for table in ("gpu_usage", "gpu_leases"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("node")
