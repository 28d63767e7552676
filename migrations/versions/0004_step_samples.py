"""Step samples: which dataset rows made each training step, and the rows' previews.

`step_samples` holds one row per job and step (the worker upserts it from the trainer's
`samples.jsonl`, a later attempt replacing an earlier one's); `dataset_rows` one preview
per job and dataset index.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _job_fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        ["job_id"], ["jobs.id"], name=op.f(f"fk_{table}_job_id_jobs"), ondelete="CASCADE"
    )


def upgrade() -> None:
    op.create_table(
        "step_samples",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=True),
        sa.Column("rows", JSON_TYPE, nullable=False),
        _job_fk("step_samples"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_step_samples")),
        sa.UniqueConstraint("job_id", "step", name="uq_step_samples_job_step"),
    )
    op.create_table(
        "dataset_rows",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("row_index", sa.BigInteger(), nullable=False),
        sa.Column("row_id", sa.Text(), nullable=True),
        sa.Column("tokens", sa.Integer(), nullable=True),
        sa.Column("preview", sa.Text(), nullable=True),
        _job_fk("dataset_rows"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dataset_rows")),
        sa.UniqueConstraint("job_id", "row_index", name="uq_dataset_rows_job_row"),
    )


def downgrade() -> None:
    op.drop_table("dataset_rows")
    op.drop_table("step_samples")
