"""Artifact store retention: stored copies deleted, local checkpoint copies evicted.

`artifacts.deleted_at` is set once a stored checkpoint's objects were deleted from the
store (its checkpoint deleted by retention); `checkpoints.evicted_at` once a finished job's
local checkpoint directory was evicted from the worker's filesystem because the store holds
it completely. An evicted checkpoint is not deleted.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("artifacts", sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("checkpoints", sa.Column("evicted_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_column("evicted_at")
    with op.batch_alter_table("artifacts") as batch:
        batch.drop_column("deleted_at")
