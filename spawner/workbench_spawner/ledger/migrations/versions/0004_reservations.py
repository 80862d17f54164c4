"""Reservations for a class: the ``gpu_reservations`` table and the holder's groups on every lease.

* ``gpu_reservations``: N GPUs (optionally of one model) kept for a
  JupyterHub group's members during a one-off or weekly window
  (``reservation_book.py``).
* ``gpu_leases.groups``: the user's groups when the lease began (a JSON
  list), so the hub's placement and the service's preemption both know
  which held GPUs count as the members' without asking the hub. Leases
  from before this revision get ``[]``: their holders count as non-members
  until their servers restart.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    if "groups" not in {c["name"] for c in inspector.get_columns("gpu_leases")}:
        with op.batch_alter_table("gpu_leases") as batch:
            batch.add_column(sa.Column("groups", sa.Text, nullable=False, server_default="[]"))
    if not inspector.has_table("gpu_reservations"):
        op.create_table(
            "gpu_reservations",
            sa.Column("id", sa.Integer, primary_key=True),
            sa.Column("group", sa.String(255), nullable=False),
            sa.Column("gpus", sa.Integer, nullable=False),
            sa.Column("model", sa.String(64), nullable=True),
            sa.Column("window", sa.String(64), nullable=False),
            sa.Column("grace_minutes", sa.Float, nullable=False),
            sa.Column("preempt", sa.Boolean, nullable=False, server_default=sa.false()),
            sa.Column("warn_minutes", sa.Float, nullable=False),
            sa.Column("created", sa.DateTime(timezone=True), nullable=False),
            sa.Column("created_by", sa.String(255), nullable=False, server_default=""),
        )
        op.create_index("ix_gpu_reservations_group", "gpu_reservations", ["group"])


def downgrade() -> None:
    op.drop_table("gpu_reservations")
    with op.batch_alter_table("gpu_leases") as batch:
        batch.drop_column("groups")
