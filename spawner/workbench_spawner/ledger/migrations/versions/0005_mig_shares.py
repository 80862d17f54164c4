"""MIG slices: the share of a GPU on every lease and ledger row; quotas by kind; drained GPUs.

* ``gpu_leases.share`` and ``gpu_usage.share``: the share of a GPU the
  device is (1.0 for a whole GPU, ``g / 7`` for a ``<g>g`` MIG slice), as
  GPU-hours charge it. Recorded when the lease is made and copied to the
  ledger when it ends, so a later MIG layout change does not rewrite
  history. Rows from before this revision held whole GPUs: they get 1.0.
* ``gpu_quotas.whole_gpus`` (whether whole, non-MIG GPUs are allowed; true
  for quotas from before) and ``gpu_quotas.allowed_profiles`` (a JSON list
  of MIG profiles; null: any profile, which is what older quotas meant).
* ``gpu_drains``: the GPUs and slices an admin closed to new leases, so a
  GPU's MIG layout can be changed while nothing runs there (one row per
  device UUID, with the reason, who drained it and since when;
  ``drain_book.py``). Before this revision nothing was drained.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    for table in ("gpu_leases", "gpu_usage"):
        if "share" not in {c["name"] for c in inspector.get_columns(table)}:
            with op.batch_alter_table(table) as batch:
                batch.add_column(sa.Column("share", sa.Float, nullable=False, server_default="1.0"))
    columns = {c["name"] for c in inspector.get_columns("gpu_quotas")}
    with op.batch_alter_table("gpu_quotas") as batch:
        if "whole_gpus" not in columns:
            batch.add_column(sa.Column("whole_gpus", sa.Boolean, nullable=False, server_default=sa.true()))
        if "allowed_profiles" not in columns:
            batch.add_column(sa.Column("allowed_profiles", sa.Text, nullable=True))
    if not inspector.has_table("gpu_drains"):
        op.create_table(
            "gpu_drains",
            sa.Column("id", sa.Integer, primary_key=True),
            sa.Column("gpu_uuid", sa.String(128), nullable=False),
            sa.Column("reason", sa.Text, nullable=False, server_default=""),
            sa.Column("drained_by", sa.String(255), nullable=False, server_default=""),
            sa.Column("since", sa.DateTime(timezone=True), nullable=False),
            sa.UniqueConstraint("gpu_uuid", name="one_drain_per_device"),
        )


def downgrade() -> None:
    op.drop_table("gpu_drains")
    with op.batch_alter_table("gpu_quotas") as batch:
        batch.drop_column("allowed_profiles")
        batch.drop_column("whole_gpus")
    for table in ("gpu_usage", "gpu_leases"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("share")
