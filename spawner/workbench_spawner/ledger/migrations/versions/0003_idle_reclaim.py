"""Idle GPUs come back: idle rules on quotas, idle tracking, notices, exemptions.

* ``gpu_quotas`` gains ``gpu_idle_minutes`` (how long a server's GPUs may all
  stay under the threshold before it is reclaimed; null: inherit the hub's
  ``WORKBENCH_GPU_IDLE_MINUTES``) and ``gpu_idle_threshold`` (percent
  utilization under which a GPU counts as idle; null: 5 %).
* ``gpu_idle_tracks``: per held GPU, since when it has been idle and when a
  reading last arrived, so a restart of the workbench service keeps its
  clocks and the fleet page can show idle time.
* ``workbench_notices``: what the hub side tells a user about their server
  ("will be stopped at T because ..."), read by the user's JupyterLab and the
  spawn page; ``reason`` is what the usage ledger records when the server
  it announced is stopped. Preemption warnings (reservations) reuse it.
* ``gpu_idle_exemptions``: groups an admin exempted from idle reclaim.

Minutes are stored as floats: admins set whole minutes, while demos and
tests use fractions (0.1 min = 6 s).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    columns = {c["name"] for c in inspector.get_columns("gpu_quotas")}
    with op.batch_alter_table("gpu_quotas") as batch:
        if "gpu_idle_minutes" not in columns:
            batch.add_column(sa.Column("gpu_idle_minutes", sa.Float, nullable=True))
        if "gpu_idle_threshold" not in columns:
            batch.add_column(sa.Column("gpu_idle_threshold", sa.Float, nullable=True))
    if not inspector.has_table("gpu_idle_tracks"):
        op.create_table(
            "gpu_idle_tracks",
            sa.Column("id", sa.Integer, primary_key=True),
            sa.Column("node", sa.String(255), nullable=False, server_default=""),
            sa.Column("gpu_uuid", sa.String(128), nullable=False),
            sa.Column("user", sa.String(255), nullable=False),
            sa.Column("server", sa.String(255), nullable=False, server_default=""),
            sa.Column("idle_since", sa.DateTime(timezone=True), nullable=True),
            sa.Column("last_reading", sa.DateTime(timezone=True), nullable=True),
            sa.Column("utilization", sa.Float, nullable=True),
            sa.Column("source", sa.String(32), nullable=False, server_default=""),
            sa.UniqueConstraint("node", "gpu_uuid", name="one_track_per_gpu"),
        )
        op.create_index("ix_gpu_idle_tracks_user", "gpu_idle_tracks", ["user"])
    if not inspector.has_table("workbench_notices"):
        op.create_table(
            "workbench_notices",
            sa.Column("id", sa.Integer, primary_key=True),
            sa.Column("user", sa.String(255), nullable=False),
            sa.Column("server", sa.String(255), nullable=False, server_default=""),
            sa.Column("kind", sa.String(32), nullable=False),
            sa.Column("state", sa.String(16), nullable=False),
            sa.Column("message", sa.Text, nullable=False),
            sa.Column("hint", sa.Text, nullable=False, server_default=""),
            sa.Column("reason", sa.String(64), nullable=False, server_default=""),
            sa.Column("stop_at", sa.DateTime(timezone=True), nullable=True),
            sa.Column("created", sa.DateTime(timezone=True), nullable=False),
            sa.Column("updated", sa.DateTime(timezone=True), nullable=False),
        )
        op.create_index("ix_workbench_notices_user", "workbench_notices", ["user"])
    if not inspector.has_table("gpu_idle_exemptions"):
        op.create_table(
            "gpu_idle_exemptions",
            sa.Column("group", sa.String(255), primary_key=True),
            sa.Column("reason", sa.Text, nullable=False, server_default=""),
            sa.Column("created", sa.DateTime(timezone=True), nullable=False),
            sa.Column("created_by", sa.String(255), nullable=False, server_default=""),
        )


def downgrade() -> None:
    for table in ("gpu_idle_exemptions", "workbench_notices", "gpu_idle_tracks"):
        op.drop_table(table)
    with op.batch_alter_table("gpu_quotas") as batch:
        batch.drop_column("gpu_idle_threshold")
        batch.drop_column("gpu_idle_minutes")
