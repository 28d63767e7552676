"""Job queries for the API: create a job (with its idempotency key), list with a cursor,
read events, logs and checkpoints, dispatch marks and leases' row locks (metric reads are
`jobs.store.metric_reads`).

Every read is scoped to a project: a job of another project is simply not found. Status
changes go through `jobs.orchestration.states.transition`; nothing here writes `status`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    and_,
    bindparam,
    func,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from jobs.store.status import JobStatus, WorkerStatus
from jobs.store.tables import (
    Checkpoint,
    Job,
    JobEvent,
    JobLog,
    Worker,
    new_job_id,
    utcnow,
)


class IdempotencyConflict(Exception):
    """The idempotency key was used before with a different request body."""

    def __init__(self, job: Job):
        self.job = job
        super().__init__(f"Idempotency-Key already used for job {job.id} with another body")


@dataclass
class NewJob:
    """Everything the API resolved before storing a job."""

    name: str
    spec: dict[str, Any]
    recipe: dict[str, Any]
    plan: dict[str, Any]
    resources: dict[str, Any]
    queue: str
    priority: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    max_attempts: int = 3
    idempotency_key: str | None = None
    request_hash: str | None = None


def request_hash(body: dict[str, Any]) -> str:
    """A stable hash of a request body (key order does not matter)."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def find_by_idempotency_key(session: Session, project_id: int, key: str) -> Job | None:
    stmt = select(Job).where(Job.project_id == project_id, Job.idempotency_key == key)
    return session.scalar(stmt)


def replay_or_conflict(existing: Job, body_hash: str | None) -> Job:
    """The job an idempotency key created, for a retry of the same body (by `request_hash`);
    IdempotencyConflict for another body."""
    if existing.request_hash != body_hash:
        raise IdempotencyConflict(existing)
    return existing


def create_job(
    session: Session, project_id: int, new: NewJob, *, dispatching: bool = False
) -> tuple[Job, bool]:
    """Add a queued job and its `submitted` event to the session's transaction, flushed;
    returns (job, created). The caller commits. `dispatching`: the caller sends the id to
    the broker right after the commit, so the dispatch is recorded with the row
    (`jobs.broker.dispatch_new_job` takes the mark back if the send fails).

    An idempotency key already used is found by the unique (project_id, idempotency_key)
    constraint, however concurrent twins interleave: the insert fails, the transaction is
    rolled back, and the stored job is returned for the same body (IdempotencyConflict for
    another). A caller that answers replays before validating (`api.submission.submit`)
    has looked the key up already, so the usual submit asks once.
    """
    now = utcnow()
    job = Job(
        **vars(new),
        id=new_job_id(),
        project_id=project_id,
        status=JobStatus.QUEUED.value,
        attempt=0,
        created_at=now,
        updated_at=now,
        dispatched_at=now if dispatching else None,
    )
    event = JobEvent(
        job_id=job.id,
        attempt=0,
        kind="submitted",
        to_status=JobStatus.QUEUED.value,
        message="job submitted",
        data={"queue": new.queue},
        created_at=now,
    )
    session.add_all([job, event])
    try:
        session.flush()
    except IntegrityError:
        session.rollback()  # the twin's row is committed now: read it in a new transaction
        if new.idempotency_key is None:
            raise
        existing = find_by_idempotency_key(session, project_id, new.idempotency_key)
        if existing is None:
            raise
        return replay_or_conflict(existing, new.request_hash), False
    return job, True


def mark_dispatched(session: Session, job_id: str) -> None:
    """Record that the job id was (re)sent to the broker, only while it is still queued (a
    worker may have claimed it already). A loaded `Job` of this session is updated too (the
    rows matched are fetched, so one the database did not change is left alone)."""
    stmt = (
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.QUEUED.value)
        .values(dispatched_at=utcnow())
    )
    session.execute(stmt.execution_options(synchronize_session="fetch"))


def is_job_id(value: str) -> bool:
    try:
        return str(uuid.UUID(value)) == value.lower() and len(value) == 36
    except (ValueError, AttributeError):
        return False


def get_job(session: Session, project_id: int, job_id: str) -> Job | None:
    """The job if it exists in this project (a malformed id is simply not found)."""
    if not is_job_id(job_id):
        return None
    job = session.get(Job, job_id.lower())
    return job if job is not None and job.project_id == project_id else None


_STATUS_BY_ID = select(Job.status).where(Job.id == bindparam("job_id"))


def job_status(bind: Engine | Connection, job_id: str) -> str | None:
    """The job's status by primary key, None when no such job: one index probe, no ORM
    session (the worker asks this for every message). Given a connection (autocommit, see
    `status_connection`), it uses that one; given an engine, a short connection of its own."""
    if isinstance(bind, Connection):
        return bind.execute(_STATUS_BY_ID, {"job_id": job_id}).scalar()
    with bind.connect() as conn:  # ends in a rollback: SQLite's BEGIN IMMEDIATE is released
        return conn.execute(_STATUS_BY_ID, {"job_id": job_id}).scalar()


def status_connection(engine: Engine) -> Connection | None:
    """A connection to hold for many `job_status` probes: autocommit on PostgreSQL; None on
    SQLite, where every transaction takes the write lock and must stay short."""
    if engine.dialect.name == "sqlite":
        return None
    return engine.execution_options(isolation_level="AUTOCOMMIT").connect()


def job_id_in_project(session: Session, project_id: int, job_id: str) -> str | None:
    """The stored (lower-case) id when `job_id` names a job of this project: one primary-key
    probe that loads no column but the id (telemetry reads need nothing more)."""
    if not is_job_id(job_id):
        return None
    stmt = select(Job.id).where(Job.id == job_id.lower(), Job.project_id == project_id)
    return session.scalar(stmt)


def owns_job(session: Session, project_id: int, job_id: str) -> bool:
    """Whether `job_id` is exactly (lower-case, as stored) the id of a job of this project."""
    if not is_job_id(job_id) or job_id != job_id.lower():
        return False
    stmt = select(Job.id).where(Job.id == job_id, Job.project_id == project_id)
    return session.scalar(stmt) is not None


def job_checkpoint_dir(session: Session, project_id: int, job_id: str) -> str | None:
    """The job's own `checkpoint.checkpoint_dir`; None when it kept the default."""
    job = get_job(session, project_id, job_id)
    section = (job.recipe or {}).get("checkpoint") if job is not None else None
    value = section.get("checkpoint_dir") if isinstance(section, dict) else None
    return value if isinstance(value, str) else None


# --- listing with a cursor -----------------------------------------------------------------


def encode_cursor(job: Job) -> str:
    raw = json.dumps([job.created_at.isoformat(), job.id])
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """Raises ValueError on a cursor this server did not hand out."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        created, job_id = json.loads(base64.urlsafe_b64decode(padded.encode()))
        when = datetime.fromisoformat(created)
        if when.tzinfo is None or not is_job_id(job_id):
            raise ValueError(job_id)
        return when, job_id
    except Exception as exc:  # any decoding problem means the same thing to the caller
        raise ValueError("not a cursor returned by this server") from exc


def list_jobs(
    session: Session,
    project_id: int,
    *,
    statuses: list[str] | None = None,
    labels: dict[str, str] | None = None,
    cursor: str | None = None,
    limit: int = 50,
) -> tuple[list[Job], str | None]:
    """Newest first; returns the page and the cursor of the next page (None at the end)."""
    stmt = select(Job).where(Job.project_id == project_id)
    if statuses:
        stmt = stmt.where(Job.status.in_(statuses))
    for key, value in (labels or {}).items():
        stmt = stmt.where(Job.labels[key].as_string() == value)
    if cursor:
        created, job_id = decode_cursor(cursor)
        stmt = stmt.where(
            or_(Job.created_at < created, and_(Job.created_at == created, Job.id < job_id))
        )
    stmt = stmt.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit + 1)
    jobs = list(session.scalars(stmt))
    more = len(jobs) > limit
    jobs = jobs[:limit]
    return jobs, (encode_cursor(jobs[-1]) if more and jobs else None)


# --- events, logs, checkpoints ---------------------------------------------------------------


def list_events(session: Session, job_id: str, after: int = 0, limit: int = 500) -> list[JobEvent]:
    stmt = (
        select(JobEvent)
        .where(JobEvent.job_id == job_id, JobEvent.id > after)
        .order_by(JobEvent.id)
        .limit(limit)
    )
    return list(session.scalars(stmt))


def list_logs(session: Session, job_id: str, after: int = 0, limit: int = 1000) -> list[JobLog]:
    stmt = (
        select(JobLog)
        .where(JobLog.job_id == job_id, JobLog.id > after)
        .order_by(JobLog.id)
        .limit(limit)
    )
    return list(session.scalars(stmt))


def list_checkpoints(session: Session, job_id: str) -> list[Checkpoint]:
    stmt = select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step)
    return list(session.scalars(stmt))


def job_counts_by_status(session: Session, project_id: int | None = None) -> dict[str, int]:
    """Jobs per status, of one project when given."""
    stmt = select(Job.status, func.count()).group_by(Job.status)
    if project_id is not None:
        stmt = stmt.where(Job.project_id == project_id)
    return {status: count for status, count in session.execute(stmt)}


def worker_gauges(session: Session) -> tuple[dict[str, int], dict[str, int]]:
    """(workers per status, dropped stale messages per reason summed over live workers)."""
    by_status: dict[str, int] = {}
    dropped: dict[str, int] = {}
    for status, resources in session.execute(select(Worker.status, Worker.resources)):
        by_status[status] = by_status.get(status, 0) + 1
        if status == WorkerStatus.LOST:
            continue
        for reason, n in ((resources or {}).get("dropped_messages") or {}).items():
            dropped[reason] = dropped.get(reason, 0) + int(n)
    return by_status, dropped


def queued_by_queue(session: Session) -> dict[str, int]:
    stmt = select(Job.queue, func.count()).where(Job.status == JobStatus.QUEUED).group_by(Job.queue)
    return {queue: count for queue, count in session.execute(stmt)}


def ping(session: Session) -> None:
    session.execute(text("SELECT 1"))


class JobNotFound(LookupError):
    def __init__(self, job_id: str):
        self.job_id = job_id
        super().__init__(f"job {job_id} does not exist")


def lock_job(session: Session, job_id: str) -> Job:
    """Load the job row under a row lock (FOR UPDATE; a no-op clause on SQLite)."""
    stmt = (
        select(Job)
        .where(Job.id == job_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    job = session.execute(stmt).scalar_one_or_none()
    if job is None:
        raise JobNotFound(job_id)
    return job
