"""What a job produces, read back: metrics (cursor, downsampling, SSE stream), logs and
checkpoints. All scoped to the caller's project like every job lookup.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from api.deps import Reader, SessionDep
from api.errors import InvalidRequest
from api.pages import CURSOR_DOC, json_page, numeric_cursor
from api.retention_schemas import CheckpointDeletionPublic
from api.routes.jobs import AUTH_ERRORS, NOT_FOUND, find_job, own_job_id
from api.schemas import (
    CheckpointPublic,
    CheckpointsPublic,
    LogLine,
    LogsPublic,
    MetricsPublic,
)
from api.sse import MAX_EVENT_ID, SSE_HEADERS, Fetch, last_event_id, stream_rows
from jobs.recipe.errors import FieldError
from jobs.store import metric_reads, retention
from jobs.store import queries as store
from jobs.store.tables import Job, JobLog

router = APIRouter(prefix="/v1/jobs/{job_id}", tags=["telemetry"])

Kind = Literal["train", "val"]
STREAM_DOC = {200: {"content": {"text/event-stream": {}}, "description": "Server-sent events."}}


@router.get(
    "/metrics",
    response_model=MetricsPublic,
    summary="Metric records of a job",
    responses={
        304: {"description": "Not modified: the `If-None-Match` ETag still holds."},
        **NOT_FOUND,
        **AUTH_ERRORS,
    },
)
def get_job_metrics(
    job_id: str,
    request: Request,
    principal: Reader,
    session: SessionDep,
    kind: Kind = "train",
    after_step: Annotated[
        int | None, Query(ge=-1, le=2**31 - 1, description="Deprecated: the cursor as a number.")
    ] = None,
    cursor: Annotated[str | None, Query(max_length=20, description=CURSOR_DOC)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    max_points: Annotated[
        int | None,
        Query(
            ge=1,
            le=10_000,
            description="Downsample to at most this many records: each "
            "bucket of steps keeps its lowest- and highest-loss records and its last one.",
        ),
    ] = None,
) -> Response:
    """Ascending by step (needs a `read` key). Poll with `cursor=<next_cursor>`: a poll with
    nothing new is one index probe and an empty page. Every answer has an ETag;
    `If-None-Match` with it answers 304 while the page is unchanged."""
    after_step = numeric_cursor(cursor, after_step)
    if after_step is not None and after_step > 2**31 - 1:
        raise InvalidRequest(
            [
                FieldError(
                    "cursor",
                    "past the last possible step",
                    "pass the `next_cursor` of the previous page",
                )
            ]
        )
    query = MetricsQuery(
        own_job_id(session, principal, job_id), kind, after_step, limit, max_points
    )
    return json_page(request, _metrics_page(session, query))


@dataclass(frozen=True)
class MetricsQuery:
    job_id: str  # the stored id of a job of the caller's project
    kind: str
    after_step: int | None
    limit: int
    max_points: int | None


def _metrics_page(session: Session, q: MetricsQuery) -> dict[str, Any]:
    has_more = False
    if q.max_points is not None:
        rows, downsampled = metric_reads.metrics_downsampled(
            session, q.job_id, q.kind, q.after_step, q.max_points
        )
    else:
        rows = metric_reads.metrics_page(session, q.job_id, q.kind, q.after_step, q.limit + 1)
        downsampled, has_more, rows = False, len(rows) > q.limit, rows[: q.limit]
    next_step = rows[-1]["step"] if rows else q.after_step
    return {
        "data": rows,
        "kind": q.kind,
        "downsampled": downsampled,
        "has_more": has_more,
        "next_cursor": None if next_step is None else str(next_step),
        "next_after_step": next_step,
    }


def _stream_fetch(
    request: Request, job_id: str, rows_after: Callable[[Session, int], list[dict[str, Any]]]
) -> Fetch:
    factory: sessionmaker[Session] = request.app.state.session_factory

    def fetch(after: int) -> tuple[list[dict[str, Any]], str | None]:
        with factory() as session:
            # Status first: rows committed before a terminal transition are then visible.
            status = session.scalar(select(Job.status).where(Job.id == job_id))
            return rows_after(session, after), status

    return fetch


def _event_stream(request: Request, fetch: Fetch, event: str, after: int) -> StreamingResponse:
    return StreamingResponse(
        stream_rows(request, fetch, event, after),
        media_type="text/event-stream",
        headers=SSE_HEADERS,
    )


@router.get(
    "/metrics/stream",
    summary="Live metric records (server-sent events)",
    response_class=StreamingResponse,
    responses={**STREAM_DOC, **NOT_FOUND, **AUTH_ERRORS},
)
def stream_metrics(
    job_id: str,
    request: Request,
    principal: Reader,
    session: SessionDep,
    kind: Kind | None = None,
    after_id: Annotated[
        int,
        Query(
            ge=0,
            le=MAX_EVENT_ID,
            description="Start after this event id (`Last-Event-ID` wins when sent).",
        ),
    ] = 0,
) -> StreamingResponse:
    """One `metric` event per record (train and val unless `kind` is given), `id` = the
    record's id; ends with an `end` event when the job has finished."""
    job = find_job(session, principal, job_id)
    kinds = [kind] if kind else ["train", "val"]

    def rows(s: Session, after: int) -> list[dict[str, Any]]:
        return metric_reads.metrics_after_id(s, job.id, kinds, after)

    session.close()
    fetch = _stream_fetch(request, job.id, rows)
    return _event_stream(request, fetch, "metric", last_event_id(request, after_id))


def _log_dict(line: JobLog) -> dict[str, Any]:
    return LogLine.model_validate(line, from_attributes=True).model_dump(mode="json")


@router.get(
    "/logs",
    response_model=LogsPublic,
    summary="A job's stdout and stderr",
    responses={**STREAM_DOC, **NOT_FOUND, **AUTH_ERRORS},
)
def get_job_logs(
    job_id: str,
    request: Request,
    principal: Reader,
    session: SessionDep,
    cursor: Annotated[str | None, Query(max_length=20, description=CURSOR_DOC)] = None,
    after: Annotated[
        int, Query(ge=0, le=MAX_EVENT_ID, description="Deprecated: the cursor as a number.")
    ] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    follow: Annotated[
        bool, Query(description="Stream new lines as server-sent events until the job ends.")
    ] = False,
) -> LogsPublic | StreamingResponse:
    """Lines in order after the cursor; `follow=true` answers `text/event-stream` instead,
    one `log` event per line (resumable with `Last-Event-ID`)."""
    job = find_job(session, principal, job_id)
    after = numeric_cursor(cursor, after) or 0
    if follow:
        session.close()

        def rows(s: Session, cursor: int) -> list[dict[str, Any]]:
            return [_log_dict(line) for line in store.list_logs(s, job.id, cursor, 500)]

        fetch = _stream_fetch(request, job.id, rows)
        return _event_stream(request, fetch, "log", last_event_id(request, after))
    lines = store.list_logs(session, job.id, after, limit + 1)
    has_more, lines = len(lines) > limit, lines[:limit]
    data = [LogLine.model_validate(line, from_attributes=True) for line in lines]
    last = lines[-1].id if lines else after or None
    return LogsPublic(
        data=data,
        lines=data,
        has_more=has_more,
        next_after=last,
        next_cursor=None if last is None else str(last),
    )


@router.get(
    "/checkpoints",
    response_model=CheckpointsPublic,
    summary="A job's checkpoints",
    responses={**NOT_FOUND, **AUTH_ERRORS},
)
def list_job_checkpoints(job_id: str, principal: Reader, session: SessionDep) -> CheckpointsPublic:
    """The checkpoints that exist, ascending by step, with the metrics at that step and why
    retention keeps each (`stored_only` once its local copy was evicted to the artifact
    store); then those retention deleted, with when and why."""
    job = find_job(session, principal, job_id)
    rows = retention.existing_checkpoints(session, [job.id])
    restore = retention.restore_targets(session, job.project_id)
    reasons = retention.kept_because(job, rows, restore)
    data = [
        CheckpointPublic.model_validate(c, from_attributes=True).model_copy(
            update={"kept_because": reasons[c.step], "stored_only": c.evicted_at is not None}
        )
        for c in rows
    ]
    deleted = retention.list_deletions(session, job.id)
    return CheckpointsPublic(
        data=data,
        deleted=[CheckpointDeletionPublic.model_validate(d, from_attributes=True) for d in deleted],
    )
