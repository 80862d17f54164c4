"""Quotas may forbid time-sliced GPUs: ``gpu_quotas.shared_gpus``.

A GPU that several servers share (``servers_per_gpu`` / ``servers_per_device``
above 1) gives no isolation of memory or faults between them. A quota with
``shared_gpus`` false only gets devices that one server holds alone
(``rules/admission.py``, ``HostAllocator.candidates``). Quotas from before
this revision allowed shared GPUs: they get true.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-05
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    columns = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("gpu_quotas")}
    if "shared_gpus" not in columns:
        with op.batch_alter_table("gpu_quotas") as batch:
            batch.add_column(sa.Column("shared_gpus", sa.Boolean, nullable=False, server_default=sa.true()))


def downgrade() -> None:
    with op.batch_alter_table("gpu_quotas") as batch:
        batch.drop_column("shared_gpus")
