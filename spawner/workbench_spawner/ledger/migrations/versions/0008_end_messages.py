"""The sentence each end was explained with: ``gpu_usage.message``.

Issue 37: every way a server ends has a sentence for its student ("The node
wbnode1 this server ran on failed (Slurm: Not responding)."), shown on the
spawn page and the hub's home page, and kept with the ledger row so the
fleet page's recent stops read the same words after the notice is gone.
Rows written before this revision have an empty message; readers fall back
to the ``reason``.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if "message" not in {c["name"] for c in sa.inspect(op.get_bind()).get_columns("gpu_usage")}:
        with op.batch_alter_table("gpu_usage") as batch:
            batch.add_column(sa.Column("message", sa.Text, nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("gpu_usage") as batch:
        batch.drop_column("message")
