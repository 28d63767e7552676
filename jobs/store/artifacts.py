"""The `artifacts` rows: what the artifact store holds completely, per job.

The worker records an artifact after its manifest is written (`record_artifact`, an upsert
on job, kind and name, so an upload done twice leaves one row); the API lists a job's rows
and finds one by name. `checkpoints_to_store` is how an attempt catches up on checkpoints
an earlier attempt published but did not finish storing.

Retention reaches the store through these rows: a checkpoint with a deletion record
(`CheckpointDeletion`) is no longer listed at once, and its row stays live in
`stored_copies_to_delete` until its objects are gone from the store (`mark_deleted`), so a
store error only delays the delete to the next pass. A finished job's checkpoint whose copy
is stored may have its local directory evicted (`evictable_checkpoints`, `mark_evicted`);
`stored_copy` is then where its files are fetched from.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, func, select, update
from sqlalchemy.orm import Session

from jobs.store.engine import is_postgresql
from jobs.store.status import TERMINAL
from jobs.store.tables import Artifact, Checkpoint, CheckpointDeletion, Job, Project, utcnow


@dataclass(frozen=True)
class ArtifactRecord:
    """One complete upload, as the worker reports it."""

    job_id: str
    kind: str
    name: str
    step: int | None
    key: str  # s3:// URL of the artifact's key prefix
    size_bytes: int
    sha256: str  # of the manifest
    files: list[dict[str, Any]]


def record_artifact(session: Session, record: ArtifactRecord) -> None:
    """Insert or replace the row of (job, kind, name)."""
    if is_postgresql(session):
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    values = {
        "job_id": record.job_id,
        "kind": record.kind,
        "name": record.name,
        "step": record.step,
        "key": record.key,
        "size_bytes": record.size_bytes,
        "sha256": record.sha256,
        "files": {"files": record.files},
        "created_at": utcnow(),
        "deleted_at": None,
    }
    stmt = insert(Artifact).values(values)
    changed = ("step", "key", "size_bytes", "sha256", "files", "created_at", "deleted_at")
    stmt = stmt.on_conflict_do_update(
        index_elements=["job_id", "kind", "name"], set_={c: stmt.excluded[c] for c in changed}
    )
    session.execute(stmt)


def _deleted(job_id: Any, step: Any) -> Any:
    """Retention deleted the checkpoint at (`job_id`, `step`) (columns of the outer query)."""
    gone = select(CheckpointDeletion.id).where(
        CheckpointDeletion.job_id == job_id, CheckpointDeletion.step == step
    )
    return gone.exists()


def _checkpoint_deleted() -> Any:
    """The artifact is a checkpoint that retention deleted (its store copy may still be
    on its way out)."""
    return and_(Artifact.kind == "checkpoint", _deleted(Artifact.job_id, Artifact.step))


def _offered() -> Any:
    return and_(Artifact.deleted_at.is_(None), ~_checkpoint_deleted())


def list_artifacts(session: Session, job_id: str) -> list[Artifact]:
    """A job's stored artifacts: checkpoints by step, then exports by name; never one that
    retention deleted."""
    stmt = (
        select(Artifact)
        .where(Artifact.job_id == job_id, _offered())
        .order_by(Artifact.kind, Artifact.step, Artifact.name)
    )
    return list(session.scalars(stmt))


def find_artifact(session: Session, job_id: str, name: str) -> Artifact | None:
    """The job's artifact called `name` (`step_<N>` or an export's name), checkpoints first;
    None for one retention deleted."""
    stmt = (
        select(Artifact)
        .where(Artifact.job_id == job_id, Artifact.name == name, _offered())
        .order_by(Artifact.kind)
        .limit(1)
    )
    return session.scalars(stmt).first()


def stored_copies_to_delete(session: Session, job_id: str | None = None) -> list[tuple[int, str]]:
    """(artifact id, s3:// URL) of each stored checkpoint whose checkpoint was deleted but
    whose objects are not yet gone from the store (of one job, or of all)."""
    stmt = select(Artifact.id, Artifact.key).where(
        Artifact.deleted_at.is_(None), _checkpoint_deleted()
    )
    if job_id is not None:
        stmt = stmt.where(Artifact.job_id == job_id)
    return [(row_id, key) for row_id, key in session.execute(stmt.order_by(Artifact.id))]


def mark_deleted(session: Session, artifact_id: int) -> None:
    """The artifact's objects are gone from the store."""
    stmt = update(Artifact).where(Artifact.id == artifact_id, Artifact.deleted_at.is_(None))
    session.execute(stmt.values(deleted_at=utcnow()))


def mark_checkpoint_copy_deleted(session: Session, job_id: str, name: str) -> None:
    """The stored copy of the job's checkpoint `name` is gone from the store."""
    stmt = update(Artifact).where(
        Artifact.job_id == job_id,
        Artifact.kind == "checkpoint",
        Artifact.name == name,
        Artifact.deleted_at.is_(None),
    )
    session.execute(stmt.values(deleted_at=utcnow()))


@dataclass(frozen=True)
class EvictableCheckpoint:
    """A finished job's checkpoint, still local, with the stored copy it can be fetched from."""

    checkpoint_id: int
    job_id: str
    step: int
    path: str
    run_dir: str | None
    key: str  # s3:// URL of the stored copy
    sha256: str  # its manifest's digest, as recorded


def evictable_checkpoints(session: Session, finished_before: datetime) -> list[EvictableCheckpoint]:
    """The local checkpoints of jobs that finished before `finished_before` (a terminal
    status: never one of a job that may still write or resume) that retention has not
    deleted, not yet evicted, with a live stored copy."""
    stored = and_(
        Artifact.job_id == Checkpoint.job_id,
        Artifact.kind == "checkpoint",
        Artifact.step == Checkpoint.step,
        Artifact.deleted_at.is_(None),
    )
    stmt = (
        select(Checkpoint, Job.run_dir, Artifact.key, Artifact.sha256)
        .join(Job, Job.id == Checkpoint.job_id)
        .join(Artifact, stored)
        .where(
            Job.status.in_([s.value for s in TERMINAL]),
            func.coalesce(Job.finished_at, Job.updated_at) <= finished_before,
            Checkpoint.evicted_at.is_(None),
            ~_deleted(Checkpoint.job_id, Checkpoint.step),
        )
        .order_by(Checkpoint.job_id, Checkpoint.step)
    )
    return [
        EvictableCheckpoint(c.id, c.job_id, c.step, c.path, run_dir, key, sha)
        for c, run_dir, key, sha in session.execute(stmt)
    ]


def mark_evicted(session: Session, checkpoint_id: int) -> None:
    """The checkpoint's local directory is gone; the store holds it."""
    stmt = update(Checkpoint).where(Checkpoint.id == checkpoint_id)
    session.execute(stmt.values(evicted_at=utcnow()))


def stored_copy(session: Session, job_id: str, step: int) -> str | None:
    """The s3:// URL of the live stored copy of an evicted checkpoint (None: the checkpoint
    is not evicted, or has no stored copy left)."""
    stmt = (
        select(Artifact.key)
        .join(
            Checkpoint,
            and_(Checkpoint.job_id == Artifact.job_id, Checkpoint.step == Artifact.step),
        )
        .where(
            Artifact.job_id == job_id,
            Artifact.kind == "checkpoint",
            Artifact.step == step,
            Artifact.deleted_at.is_(None),
            Checkpoint.evicted_at.is_not(None),
        )
    )
    return session.scalars(stmt).first()


def evicted_checkpoint_at(session: Session, path: str) -> tuple[str, int] | None:
    """(job id, step) of the evicted checkpoint whose local directory was `path`."""
    stmt = select(Checkpoint.job_id, Checkpoint.step).where(
        Checkpoint.path == path, Checkpoint.evicted_at.is_not(None)
    )
    row = session.execute(stmt.limit(1)).first()
    return None if row is None else (row[0], row[1])


def checkpoints_to_store(session: Session, job_id: str) -> list[tuple[int, str]]:
    """(step, path) of the job's published checkpoints that have no stored artifact."""
    stored = and_(
        Artifact.job_id == Checkpoint.job_id,
        Artifact.kind == "checkpoint",
        Artifact.step == Checkpoint.step,
    )
    gone = select(CheckpointDeletion.id).where(
        CheckpointDeletion.job_id == Checkpoint.job_id, CheckpointDeletion.step == Checkpoint.step
    )
    stmt = (
        select(Checkpoint.step, Checkpoint.path)
        .outerjoin(Artifact, stored)
        .where(Checkpoint.job_id == job_id, Artifact.id.is_(None), ~gone.exists())
        .order_by(Checkpoint.step)
    )
    return [(step, path) for step, path in session.execute(stmt)]


def project_of_job(session: Session, job_id: str) -> str | None:
    """The name of the project a job belongs to (its artifacts' key segment)."""
    stmt = select(Project.name).join(Job, Job.project_id == Project.id).where(Job.id == job_id)
    return session.scalars(stmt).first()
