"""Checkpoint retention: keep-best and project retention policies, deletion records.

`checkpoint_retention_policies` holds at most one policy per project (max bytes and/or max
age of its finished jobs' checkpoints); `checkpoint_deletions` one row per deleted
checkpoint (job, step), with who deleted it (the trainer's retention or the policy), why
and when.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "checkpoint_retention_policies",
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("max_bytes", sa.BigInteger(), nullable=True),
        sa.Column("max_age_days", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["projects.id"],
            name=op.f("fk_checkpoint_retention_policies_project_id_projects"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("project_id", name=op.f("pk_checkpoint_retention_policies")),
    )
    op.create_table(
        "checkpoint_deletions",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name=op.f("fk_checkpoint_deletions_job_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_checkpoint_deletions")),
        sa.UniqueConstraint("job_id", "step", name="uq_checkpoint_deletions_job_step"),
    )


def downgrade() -> None:
    op.drop_table("checkpoint_deletions")
    op.drop_table("checkpoint_retention_policies")
