"""First release: GPU leases, the usage ledger, quotas and session limits.

Creates each table only where it is missing, so a database made by the
pre-migration ``create_all`` is adopted as it is.

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _missing(name: str) -> bool:
    return not sa.inspect(op.get_bind()).has_table(name)


def upgrade() -> None:
    if _missing("gpu_leases"):
        op.create_table(
            "gpu_leases",
            sa.Column("id", sa.Integer, primary_key=True),
            sa.Column("gpu_uuid", sa.String(128), nullable=False),
            sa.Column("slot", sa.Integer, nullable=False),
            sa.Column("user", sa.String(255), nullable=False),
            sa.Column("server", sa.String(255), nullable=False),
            sa.Column("since", sa.DateTime(timezone=True), nullable=False),
            sa.Column("ref", sa.String(255), nullable=False),
            sa.UniqueConstraint("gpu_uuid", "slot", name="one_holder_per_slot"),
        )
        op.create_index("ix_gpu_leases_gpu_uuid", "gpu_leases", ["gpu_uuid"])
        op.create_index("ix_gpu_leases_user", "gpu_leases", ["user"])
    if _missing("gpu_usage"):
        op.create_table(
            "gpu_usage",
            sa.Column("id", sa.Integer, primary_key=True),
            sa.Column("gpu_uuid", sa.String(128), nullable=False),
            sa.Column("user", sa.String(255), nullable=False),
            sa.Column("server", sa.String(255), nullable=False),
            sa.Column("started", sa.DateTime(timezone=True), nullable=False),
            sa.Column("ended", sa.DateTime(timezone=True), nullable=False),
            sa.Column("reason", sa.String(64), nullable=False),
        )
        op.create_index("ix_gpu_usage_user", "gpu_usage", ["user"])
        op.create_index("ix_gpu_usage_ended", "gpu_usage", ["ended"])
    if _missing("gpu_quotas"):
        op.create_table(
            "gpu_quotas",
            sa.Column("id", sa.Integer, primary_key=True),
            sa.Column("kind", sa.String(8), nullable=False),
            sa.Column("name", sa.String(255), nullable=False),
            sa.Column("max_gpus", sa.Integer, nullable=False),
            sa.Column("gpu_hours_per_week", sa.Float, nullable=True),
            sa.Column("allowed_models", sa.Text, nullable=True),
            sa.Column("max_session_hours", sa.Float, nullable=True),
            sa.Column("updated", sa.DateTime(timezone=True), nullable=False),
            sa.Column("updated_by", sa.String(255), nullable=False),
            sa.UniqueConstraint("kind", "name", name="one_quota_per_name"),
        )
    if _missing("gpu_session_limits"):
        op.create_table(
            "gpu_session_limits",
            sa.Column("id", sa.Integer, primary_key=True),
            sa.Column("user", sa.String(255), nullable=False),
            sa.Column("server", sa.String(255), nullable=False),
            sa.Column("max_session_hours", sa.Float, nullable=False),
            sa.Column("recorded", sa.DateTime(timezone=True), nullable=False),
            sa.UniqueConstraint("user", "server", name="one_limit_per_server"),
        )
        op.create_index("ix_gpu_session_limits_user", "gpu_session_limits", ["user"])


def downgrade() -> None:
    for table in ("gpu_session_limits", "gpu_quotas", "gpu_usage", "gpu_leases"):
        op.drop_table(table)
