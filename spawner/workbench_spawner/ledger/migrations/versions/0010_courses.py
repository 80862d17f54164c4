"""Courses: ``workbench_courses``, one row per course (issue 48).

A course is a hub group (its students) with what a hub admin sets for it:
its title, its start and end dates, the ceiling its staff give quotas under
(a quota's ``max_gpus``, ``gpu_hours_per_week`` and ``allowed_models``, as
JSON) and who its staff are (a hub group and named users). Databases from
before this revision have no courses.

``gpu_quotas.course``: the course whose staff set a student's quota (null
for an admin's): such a quota is in force only while its course runs.

``gpu_idle_exemptions.until``: when an exemption ends (a course's staff
exempt their course for a session); null for an admin's, as before.

``workbench_invites``: the one-time sign-up links a course's roster made
(``ledger/invite_book.py``), a hash of each token, when it expires and when
it was used.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-08
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if not sa.inspect(op.get_bind()).has_table("workbench_courses"):
        op.create_table(
            "workbench_courses",
            sa.Column("name", sa.String(255), primary_key=True),
            sa.Column("title", sa.String(200), nullable=False),
            sa.Column("starts", sa.Date, nullable=True),
            sa.Column("ends", sa.Date, nullable=True),
            sa.Column("ceiling", sa.Text, nullable=False),
            sa.Column("staff_group", sa.String(255), nullable=True),
            sa.Column("staff", sa.Text, nullable=False, server_default="[]"),
            sa.Column("reservation_gpus", sa.Integer, nullable=False, server_default="0"),
            sa.Column("updated", sa.DateTime(timezone=True), nullable=False),
            sa.Column("updated_by", sa.String(255), nullable=False, server_default=""),
        )
    if not sa.inspect(op.get_bind()).has_table("workbench_invites"):
        op.create_table(
            "workbench_invites",
            sa.Column("username", sa.String(255), primary_key=True),
            sa.Column("course", sa.String(255), nullable=False),
            sa.Column("token_hash", sa.String(64), nullable=False),
            sa.Column("created", sa.DateTime(timezone=True), nullable=False),
            sa.Column("expires", sa.DateTime(timezone=True), nullable=False),
            sa.Column("used", sa.DateTime(timezone=True), nullable=True),
            sa.Column("created_by", sa.String(255), nullable=False, server_default=""),
        )
    if "until" not in {c["name"] for c in sa.inspect(op.get_bind()).get_columns("gpu_idle_exemptions")}:
        with op.batch_alter_table("gpu_idle_exemptions") as batch:
            batch.add_column(sa.Column("until", sa.DateTime(timezone=True), nullable=True))
    if "course" not in {c["name"] for c in sa.inspect(op.get_bind()).get_columns("gpu_quotas")}:
        with op.batch_alter_table("gpu_quotas") as batch:
            batch.add_column(sa.Column("course", sa.String(255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gpu_idle_exemptions") as batch:
        batch.drop_column("until")
    with op.batch_alter_table("gpu_quotas") as batch:
        batch.drop_column("course")
    op.drop_table("workbench_invites")
    op.drop_table("workbench_courses")
