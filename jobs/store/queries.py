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
    Select,
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

# The columns a list may be sorted by; the id breaks ties, so every order is total and a
# keyset cursor (the last row's sort value and id) pages through it without gaps or repeats.
SORT_COLUMNS = {
    "created_at": Job.created_at,
    "name": Job.name,
    "status": Job.status,
    "priority": Job.priority,
}


@dataclass(frozen=True)
class JobOrder:
    """How a job list is sorted: one of SORT_COLUMNS, then the id, both in one direction."""

    field: str = "created_at"
    descending: bool = True

    @classmethod
    def parse(cls, text: str) -> JobOrder:
        """`name`, `-created_at` (a leading `-` sorts descending); ValueError otherwise."""
        field = text.removeprefix("-")
        if field not in SORT_COLUMNS:
            raise ValueError(f"cannot sort by '{text}'")
        return cls(field, text.startswith("-"))


@dataclass
class JobPage:
    """One page of a job list, the cursor of the next (None at the end) and the total."""

    jobs: list[Job]
    next_cursor: str | None
    total: int


def encode_cursor(job: Job, order: JobOrder = JobOrder()) -> str:
    value = getattr(job, order.field)
    value = value.isoformat() if isinstance(value, datetime) else value
    raw = json.dumps([order.field, order.descending, value, job.id])
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str, order: JobOrder = JobOrder()) -> tuple[Any, str]:
    """(sort value, id) of the row a page ended on. Raises ValueError on a cursor this
    server did not hand out, or one handed out for another sort order."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        fields = json.loads(base64.urlsafe_b64decode(padded.encode()))
        if len(fields) == 2:  # a cursor from before sorting: newest first
            fields = ["created_at", True, *fields]
        field, descending, value, job_id = fields
        value = _cursor_value(field, value)
        if not is_job_id(job_id):
            raise ValueError(job_id)
    except Exception as exc:  # any decoding problem means the same thing to the caller
        raise ValueError("not a cursor returned by this server") from exc
    if (field, descending) != (order.field, order.descending):
        raise ValueError("this cursor belongs to a list in another sort order")
    return value, job_id


def _cursor_value(field: str, value: Any) -> Any:
    if field == "created_at":
        when = datetime.fromisoformat(value)
        if when.tzinfo is None:
            raise ValueError(value)
        return when
    expected = int if field == "priority" else str
    if field not in SORT_COLUMNS or type(value) is not expected:
        raise ValueError(value)
    return value


@dataclass(frozen=True)
class JobFilter:
    """Which of a project's jobs a list shows: statuses, labels (all must match), and a
    text that the name contains (any case) or the id starts with."""

    statuses: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    text: str = ""

    def apply(self, stmt: Select, project_id: int) -> Select:
        stmt = stmt.where(Job.project_id == project_id)
        if self.statuses:
            stmt = stmt.where(Job.status.in_(self.statuses))
        for key, value in self.labels.items():
            stmt = stmt.where(Job.labels[key].as_string() == value)
        if self.text:
            stmt = stmt.where(
                or_(
                    Job.name.icontains(self.text, autoescape=True),
                    Job.id.startswith(self.text.lower(), autoescape=True),
                )
            )
        return stmt


def list_jobs(
    session: Session,
    project_id: int,
    where: JobFilter = JobFilter(),
    *,
    order: JobOrder = JobOrder(),
    cursor: str | None = None,
    limit: int = 50,
) -> JobPage:
    """One page of the project's jobs matching `where`, in `order`, after `cursor`."""
    column = SORT_COLUMNS[order.field]
    stmt = where.apply(select(Job), project_id)
    if cursor:
        value, job_id = decode_cursor(cursor, order)
        if order.descending:
            after = or_(column < value, and_(column == value, Job.id < job_id))
        else:
            after = or_(column > value, and_(column == value, Job.id > job_id))
        stmt = stmt.where(after)
    if order.descending:
        stmt = stmt.order_by(column.desc(), Job.id.desc())
    else:
        stmt = stmt.order_by(column.asc(), Job.id.asc())
    jobs = list(session.scalars(stmt.limit(limit + 1)))
    more = len(jobs) > limit
    jobs = jobs[:limit]
    total = session.scalar(where.apply(select(func.count()).select_from(Job), project_id))
    return JobPage(jobs, encode_cursor(jobs[-1], order) if more and jobs else None, total or 0)


# --- events, logs, checkpoints ---------------------------------------------------------------


def list_events(session: Session, job_id: str, after: int = 0, limit: int = 500) -> list[JobEvent]:
    stmt = (
        select(JobEvent)
        .where(JobEvent.job_id == job_id, JobEvent.id > after)
        .order_by(JobEvent.id)
        .limit(limit)
    )
    return list(session.scalars(stmt))


def stop_request_events(session: Session, job_id: str) -> list[JobEvent]:
    """The job's status changes that asked a running attempt to stop (pause or cancel)."""
    stmt = (
        select(JobEvent)
        .where(
            JobEvent.job_id == job_id,
            JobEvent.kind == "transition",
            JobEvent.to_status.in_([JobStatus.PAUSING.value, JobStatus.CANCELLING.value]),
        )
        .order_by(JobEvent.id)
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
