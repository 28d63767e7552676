"""What made a training step: the dataset rows of `GET /v1/jobs/{id}/steps/{step}/samples`.

The rows are those the trainer's sampler gave that step (`trainer.sample_log`), as the
worker stored them (`jobs.store.samples`): for a step re-run after a resume or a rollback,
the rows of the run that really used them. Scoped to the caller's project like every job
lookup; a step with no rows stored (not run yet, or run before rows were recorded) is 404.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path
from pydantic import BaseModel

from api.deps import Reader, SessionDep
from api.errors import ApiError
from api.routes.jobs import AUTH_ERRORS, NOT_FOUND, own_job_id
from jobs.store.samples import step_samples

router = APIRouter(prefix="/v1/jobs/{job_id}", tags=["telemetry"])


class StepRowPublic(BaseModel):
    index: int  # the row's index in the training dataset
    id: Any = None  # the dataset's own id column, where it has one
    dp_rank: int | None = None
    micro_batch: int | None = None
    tokens: int | None = None
    preview: str | None = None  # decoded tokens, capped


class StepSamplesPublic(BaseModel):
    step: int
    epoch: int | None
    attempt: int  # the attempt whose run used these rows
    data: list[StepRowPublic]


@router.get(
    "/steps/{step}/samples",
    response_model=StepSamplesPublic,
    summary="The dataset rows of one training step",
    responses={**NOT_FOUND, **AUTH_ERRORS},
)
def get_step_samples(
    job_id: str,
    step: Annotated[int, Path(ge=1, le=2**31 - 1)],
    principal: Reader,
    session: SessionDep,
) -> StepSamplesPublic:
    """Every data-parallel rank's rows of the step, in micro-batch order, with previews."""
    own_id = own_job_id(session, principal, job_id)
    found = step_samples(session, own_id, step)
    if found is None:
        raise ApiError(404, "not_found", f"job {job_id} has no rows recorded for step {step}")
    return StepSamplesPublic.model_validate(found)
