"""`/v1/jobs`: submit (with Idempotency-Key), validate, list, read, cancel / pause / resume,
and the job's event history. Every lookup is scoped to the caller's project: another
project's job is a 404, never a 403. A job is named by its full id or a unique prefix of at
least 8 characters (`api.job_lookup`).
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Response

from api.deps import CapacityDep, Reader, SessionDep, SettingsDep, Submitter
from api.errors import ApiError, InvalidRequest, not_found
from api.event_labels import EventFacts, label_events
from api.job_lookup import resolve_job_id
from api.limits import BoundedJsonRoute
from api.pages import CURSOR_DOC, numeric_cursor
from api.schemas import (
    ErrorOut,
    EventPublic,
    EventsPublic,
    IdempotencyKey,
    JobCreate,
    JobPublic,
    JobRequestPublic,
    JobsPublic,
    ValidateOut,
    ValidationErrors,
)
from api.sse import MAX_EVENT_ID as MAX_ROW_ID
from api.submission import BAD_TEXT, check_request, submit, unstorable_text
from jobs.broker import dispatch_job
from jobs.orchestration.policy import failed_attempts, failed_attempts_by_job
from jobs.orchestration.states import IllegalTransition, available_controls, request_control
from jobs.recipe.errors import FieldError
from jobs.store import metric_reads
from jobs.store import queries as store
from jobs.store.api_keys import Principal
from jobs.store.status import JobStatus, is_terminal
from jobs.store.tables import Job, JobEvent

router = APIRouter(prefix="/v1", tags=["jobs"], route_class=BoundedJsonRoute)

AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut, "description": "Missing or unknown API key."},
    403: {"model": ErrorOut, "description": "The key's role is too weak."},
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {
        "model": ErrorOut,
        "description": "No such job in this project (`job_id`: a full id or a unique prefix "
        "of at least 8 characters).",
    },
    409: {
        "model": ErrorOut,
        "description": "`job_id` is a prefix of several jobs' ids: `candidates` lists them.",
    },
}
INVALID: dict[int | str, dict[str, Any]] = {
    422: {"model": ValidationErrors, "description": "Field errors: loc, msg, fix."}
}
CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {
        "model": ErrorOut,
        "description": "Not allowed in the job's current state, or `job_id` is a prefix of "
        "several jobs' ids (`candidates` lists them).",
    }
}


def job_public(
    job: Job, project: str, latest: dict[str, Any] | None = None, failures: int = 0
) -> JobPublic:
    """The answer for one job (a submit, a read, a control, a list row); `failures`: its
    `failed_attempts`, which a new job has none of."""
    plan = job.plan or {}
    warnings = [
        {"loc": w["loc"], "msg": w["msg"], "fix": w.get("fix", "")}
        for w in plan.get("warnings") or []
    ]
    return JobPublic(
        id=job.id,
        name=job.name,
        project=project,
        status=JobStatus(job.status),
        terminal=is_terminal(job.status),
        queue=job.queue,
        priority=job.priority,
        labels=job.labels or {},
        attempt=job.attempt,
        max_attempts=job.max_attempts,
        failed_attempts=failures,
        resources=job.resources or {},
        overrides=list((job.spec or {}).get("overrides") or []),
        recipe=job.recipe or {},
        plan=plan,
        warnings=warnings,
        max_steps=plan.get("max_steps"),
        latest_metrics=latest,
        actions=available_controls(job.status),
        error_code=job.error_code,
        error_message=job.error_message,
        # The server's own paths stay on the server: the directory under the runs dir.
        run_dir=PurePath(job.run_dir).name if job.run_dir else None,
        idempotency_key=job.idempotency_key,
        created_at=job.created_at,
        updated_at=job.updated_at,
        dispatched_at=job.dispatched_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
    )


def own_job_id(session: SessionDep, principal: Principal, job_id: str) -> str:
    """The stored id of the caller's project's job that `job_id` names, in full or by a
    unique prefix (404 when none, 409 when several), loading no row."""
    return resolve_job_id(session, principal.project_id, job_id)


def find_job(session: SessionDep, principal: Principal, job_id: str) -> Job:
    """The caller's project's job that `job_id` names, in full or by a unique prefix."""
    job = store.get_job(session, principal.project_id, own_job_id(session, principal, job_id))
    if job is None:  # deleted between the two reads
        raise not_found("job", job_id)
    return job


@router.post(
    "/jobs",
    status_code=201,
    response_model=JobPublic,
    summary="Submit a job",
    responses={
        200: {
            "model": JobPublic,
            "description": "Replay: this Idempotency-Key and body already created this job.",
        },
        409: {"model": ErrorOut, "description": "Idempotency-Key reused with another body."},
        **INVALID,
        **AUTH_ERRORS,
    },
)
def create_job(
    body: JobCreate,
    principal: Submitter,
    session: SessionDep,
    settings: SettingsDep,
    capacity: CapacityDep,
    idempotency_key: Annotated[
        IdempotencyKey | None,
        Header(
            alias="Idempotency-Key",
            min_length=1,
            max_length=255,
            description="Retry-safe submission: the same key and body return the same job.",
        ),
    ] = None,
) -> Response:
    """Validate everything, store the job, then queue it. Nothing is stored when invalid.

    A retry with a known Idempotency-Key and the same body answers the stored job (200)
    without validating again: a job accepted once stays accepted (its data may have moved).
    The answer is the `JobPublic` built here, serialized once and sent as it is: FastAPI
    would otherwise validate that model again, in another threadpool hop.
    """
    try:
        job, created = submit(session, principal, body, settings, capacity, idempotency_key)
    except store.IdempotencyConflict as exc:
        raise ApiError(409, "idempotency_conflict", str(exc), job_id=exc.job.id) from exc
    answer = job_public(job, principal.project_name).model_dump_json()
    return Response(answer, 201 if created else 200, media_type="application/json")


@router.post(
    "/jobs:validate",
    response_model=ValidateOut,
    summary="Validate a job without storing it",
    responses={**INVALID, **AUTH_ERRORS},
)
def validate_job(
    body: JobCreate,
    principal: Submitter,
    session: SessionDep,
    settings: SettingsDep,
    capacity: CapacityDep,
) -> ValidateOut:
    """The same checks as submit; answers the plan, or 422 with every field error."""
    checked = check_request(body, settings, principal, session, capacity)
    return ValidateOut(
        valid=True,
        errors=[],
        warnings=checked.plan.get("warnings") or [],
        plan=checked.plan,
        recipe=checked.recipe,
        queue=checked.queue,
    )


SORT_DOC = (
    "created_at, name, status or priority; a leading `-` sorts descending. Pass the same "
    "sort with each page's cursor."
)


@router.get(
    "/jobs",
    response_model=JobsPublic,
    summary="List jobs, newest first unless sorted",
    responses={**INVALID, **AUTH_ERRORS},
)
def list_jobs(
    principal: Reader,
    session: SessionDep,
    status: Annotated[list[JobStatus] | None, Query(description="Repeat to match several.")] = None,
    label: Annotated[list[str] | None, Query(description="`key=value`; repeat to AND.")] = None,
    q: Annotated[
        str | None,
        Query(
            max_length=200, description="Text the name contains (any case) or the id starts with."
        ),
    ] = None,
    sort: Annotated[str, Query(max_length=20, description=SORT_DOC)] = "-created_at",
    cursor: Annotated[str | None, Query(max_length=500)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> JobsPublic:
    where = store.JobFilter(
        statuses=[s.value for s in status or []],
        labels=_parse_labels(label or []),
        text=_search_text(q),
    )
    order = _parse_sort(sort)
    try:
        page = store.list_jobs(
            session, principal.project_id, where, order=order, cursor=cursor, limit=limit
        )
    except ValueError as exc:
        fix = "pass a next_cursor value from a previous page with the same sort, or none"
        raise InvalidRequest([FieldError("cursor", str(exc), fix)]) from exc
    ids = [j.id for j in page.jobs]
    latest = metric_reads.latest_train_metrics(session, ids)
    failures = failed_attempts_by_job(session, ids)
    data = [
        job_public(j, principal.project_name, latest.get(j.id), failures.get(j.id, 0))
        for j in page.jobs
    ]
    more = page.next_cursor is not None
    return JobsPublic(data=data, has_more=more, next_cursor=page.next_cursor, count=page.total)


def _parse_sort(text: str) -> store.JobOrder:
    try:
        return store.JobOrder.parse(text)
    except ValueError as exc:
        names = ", ".join(store.SORT_COLUMNS)
        fix = f"sort by one of {names}; prefix `-` for descending (sort=-created_at)"
        raise InvalidRequest([FieldError("sort", str(exc), fix)]) from exc


def _search_text(q: str | None) -> str:
    text = (q or "").strip()
    if unstorable_text(text):
        raise InvalidRequest([FieldError("q", BAD_TEXT, "search for printable text")])
    return text


def _parse_labels(items: list[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if unstorable_text(item):
            raise InvalidRequest([FieldError("label", BAD_TEXT, "filter on printable text")])
        if not sep or not key:
            raise InvalidRequest(
                [FieldError("label", f"'{item}' is not key=value", "filter as label=team=nlp")]
            )
        labels[key] = value
    return labels


@router.get(
    "/jobs/{job_id}",
    response_model=JobPublic,
    summary="Read a job",
    responses={**NOT_FOUND, **AUTH_ERRORS},
)
def get_job(job_id: str, principal: Reader, session: SessionDep) -> JobPublic:
    job = find_job(session, principal, job_id)
    latest = metric_reads.latest_train_metrics(session, [job.id]).get(job.id)
    return job_public(job, principal.project_name, latest, failed_attempts(session, job.id))


@router.get(
    "/jobs/{job_id}/request",
    response_model=JobRequestPublic,
    summary="What a job was submitted with",
    responses={**NOT_FOUND, **AUTH_ERRORS},
)
def get_job_request(job_id: str, principal: Reader, session: SessionDep) -> JobRequestPublic:
    """The request body as submitted (the recipe's YAML text with its comments, overrides,
    resources, labels): what the dashboard's "clone and edit" starts from. A job stored
    before requests were kept answers its resolved recipe."""
    job = find_job(session, principal, job_id)
    spec = job.spec or {}
    fields = set(JobRequestPublic.model_fields) - {"name"}
    kept = {key: spec[key] for key in fields if spec.get(key) is not None}
    if "recipe" not in kept and "recipe_yaml" not in kept:
        kept["recipe"] = job.recipe or {}
    return JobRequestPublic.model_validate({**kept, "name": job.name})


def _control(verb: str, job_id: str, principal: Principal, session: SessionDep) -> Job:
    job_id = own_job_id(session, principal, job_id)
    try:
        job, changed = request_control(
            session,
            job_id,
            verb,
            reason=f"{verb} requested by key {principal.key_id or 'auth-off'}",
        )
    except IllegalTransition as exc:
        session.rollback()
        raise ApiError(
            409,
            "illegal_transition",
            f"cannot {verb} a {exc.current_status} job",
            current_status=exc.current_status,
            job_id=job_id,
        ) from exc
    session.commit()
    return job


@router.post(
    "/jobs/{job_id}/cancel",
    response_model=JobPublic,
    summary="Cancel a job",
    responses={**NOT_FOUND, **CONFLICT, **AUTH_ERRORS},
)
def cancel_job(job_id: str, principal: Submitter, session: SessionDep) -> JobPublic:
    """Queued or paused jobs end at once; running ones go to `cancelling` until the worker
    has stopped every rank. Cancelling a `cancelling` job is a no-op; a finished one is 409."""
    job = _control("cancel", job_id, principal, session)
    return job_public(job, principal.project_name, failures=failed_attempts(session, job.id))


@router.post(
    "/jobs/{job_id}/pause",
    response_model=JobPublic,
    summary="Pause a job",
    responses={**NOT_FOUND, **CONFLICT, **AUTH_ERRORS},
)
def pause_job(job_id: str, principal: Submitter, session: SessionDep) -> JobPublic:
    """A running job saves a checkpoint and stops (`pausing` -> `paused`); a queued one is
    held back (`paused`)."""
    job = _control("pause", job_id, principal, session)
    return job_public(job, principal.project_name, failures=failed_attempts(session, job.id))


@router.post(
    "/jobs/{job_id}/resume",
    response_model=JobPublic,
    summary="Resume a paused job",
    responses={**NOT_FOUND, **CONFLICT, **AUTH_ERRORS},
)
def resume_job(
    job_id: str, principal: Submitter, session: SessionDep, settings: SettingsDep
) -> JobPublic:
    """Queue a paused job again; it continues from its LATEST checkpoint."""
    job = _control("resume", job_id, principal, session)
    dispatch_job(session, job.id, job.queue, settings)
    return job_public(job, principal.project_name, failures=failed_attempts(session, job.id))


@router.get(
    "/jobs/{job_id}/events",
    response_model=EventsPublic,
    summary="A job's history",
    responses={**NOT_FOUND, **AUTH_ERRORS},
)
def list_job_events(
    job_id: str,
    principal: Reader,
    session: SessionDep,
    cursor: Annotated[str | None, Query(max_length=20, description=CURSOR_DOC)] = None,
    after: Annotated[
        int, Query(ge=0, le=MAX_ROW_ID, description="Deprecated: the cursor as a number.")
    ] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 500,
) -> EventsPublic:
    job_id = own_job_id(session, principal, job_id)
    start = numeric_cursor(cursor, after) or 0
    events = store.list_events(session, job_id, start, limit + 1)
    has_more, events = len(events) > limit, events[:limit]
    requests = store.stop_request_events(session, job_id)
    labels = label_events([_facts(e) for e in events], [_facts(e) for e in requests])
    data = [
        EventPublic.model_validate(e, from_attributes=True).model_copy(update={"label": label})
        for e, label in zip(events, labels, strict=True)
    ]
    last = events[-1].id if events else start or None
    return EventsPublic(
        data=data,
        has_more=has_more,
        next_after=last,
        next_cursor=None if last is None else str(last),
    )


def _facts(event: JobEvent) -> EventFacts:
    data = event.data or {}
    rule = data.get("rule") if event.kind == "transition" else None
    trainer_event = data.get("event") if event.kind != "transition" else None
    return EventFacts(
        event.id,
        event.attempt,
        event.kind,
        rule if isinstance(rule, str) else None,
        trainer_event if isinstance(trainer_event, str) else None,
    )
