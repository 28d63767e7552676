"""Metric rollups: one row per block of steps (lowest, highest and last), kept by triggers.

Downsampled metric reads (`max_points`) read these rows instead of every record. On
PostgreSQL two statement triggers on `metrics` recompute the blocks each write touched;
existing metrics are rolled up here once. SQLite gets the table only.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from jobs.store.tables import ROLLUP_DDL, ROLLUP_DROP

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "metric_rollups",
        sa.Column(
            "job_id",
            sa.String(36),
            sa.ForeignKey("jobs.id", ondelete="CASCADE", name="fk_metric_rollups_job_id_jobs"),
            nullable=False,
        ),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("block", sa.Integer(), nullable=False),
        sa.Column("min_value", sa.Float(), nullable=True),
        sa.Column("min_step", sa.Integer(), nullable=True),
        sa.Column("max_value", sa.Float(), nullable=True),
        sa.Column("max_step", sa.Integer(), nullable=True),
        sa.Column("last_step", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "kind", "block", name="pk_metric_rollups"),
    )
    if op.get_bind().dialect.name != "postgresql":
        return
    for statement in ROLLUP_DDL:
        op.execute(statement)
    # Roll up what is already there: an UPDATE that changes nothing fires the trigger.
    op.execute("UPDATE metrics SET step = step")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for statement in ROLLUP_DROP:
            op.execute(statement)
    op.drop_table("metric_rollups")
