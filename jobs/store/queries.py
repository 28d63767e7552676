"""Job queries for the API: create with an idempotency key, list with a cursor, read events,
logs and checkpoints (metric reads are `jobs.store.metric_reads`).

Every read is scoped to a project: a job of another project is simply not found. Creation
relies on the unique (project_id, idempotency_key) constraint, so concurrent requests with
one key create one job however they interleave. Status changes go through
`jobs.orchestration.states.transition`; nothing here writes `status` except the initial `queued`.
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
    insert,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from jobs.store.api_keys import KeyGuard
from jobs.store.driver import DriverStatement
from jobs.store.status import JobStatus
from jobs.store.tables import (
    ApiKey,
    Checkpoint,
    Job,
    JobEvent,
    JobLog,
    Project,
    Worker,
    new_job_id,
    utcnow,
)


class KeyRefused(Exception):
    """A guarded write found its key revoked or gone, or its project's grant changed."""


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


def _replay_or_conflict(existing: Job, new: NewJob) -> Job:
    if existing.request_hash != new.request_hash:
        raise IdempotencyConflict(existing)
    return existing


_INSERT_JOB = insert(Job.__table__)
_INSERT_EVENT = insert(JobEvent.__table__)
_EVENT_COLUMNS = ("attempt", "kind", "from_status", "to_status", "message", "data", "created_at")


def _live_key() -> Any:
    """The guard's key row: there, not revoked, in the job's project, with the grant that
    validation used (`guard_*` parameters, and the job's `project_id`)."""
    return (
        select(ApiKey.project_id)
        .join(Project, Project.id == ApiKey.project_id)
        .where(ApiKey.key_hash == bindparam("guard_key_hash"), ApiKey.revoked_at.is_(None),
               ApiKey.project_id == bindparam("project_id"),
               Project.allow_remote_code == bindparam("guard_allow_remote_code"))
    )  # fmt: skip


def _job_and_event_statement(guarded: bool = False) -> Any:
    """PostgreSQL: the job row and its `submitted` event as one statement, so that on an
    autocommit connection a submit's write is one round trip and one transaction (no BEGIN,
    no COMMIT): `WITH new_job AS (INSERT INTO jobs … RETURNING id) INSERT INTO job_events
    SELECT new_job.id, … FROM new_job`. Every job column is a parameter; the event's are
    prefixed `event_`. `guarded`: the job row is selected from `_live_key`, so a key
    revoked since it was read inserts nothing, and the event's job id is returned (no row:
    refused)."""
    jobs, events = Job.__table__, JobEvent.__table__
    values = {c.name: bindparam(c.name, type_=c.type) for c in jobs.c}
    if guarded:
        live = _live_key().cte("live_key")
        job_insert = insert(jobs).from_select(
            list(values), select(*values.values()).select_from(live)
        )
    else:
        job_insert = insert(jobs).values(values)
    new_job = job_insert.returning(jobs.c.id).cte("new_job")
    columns = [bindparam(f"event_{name}", type_=events.c[name].type) for name in _EVENT_COLUMNS]
    statement = insert(events).from_select(
        ["job_id", *_EVENT_COLUMNS], select(new_job.c.id, *columns).select_from(new_job)
    )
    return statement.returning(events.c.job_id) if guarded else statement


_KEY_IS_LIVE = DriverStatement(_live_key())
_INSERT_JOB_AND_EVENT = DriverStatement(_job_and_event_statement())
_INSERT_GUARDED_JOB_AND_EVENT = DriverStatement(_job_and_event_statement(guarded=True))


def create_job(
    session: Session, project_id: int, new: NewJob, *, looked_up: bool = False,
    dispatching: bool = False, guard: KeyGuard | None = None,
) -> tuple[Job, bool]:  # fmt: skip
    """Insert a queued job and its `submitted` event in one commit; returns (job, created).

    A replay returns the old job; IdempotencyConflict when the key was used with another
    body. `looked_up`: the caller has just searched the key, so only the unique constraint
    (a concurrent twin) can still find one. `dispatching`: the caller sends the id to the
    broker right after this commit, so the dispatch is recorded in the same transaction
    (if the send then fails, the reconciler's grace window sends it again). `guard`: the
    write also checks the caller's key (`KeyGuard`), in the same statement on PostgreSQL,
    and raises KeyRefused, writing nothing, when it no longer holds.
    """
    if new.idempotency_key and not looked_up:
        existing = find_by_idempotency_key(session, project_id, new.idempotency_key)
        if existing is not None:
            return _replay_or_conflict(existing, new), False
    now = utcnow()
    values = {**vars(new), "id": new_job_id(), "project_id": project_id,
              "status": JobStatus.QUEUED.value, "attempt": 0, "created_at": now,
              "updated_at": now, "dispatched_at": now if dispatching else None,
              **dict.fromkeys(("lease_owner", "lease_expires_at", "error_code",
                               "error_message", "run_dir", "started_at", "finished_at"))}  # fmt: skip
    event = {"attempt": 0, "kind": "submitted", "from_status": None,
             "to_status": JobStatus.QUEUED.value, "message": "job submitted",
             "data": {"queue": new.queue}, "created_at": now}  # fmt: skip
    # On an autocommit connection (the API's `read_session`) the one statement is the whole
    # transaction: no session transaction to begin and commit around it.
    bind = session.get_bind()
    direct = isinstance(bind, Connection) and _autocommit(bind)
    try:
        inserted = _insert_job(bind if direct else session.connection(), values, event, guard)
    except IntegrityError:
        # Another request with the same key won the race; its row is committed now.
        session.rollback()
        existing = find_by_idempotency_key(session, project_id, new.idempotency_key or "")
        if existing is None:
            raise
        return _replay_or_conflict(existing, new), False
    if not inserted:
        session.rollback()
        raise KeyRefused("the API key was revoked, or its project's grant changed")
    if not direct:
        session.commit()
    return written_job(values), True


def written_job(values: dict[str, Any]) -> Job:
    """The job as `values` wrote it, for the answer: a transient `Job` whose attributes are
    set without attribute events (`Job(**values)` spends ~20 µs on them; this ~1 µs)."""
    job = Job.__mapper__.class_manager.new_instance()
    job.__dict__.update(values)
    return job


def _autocommit(conn: Connection) -> bool:
    return conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT"


def _insert_job(
    conn: Connection, values: dict[str, Any], event: dict[str, Any], guard: KeyGuard | None
) -> bool:
    """Core inserts on the session's connection (the answer needs no ORM identity, only the
    values written); False when the guard refused."""
    guarded = {} if guard is None else {"guard_key_hash": guard.key_hash,
                                        "guard_allow_remote_code": guard.allow_remote_code}  # fmt: skip
    if conn.dialect.name == "postgresql":
        params = {**values, **guarded, **{f"event_{k}": v for k, v in event.items()}}
        if guard is None:
            _INSERT_JOB_AND_EVENT.run(conn, params)
            return True
        return _INSERT_GUARDED_JOB_AND_EVENT.first(conn, params) is not None
    # SQLite: the session's transaction holds the write lock, so check, then write.
    if (
        guard is not None
        and _KEY_IS_LIVE.first(conn, {**guarded, "project_id": guard.project_id}) is None
    ):
        return False
    conn.execute(_INSERT_JOB, values)
    conn.execute(_INSERT_EVENT, {"job_id": values["id"], **event})
    return True


def mark_dispatched(session: Session, job_id: str) -> None:
    """Record that the job id was (re)sent to the broker (only while it is still queued)."""
    stmt = (
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.QUEUED)
        .values(dispatched_at=utcnow())
    )
    session.execute(stmt.execution_options(synchronize_session=False))


def clear_dispatched(session: Session, job_id: str) -> None:
    """Undo the dispatch mark of a job whose send failed (the reconciler sends it later)."""
    stmt = update(Job).where(Job.id == job_id).values(dispatched_at=None)
    session.execute(stmt.execution_options(synchronize_session=False))


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
        if status == "lost":
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
