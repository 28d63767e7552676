"""Job ownership in the database: claim, renew, fence and expire worker leases.

A broker message only says "look at job X"; the row decides. Claiming a queued job is a
status change, so it lives in `jobs.orchestration.claims`; this module builds the `Claim`
it hands out. `renew_lease` extends it while the job runs and tells
the worker the job's current status (how cancel and pause reach it); `holds_lease` is the
fence every ingestion batch passes first, so a worker whose lease was taken over writes
nothing for its old attempt. `expired_leases` and `stale_queued_jobs` feed the reconciler.
Multi-node gangs record their slots as `gang_slot` job events of the attempt.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from jobs.store.engine import is_postgresql
from jobs.store.queries import lock_job
from jobs.store.status import ACTIVE, LIVE_WORKERS, JobStatus, WorkerStatus
from jobs.store.tables import Job, JobEvent, Worker, utcnow

GANG_SLOT_EVENT = "gang_slot"


@dataclass(frozen=True)
class Claim:
    """What a worker needs to run one attempt of a job it now owns."""

    job_id: str
    attempt: int
    recipe: dict[str, Any]
    resources: dict[str, Any]
    run_dir: str
    queue: str
    max_attempts: int
    node_rank: int = 0
    endpoint: str | None = None

    @property
    def nnodes(self) -> int:
        return int(self.resources.get("nnodes") or 1)


def lease_until(seconds: float) -> datetime:
    return utcnow() + timedelta(seconds=seconds)


def claim_of(job: Job, node_rank: int = 0, endpoint: str | None = None) -> Claim:
    return Claim(
        job_id=job.id,
        attempt=job.attempt,
        recipe=dict(job.recipe or {}),
        resources=dict(job.resources or {}),
        run_dir=str(job.run_dir),
        queue=job.queue,
        max_attempts=job.max_attempts,
        node_rank=node_rank,
        endpoint=endpoint,
    )


def renew_lease(
    session: Session, job_id: str, worker: str, attempt: int, lease_seconds: float
) -> str | None:
    """Extend the lease; returns the job's status, or None when this worker lost the job."""
    stmt = (
        update(Job)
        .where(Job.id == job_id, Job.lease_owner == worker, Job.attempt == attempt)
        .where(Job.status.in_([s.value for s in ACTIVE]))
        .values(lease_expires_at=lease_until(lease_seconds))
        .returning(Job.status)
    )
    return session.execute(stmt).scalar_one_or_none()


def holds_lease(session: Session, job_id: str, worker: str, attempt: int) -> bool:
    """The fence: does `worker` still own `attempt` of the job? Locks the row for sharing
    (PostgreSQL) so a takeover cannot commit in the middle of the caller's transaction."""
    stmt = select(Job.lease_owner, Job.attempt, Job.status).where(Job.id == job_id)
    if is_postgresql(session):
        stmt = stmt.with_for_update(read=True)
    row = session.execute(stmt).one_or_none()
    return bool(row) and row.lease_owner == worker and row.attempt == attempt


def job_attempt_status(session: Session, job_id: str) -> tuple[int, str] | None:
    row = session.execute(select(Job.attempt, Job.status).where(Job.id == job_id)).one_or_none()
    return (row.attempt, row.status) if row else None


def expired_leases(session: Session, now: datetime | None = None, limit: int = 100) -> list[Job]:
    """Active jobs whose lease ran out, locked (SKIP LOCKED: another reconciler may act)."""
    stmt = (
        select(Job)
        .where(Job.status.in_([s.value for s in ACTIVE]), Job.lease_expires_at < (now or utcnow()))
        .order_by(Job.lease_expires_at)
        .limit(limit)
    )
    if is_postgresql(session):
        stmt = stmt.with_for_update(skip_locked=True)
    return list(session.execute(stmt).scalars())


def stale_queued_jobs(session: Session, older_than: datetime, limit: int = 500) -> list[Job]:
    """Queued jobs not dispatched (or last dispatched) before `older_than`."""
    last_sent = func.coalesce(Job.dispatched_at, Job.updated_at)
    stmt = (
        select(Job)
        .where(Job.status == JobStatus.QUEUED, last_sent < older_than)
        .order_by(Job.priority.desc(), Job.created_at)
        .limit(limit)
    )
    return list(session.execute(stmt).scalars())


def gang_slots(session: Session, job_id: str, attempt: int) -> list[JobEvent]:
    stmt = (
        select(JobEvent)
        .where(JobEvent.job_id == job_id, JobEvent.kind == GANG_SLOT_EVENT)
        .where(JobEvent.attempt == attempt)
        .order_by(JobEvent.id)
    )
    return list(session.execute(stmt).scalars())


def take_gang_slot(
    session: Session, job_id: str, worker: str, endpoint: str | None = None
) -> Claim | None:
    """Join the current attempt of a multi-node job; None when its gang is full or over.

    The first slot (node 0) is taken by the claiming worker with the rendezvous endpoint;
    the others read the endpoint from it. The job row lock serialises joiners.
    """
    job = lock_job(session, job_id)
    nnodes = int((job.resources or {}).get("nnodes") or 1)
    if job.status not in (JobStatus.STARTING, JobStatus.RUNNING) or nnodes < 2:
        return None
    slots = gang_slots(session, job_id, job.attempt)
    if len(slots) >= nnodes or any(s.data.get("worker") == worker for s in slots):
        return None
    if not slots and endpoint is None:
        return None
    rank = len(slots)
    endpoint = endpoint if rank == 0 else slots[0].data.get("endpoint")
    session.add(
        JobEvent(
            job_id=job_id,
            attempt=job.attempt,
            kind=GANG_SLOT_EVENT,
            message=f"node {rank} of {nnodes}: worker {worker}",
            data={"worker": worker, "node_rank": rank, "endpoint": endpoint},
        )
    )
    session.flush()
    return claim_of(job, node_rank=rank, endpoint=endpoint)


def record_heartbeat(
    session: Session, name: str, queues: str, resources: dict[str, Any], status: WorkerStatus
) -> None:
    """Insert or refresh this worker's row in `workers`."""
    status = WorkerStatus(status).value
    row = session.get(Worker, name)
    now = utcnow()
    if row is None:
        session.add(
            Worker(
                name=name,
                queue=queues[:32],
                resources=resources,
                status=status,
                started_at=now,
                last_heartbeat=now,
            )
        )
    else:
        row.queue, row.resources, row.status, row.last_heartbeat = (
            queues[:32],
            resources,
            status,
            now,
        )
    session.flush()


def live_worker_packages(session: Session, queue: str, fresh_after: datetime) -> list[list[str]]:
    """The optional packages each live worker of `queue` advertised (one list per worker)."""
    rows = session.execute(
        select(Worker.queue, Worker.resources).where(
            Worker.last_heartbeat >= fresh_after, Worker.status.in_(LIVE_WORKERS)
        )
    ).all()
    return [
        list((resources or {}).get("packages") or [])
        for queues, resources in rows
        if queue in (resources or {}).get("queues", queues.split(","))
    ]


def mark_lost_workers(session: Session, older_than: datetime) -> list[str]:
    """Workers whose last heartbeat is older than `older_than` become `lost`."""
    stmt = (
        update(Worker)
        .where(
            Worker.last_heartbeat < older_than,
            Worker.status.not_in([WorkerStatus.LOST, WorkerStatus.OFFLINE]),
        )
        .values(status=WorkerStatus.LOST.value)
        .returning(Worker.name)
    )
    return list(session.execute(stmt).scalars())
