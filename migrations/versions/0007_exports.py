"""Exports: merged or adapter-only model exports as work of their own.

`exports` holds one row per requested export of a job's checkpoint (leased by a worker like
a job, with the attempt as fencing token); `export_events` its history.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
STATUSES = ("queued", "running", "cancelling", "cancelled", "succeeded", "failed")
KINDS = ("merged", "adapter", "full")
DTYPES = ("float32", "bfloat16", "float16")


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _when() -> list[sa.Column]:
    return [
        sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)
        for name, nullable in (
            ("lease_expires_at", True),
            ("dispatched_at", True),
            ("created_at", False),
            ("updated_at", False),
            ("started_at", True),
            ("finished_at", True),
        )
    ]


def upgrade() -> None:
    op.create_table(
        "exports",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("merge_lora", sa.Boolean(), nullable=False),
        sa.Column("dtype", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("queue", sa.String(length=32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("lease_owner", sa.String(length=255), nullable=True),
        sa.Column("path", sa.Text(), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("error_code", sa.String(length=64), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        *_when(),
        sa.CheckConstraint(_in("status", STATUSES), name=op.f("ck_exports_status")),
        sa.CheckConstraint(_in("kind", KINDS), name=op.f("ck_exports_kind")),
        sa.CheckConstraint(_in("dtype", DTYPES), name=op.f("ck_exports_dtype")),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_exports_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["project_id"],
            ["projects.id"],
            name=op.f("fk_exports_project_id_projects"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_exports")),
    )
    op.create_index("ix_exports_job_created", "exports", ["job_id", "created_at"])
    op.create_index("ix_exports_status_lease", "exports", ["status", "lease_expires_at"])
    op.create_table(
        "export_events",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("export_id", sa.String(length=36), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("from_status", sa.String(length=16), nullable=True),
        sa.Column("to_status", sa.String(length=16), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("data", JSON_TYPE, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["export_id"],
            ["exports.id"],
            name=op.f("fk_export_events_export_id_exports"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_export_events")),
    )
    op.create_index("ix_export_events_export_id_id", "export_events", ["export_id", "id"])


def downgrade() -> None:
    op.drop_table("export_events")
    op.drop_table("exports")
