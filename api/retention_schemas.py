"""HTTP models of checkpoint retention: the project's policy (`CheckpointRetention`, in a
`PATCH /v1/projects/{name}` body and in `ProjectPublic`) and a deleted checkpoint's record
(`CheckpointDeletionPublic`, in `GET /v1/jobs/{id}/checkpoints`).

A policy gives `max_bytes`, `max_age_days` or both; `null` for the whole object removes it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_POLICY_BYTES = 2**60  # an exbibyte: past any disk, and exact in a BIGINT
MAX_POLICY_DAYS = 36_500


class CheckpointRetention(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_bytes: Annotated[int, Field(ge=1, le=MAX_POLICY_BYTES)] | None = Field(
        None, description="Finished jobs' checkpoints of the project hold at most this many bytes."
    )
    max_age_days: Annotated[int, Field(ge=1, le=MAX_POLICY_DAYS)] | None = Field(
        None, description="A finished job's checkpoints are deleted this many days after it ends."
    )

    @model_validator(mode="after")
    def _some_bound(self) -> CheckpointRetention:
        if self.max_bytes is None and self.max_age_days is None:
            raise ValueError(
                "gives neither max_bytes nor max_age_days | fix: set one or both, or send "
                "checkpoint_retention: null to remove the policy"
            )
        return self


class CheckpointDeletionPublic(BaseModel):
    step: int
    path: str
    size_bytes: int | None
    source: str = Field(description="Who deleted it: `trainer` (keep_last/keep_best) or `policy`.")
    reason: str
    deleted_at: datetime
