"""Exports: `POST /v1/jobs/{job_id}/exports` asks for an export of one of a job's checkpoints,
which a worker then runs as work of its own (`worker.export_task`); `GET
/v1/jobs/{job_id}/exports`, `GET /v1/exports/{export_id}` and its `/events` watch it;
`POST /v1/exports/{export_id}/cancel` stops it.

An export is `merged` (a LoRA run's adapter folded into its base: a model `transformers`
loads as is), `adapter` (a LoRA run with `merge_lora: false`: the PEFT adapter alone) or
`full` (a full fine-tune's weights). `step` omitted means the job's latest checkpoint; a
step with no checkpoint is a 422 at `step` listing the steps that have one. Like every
lookup, an export is found only in the caller's project: another project's is the same 404
as a missing one.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import PurePath
from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from api.deps import Reader, SessionDep, SettingsDep, Submitter
from api.errors import ApiError, InvalidRequest, not_found
from api.limits import BoundedJsonRoute
from api.routes.jobs import AUTH_ERRORS, CONFLICT, INVALID, NOT_FOUND, find_job
from api.schemas import ErrorOut, EventPublic, EventsPublic
from jobs.broker import dispatch_export
from jobs.orchestration.export_states import available_export_controls, request_cancel
from jobs.orchestration.states import IllegalTransition
from jobs.recipe.errors import FieldError
from jobs.store import exports as store
from jobs.store.api_keys import Principal
from jobs.store.queries import is_job_id
from jobs.store.status import EXPORT_TERMINAL, ExportStatus
from jobs.store.tables import Export, Job

router = APIRouter(prefix="/v1", tags=["exports"], route_class=BoundedJsonRoute)

EXPORT_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorOut, "description": "No such export in this project."}
}
MAX_STEPS_LISTED = 50  # steps named in a 422; a job may keep many more checkpoints


class ExportCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    step: int | None = Field(
        None, ge=0, le=2**31 - 1, description="The checkpoint's step; omitted: the latest."
    )
    merge_lora: bool = Field(
        True,
        description="A LoRA run: fold the adapter into the base (true) or export the adapter "
        "alone (false). Ignored for a full fine-tune.",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="The dtype the exported floating-point weights are stored in."
    )


class ExportPublic(BaseModel):
    id: str
    job_id: str
    step: int
    kind: Literal["merged", "adapter", "full"]
    merge_lora: bool
    dtype: str
    status: ExportStatus
    terminal: bool
    attempt: int
    max_attempts: int
    actions: list[str] = Field(description="Requests that would change the export now.")
    path: str | None = Field(
        None, description="Where the export lies, relative to the job's run directory."
    )
    size_bytes: int | None = None
    error_code: str | None = None
    error_message: str | None = None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None


class ExportsPublic(BaseModel):
    data: list[ExportPublic]


def export_public(export: Export) -> ExportPublic:
    # The server's own paths stay on the server: `exports/<id>` under the run directory.
    path = PurePath(export.path) if export.path else None
    return ExportPublic(
        id=export.id,
        job_id=export.job_id,
        step=export.step,
        kind=export.kind,  # type: ignore[arg-type]
        merge_lora=export.merge_lora,
        dtype=export.dtype,
        status=ExportStatus(export.status),
        terminal=export.status in EXPORT_TERMINAL,
        attempt=export.attempt,
        max_attempts=export.max_attempts,
        actions=available_export_controls(export.status),
        path=str(PurePath(path.parent.name, path.name)) if path else None,
        size_bytes=export.size_bytes,
        error_code=export.error_code,
        error_message=export.error_message,
        created_at=export.created_at,
        updated_at=export.updated_at,
        started_at=export.started_at,
        finished_at=export.finished_at,
    )


def find_export(session: SessionDep, principal: Principal, export_id: str) -> Export:
    """The caller's project's export; the same 404 for another project's and a missing one."""
    wanted = export_id.lower()
    export = store.get_export(session, principal.project_id, wanted) if is_job_id(wanted) else None
    if export is None:
        raise not_found("export", export_id)
    return export


def chosen_step(session: SessionDep, job: Job, step: int | None) -> int:
    """The checkpoint step to export: `step` when the job has a checkpoint there, the latest
    when omitted; a 422 at `step` otherwise."""
    steps = store.checkpoint_steps(session, job.id)
    if not steps:
        fix = "wait until the job has published a checkpoint (checkpoint.enabled: true)"
        raise InvalidRequest([FieldError("step", f"job {job.id} has no checkpoint yet", fix)])
    if step is None:
        return steps[-1]
    if step not in steps:
        shown = steps[-MAX_STEPS_LISTED:]
        more = f" (the last {len(shown)} of {len(steps)})" if len(steps) > len(shown) else ""
        fix = f"choose a step that has a checkpoint{more}: {', '.join(map(str, shown))}"
        raise InvalidRequest([FieldError("step", f"job {job.id} has no checkpoint at {step}", fix)])
    return step


def export_kind(job: Job, merge_lora: bool) -> str:
    if not (job.recipe or {}).get("peft"):
        return "full"
    return "merged" if merge_lora else "adapter"


@router.post(
    "/jobs/{job_id}/exports",
    status_code=201,
    response_model=ExportPublic,
    summary="Export a checkpoint",
    responses={**NOT_FOUND, **INVALID, **AUTH_ERRORS},
)
def create_export(
    job_id: str,
    body: ExportCreate,
    principal: Submitter,
    session: SessionDep,
    settings: SettingsDep,
) -> ExportPublic:
    """Queue an export of the job's checkpoint at `step` (the latest when omitted); a worker
    runs it. Watch it with `GET /v1/exports/{export_id}`."""
    job = find_job(session, principal, job_id)
    step = chosen_step(session, job, body.step)
    kind = export_kind(job, body.merge_lora)
    export = store.create_export(session, job, step, kind, body.merge_lora, body.dtype)
    session.commit()
    dispatch_export(export.id, export.queue, settings)  # refused: the reconciler sends it
    session.refresh(export)
    return export_public(export)


@router.get(
    "/jobs/{job_id}/exports",
    response_model=ExportsPublic,
    summary="A job's exports",
    responses={**NOT_FOUND, **AUTH_ERRORS},
)
def list_job_exports(job_id: str, principal: Reader, session: SessionDep) -> ExportsPublic:
    """The job's exports, newest first."""
    job = find_job(session, principal, job_id)
    return ExportsPublic(data=[export_public(e) for e in store.list_exports(session, job.id)])


@router.get(
    "/exports/{export_id}",
    response_model=ExportPublic,
    summary="One export",
    responses={**EXPORT_NOT_FOUND, **AUTH_ERRORS},
)
def get_export(export_id: str, principal: Reader, session: SessionDep) -> ExportPublic:
    return export_public(find_export(session, principal, export_id))


@router.get(
    "/exports/{export_id}/events",
    response_model=EventsPublic,
    summary="An export's history",
    responses={**EXPORT_NOT_FOUND, **AUTH_ERRORS},
)
def list_export_events(export_id: str, principal: Reader, session: SessionDep) -> EventsPublic:
    """Every status change of the export, oldest first."""
    export = find_export(session, principal, export_id)
    events = store.list_export_events(session, export.id)
    data = [EventPublic.model_validate(e, from_attributes=True) for e in events]
    return EventsPublic(data=data)


@router.post(
    "/exports/{export_id}/cancel",
    response_model=ExportPublic,
    summary="Cancel an export",
    responses={**EXPORT_NOT_FOUND, **CONFLICT, **AUTH_ERRORS},
)
def cancel_export(export_id: str, principal: Submitter, session: SessionDep) -> ExportPublic:
    """A queued export ends at once; a running one goes to `cancelling` until its worker
    has stopped it. Cancelling a `cancelling` export is a no-op; a finished one is 409."""
    export = find_export(session, principal, export_id)
    try:
        export, _ = request_cancel(session, export.id)
    except IllegalTransition as exc:
        session.rollback()
        raise ApiError(
            409,
            "conflict",
            f"export {export_id} is {exc.current_status}: nothing to cancel",
            current_status=str(exc.current_status),
        ) from None
    session.commit()
    return export_public(export)
