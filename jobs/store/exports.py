"""Export rows: creating one, reading a project's, the lease a worker renews, and what the
reconciler looks for (expired leases, queued exports nobody claimed).

Every read a client can reach takes the caller's project id, so another project's export
is never found. Status changes are `jobs.orchestration.export_states`' business; this module
only writes what is not a status (the new row, the lease's expiry, the dispatch mark).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from jobs.store.engine import is_postgresql
from jobs.store.status import ExportStatus
from jobs.store.tables import Checkpoint, Export, ExportEvent, Job, utcnow


def checkpoint_steps(session: Session, job_id: str) -> list[int]:
    """The steps of a job's published checkpoints, ascending."""
    stmt = select(Checkpoint.step).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step)
    return list(session.scalars(stmt))


def checkpoint_path(session: Session, job_id: str, step: int) -> str | None:
    stmt = select(Checkpoint.path).where(Checkpoint.job_id == job_id, Checkpoint.step == step)
    return session.scalars(stmt).first()


def create_export(
    session: Session, job: Job, step: int, kind: str, merge_lora: bool, dtype: str
) -> Export:
    """A new `queued` export of `job`'s checkpoint at `step`, marked as being dispatched."""
    now = utcnow()
    export = Export(
        job_id=job.id,
        project_id=job.project_id,
        step=step,
        kind=kind,
        merge_lora=merge_lora,
        dtype=dtype,
        status=ExportStatus.QUEUED.value,
        queue=job.queue,
        created_at=now,
        updated_at=now,
        dispatched_at=now,
    )
    session.add(export)
    session.flush()
    session.add(
        ExportEvent(
            export_id=export.id,
            kind="created",
            to_status=export.status,
            message=f"{kind} export of step {step} as {dtype}",
            data={"step": step, "kind": kind, "dtype": dtype},
            created_at=now,
        )
    )
    return export


def get_export(session: Session, project_id: int, export_id: str) -> Export | None:
    stmt = select(Export).where(Export.id == export_id, Export.project_id == project_id)
    return session.scalars(stmt).first()


def list_exports(session: Session, job_id: str, limit: int = 200) -> list[Export]:
    """A job's exports, newest first."""
    stmt = (
        select(Export)
        .where(Export.job_id == job_id)
        .order_by(Export.created_at.desc(), Export.id)
        .limit(limit)
    )
    return list(session.scalars(stmt))


def list_export_events(session: Session, export_id: str, limit: int = 500) -> list[ExportEvent]:
    stmt = (
        select(ExportEvent)
        .where(ExportEvent.export_id == export_id)
        .order_by(ExportEvent.id)
        .limit(limit)
    )
    return list(session.scalars(stmt))


def renew_export_lease(
    session: Session, export_id: str, worker: str, attempt: int, lease_seconds: float
) -> str | None:
    """Push the lease forward if `worker` still holds this attempt; the export's status
    (how a cancel reaches the worker), or None when the lease is no longer this worker's."""
    stmt = (
        update(Export)
        .where(
            Export.id == export_id,
            Export.attempt == attempt,
            Export.lease_owner == worker,
            Export.status.in_([ExportStatus.RUNNING.value, ExportStatus.CANCELLING.value]),
        )
        .values(lease_expires_at=utcnow() + timedelta(seconds=lease_seconds))
        .returning(Export.status)
    )
    return session.execute(stmt).scalar_one_or_none()


def expired_export_leases(session: Session, limit: int = 100) -> list[Export]:
    """Running or cancelling exports whose lease ran out, locked (SKIP LOCKED)."""
    active = [ExportStatus.RUNNING.value, ExportStatus.CANCELLING.value]
    stmt = (
        select(Export)
        .where(Export.status.in_(active), Export.lease_expires_at < utcnow())
        .order_by(Export.lease_expires_at)
        .limit(limit)
    )
    if is_postgresql(session):
        stmt = stmt.with_for_update(skip_locked=True)
    return list(session.scalars(stmt))


def stale_queued_exports(
    session: Session, older_than: datetime, limit: int = 200
) -> list[tuple[str, str]]:
    """(id, queue) of queued exports not dispatched (or last dispatched) before `older_than`."""
    last_sent = func.coalesce(Export.dispatched_at, Export.updated_at)
    stmt = (
        select(Export.id, Export.queue)
        .where(Export.status == ExportStatus.QUEUED.value, last_sent < older_than)
        .order_by(Export.created_at)
        .limit(limit)
    )
    return [(row.id, row.queue) for row in session.execute(stmt)]


def mark_export_dispatched(session: Session, export_id: str) -> None:
    session.execute(update(Export).where(Export.id == export_id).values(dispatched_at=utcnow()))
