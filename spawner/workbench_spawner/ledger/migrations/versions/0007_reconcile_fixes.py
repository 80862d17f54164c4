"""The reconciler's fixes, counted: ``workbench_reconcile_fixes``.

The hub's reconciler runs all the time (``GPUPolicy.reconcile``) and adds
one per fix to a row per kind (``lease_closed``, ``server_adopted``,
``server_stopped``); the workbench service serves the counts as
``workbench_reconcile_fixes_total{kind}``. They live in the database, not
the hub's memory, because the service is another process and a hub restart
must not reset a counter.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if not sa.inspect(op.get_bind()).has_table("workbench_reconcile_fixes"):
        op.create_table(
            "workbench_reconcile_fixes",
            sa.Column("kind", sa.String(64), primary_key=True),
            sa.Column("count", sa.Integer, nullable=False, server_default="0"),
            sa.Column("last_fix", sa.DateTime(timezone=True), nullable=False),
        )


def downgrade() -> None:
    op.drop_table("workbench_reconcile_fixes")
