"""The `artifacts` rows: what the artifact store holds completely, per job.

The worker records an artifact after its manifest is written (`record_artifact`, an upsert
on job, kind and name, so an upload done twice leaves one row); the API lists a job's rows
and finds one by name. `checkpoints_to_store` is how an attempt catches up on checkpoints
an earlier attempt published but did not finish storing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, select
from sqlalchemy.orm import Session

from jobs.store.engine import is_postgresql
from jobs.store.tables import Artifact, Checkpoint, Job, Project, utcnow


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
    }
    stmt = insert(Artifact).values(values)
    changed = ("step", "key", "size_bytes", "sha256", "files", "created_at")
    stmt = stmt.on_conflict_do_update(
        index_elements=["job_id", "kind", "name"], set_={c: stmt.excluded[c] for c in changed}
    )
    session.execute(stmt)


def list_artifacts(session: Session, job_id: str) -> list[Artifact]:
    """A job's stored artifacts: checkpoints by step, then exports by name."""
    stmt = (
        select(Artifact)
        .where(Artifact.job_id == job_id)
        .order_by(Artifact.kind, Artifact.step, Artifact.name)
    )
    return list(session.scalars(stmt))


def find_artifact(session: Session, job_id: str, name: str) -> Artifact | None:
    """The job's artifact called `name` (`step_<N>` or an export's name), checkpoints first."""
    stmt = (
        select(Artifact)
        .where(Artifact.job_id == job_id, Artifact.name == name)
        .order_by(Artifact.kind)
        .limit(1)
    )
    return session.scalars(stmt).first()


def checkpoints_to_store(session: Session, job_id: str) -> list[tuple[int, str]]:
    """(step, path) of the job's published checkpoints that have no stored artifact."""
    stored = and_(
        Artifact.job_id == Checkpoint.job_id,
        Artifact.kind == "checkpoint",
        Artifact.step == Checkpoint.step,
    )
    stmt = (
        select(Checkpoint.step, Checkpoint.path)
        .outerjoin(Artifact, stored)
        .where(Checkpoint.job_id == job_id, Artifact.id.is_(None))
        .order_by(Checkpoint.step)
    )
    return [(step, path) for step, path in session.execute(stmt)]


def project_of_job(session: Session, job_id: str) -> str | None:
    """The name of the project a job belongs to (its artifacts' key segment)."""
    stmt = select(Project.name).join(Job, Job.project_id == Project.id).where(Job.id == job_id)
    return session.scalars(stmt).first()
