"""Checkpoint retention in the database: project policies, deletion records, why each is kept.

A project's policy (`CheckpointRetentionPolicy`) bounds its FINISHED jobs' checkpoints by
total bytes and/or by age after the job finished. `policy_deletions` is the pure rule the
policy service (`worker.retention`) applies: never a checkpoint of a job that is not
finished (queued, running, paused ... own theirs), never the one a finished job's LATEST
names (the job's final model, and what `restore_from: {job: <id>}` resumes from), never a
best one its recipe's `keep_best` keeps, never one an unfinished job's `restore_from` names;
of the rest, those of jobs finished more than `max_age_days` ago go, then the oldest jobs'
(lowest step first) until the total is within `max_bytes`. The bytes of protected
checkpoints still count, so a project whose LATEST checkpoints alone exceed `max_bytes`
stays above it. Deletions by the trainer (`checkpoint_deleted` events) and by the policy
land in `CheckpointDeletion`, once per (job, step).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.recipe.sections.retention import KeepBest, keep_reasons
from jobs.recipe.typed import Recipe, StoredRecipeInvalid
from jobs.store.engine import is_postgresql
from jobs.store.status import TERMINAL
from jobs.store.tables import (
    Checkpoint,
    CheckpointDeletion,
    CheckpointRetentionPolicy,
    Job,
    utcnow,
)

TRAINER, POLICY = "trainer", "policy"


@dataclass(frozen=True)
class StoredCheckpoint:
    """A checkpoint the database knows to exist, with what protects it from the policy."""

    job_id: str
    step: int
    path: str
    size_bytes: int
    finished_at: datetime
    protected_by: tuple[str, ...] = ()


def policy_deletions(
    checkpoints: Iterable[StoredCheckpoint],
    max_bytes: int | None,
    max_age_days: int | None,
    now: datetime,
) -> list[tuple[StoredCheckpoint, str]]:
    """(checkpoint, reason) for each one the policy deletes, oldest job first."""
    every = list(checkpoints)
    total = sum(c.size_bytes for c in every)
    order = sorted(
        (c for c in every if not c.protected_by), key=lambda c: (c.finished_at, c.job_id, c.step)
    )
    chosen: list[tuple[StoredCheckpoint, str]] = []
    if max_age_days is not None:
        cutoff = now - timedelta(days=max_age_days)
        for c in order:
            if c.finished_at < cutoff:
                when = c.finished_at.strftime("%Y-%m-%d %H:%M UTC")
                chosen.append((c, f"its job finished {when}, over max_age_days {max_age_days}"))
                total -= c.size_bytes
    if max_bytes is not None:
        aged = {(c.job_id, c.step) for c, _ in chosen}
        for c in order:
            if total <= max_bytes:
                break
            if (c.job_id, c.step) in aged:
                continue
            reason = f"finished jobs' checkpoints held {total} bytes, over max_bytes {max_bytes}"
            chosen.append((c, reason))
            total -= c.size_bytes
    return chosen


def checkpoint_rules(job: Job) -> tuple[int | None, KeepBest | None]:
    """The job's `checkpoint.keep_last` and `keep_best`; (None, None) for a recipe this code
    cannot read back (it keeps every checkpoint rather than guess)."""
    try:
        section = Recipe.from_json(job.recipe or {}).checkpoint
    except StoredRecipeInvalid:
        return None, None
    return section.keep_last, section.keep_best


def existing_checkpoints(session: Session, job_ids: Iterable[str]) -> list[Checkpoint]:
    """The checkpoints of these jobs that no deletion record says are gone, by job and step."""
    ids = list(job_ids)
    if not ids:
        return []
    gone = select(CheckpointDeletion.id).where(
        CheckpointDeletion.job_id == Checkpoint.job_id, CheckpointDeletion.step == Checkpoint.step
    )
    query = (
        select(Checkpoint)
        .where(Checkpoint.job_id.in_(ids), ~gone.exists())
        .order_by(Checkpoint.job_id, Checkpoint.step)
    )
    return list(session.scalars(query))


def list_deletions(session: Session, job_id: str) -> list[CheckpointDeletion]:
    query = select(CheckpointDeletion).where(CheckpointDeletion.job_id == job_id)
    return list(
        session.scalars(query.order_by(CheckpointDeletion.deleted_at, CheckpointDeletion.id))
    )


def restore_targets(session: Session, project_id: int) -> dict[str, str]:
    """realpath of each checkpoint an unfinished job of the project restores from -> job id."""
    query = select(Job.id, Job.recipe).where(
        Job.project_id == project_id, Job.status.not_in([s.value for s in TERMINAL])
    )
    targets = {}
    for job_id, recipe in session.execute(query):
        restore = (recipe or {}).get("restore_from")
        path = restore.get("path") if isinstance(restore, dict) else None
        if isinstance(path, str) and path not in ("", "LATEST"):
            targets[os.path.realpath(path)] = job_id
    return targets


def kept_because(
    job: Job, rows: list[Checkpoint], restore: dict[str, str] | None = None
) -> dict[int, list[str]]:
    """step -> why each existing checkpoint of `job` is kept (empty: nothing keeps it)."""
    keep_last, keep_best = checkpoint_rules(job)
    latest = max((c.step for c in rows), default=None)
    metrics = {c.step: c.metrics for c in rows}
    reasons = keep_reasons(metrics, keep_last, keep_best, latest)
    if latest is not None and job.status not in TERMINAL:
        reasons[latest].append("resumable: the job resumes from it")
    for c in rows:
        other = (restore or {}).get(os.path.realpath(c.path))
        if other is not None:
            reasons[c.step].append(f"resumable: job {other} restores from it")
    return reasons


def _protected(reasons: list[str]) -> tuple[str, ...]:
    """What stops the policy: LATEST, a kept-best rank, a restore_from (not `keep_last`,
    which bounds a running job's disk, nor the keep-everything default)."""
    return tuple(r for r in reasons if r == "latest" or r.startswith(("best ", "resumable")))


def finished_checkpoints(session: Session, project_id: int) -> list[StoredCheckpoint]:
    """Every existing checkpoint of the project's finished jobs, with what protects it."""
    jobs = {
        job.id: job
        for job in session.scalars(
            select(Job).where(
                Job.project_id == project_id, Job.status.in_([s.value for s in TERMINAL])
            )
        )
    }
    restore = restore_targets(session, project_id)
    by_job: dict[str, list[Checkpoint]] = {}
    for row in existing_checkpoints(session, jobs):
        by_job.setdefault(row.job_id, []).append(row)
    out = []
    for job_id, rows in by_job.items():
        job = jobs[job_id]
        reasons = kept_because(job, rows, restore)
        finished = job.finished_at or job.updated_at
        for c in rows:
            protected = _protected(reasons[c.step])
            out.append(
                StoredCheckpoint(job_id, c.step, c.path, c.size_bytes or 0, finished, protected)
            )
    return out


def record_deletion(
    session: Session, job_id: str, step: int, path: str, source: str, reason: str
) -> None:
    """Record that (job, step) was deleted; a second record of it changes nothing."""
    size = session.scalar(
        select(Checkpoint.size_bytes).where(Checkpoint.job_id == job_id, Checkpoint.step == step)
    )
    row = {
        "job_id": job_id,
        "step": step,
        "path": path,
        "size_bytes": size,
        "source": source,
        "reason": reason[:2000],
        "deleted_at": utcnow(),
    }
    if is_postgresql(session):
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    stmt = (
        insert(CheckpointDeletion)
        .values(row)
        .on_conflict_do_nothing(index_elements=["job_id", "step"])
    )
    session.execute(stmt)


def record_trainer_deletions(session: Session, job_id: str, events: list[dict[str, Any]]) -> int:
    """Store the trainer's `checkpoint_deleted` events (retention by keep_last/keep_best)."""
    count = 0
    for record in events:
        step = record.get("step")
        if record.get("event") != "checkpoint_deleted" or type(step) is not int:
            continue
        reason = str(record.get("reason") or "checkpoint retention")
        record_deletion(session, job_id, step, str(record.get("path") or ""), TRAINER, reason)
        count += 1
    return count


def get_policy(session: Session, project_id: int) -> CheckpointRetentionPolicy | None:
    return session.get(CheckpointRetentionPolicy, project_id)


def set_policy(
    session: Session, project_id: int, max_bytes: int | None, max_age_days: int | None
) -> CheckpointRetentionPolicy | None:
    """Replace the project's policy; both None removes it. The caller commits."""
    policy = session.get(CheckpointRetentionPolicy, project_id)
    if max_bytes is None and max_age_days is None:
        if policy is not None:
            session.delete(policy)
            session.flush()
        return None
    if policy is None:
        policy = CheckpointRetentionPolicy(project_id=project_id)
        session.add(policy)
    policy.max_bytes, policy.max_age_days, policy.updated_at = max_bytes, max_age_days, utcnow()
    session.flush()
    return policy


def policies(session: Session) -> list[CheckpointRetentionPolicy]:
    return list(session.scalars(select(CheckpointRetentionPolicy)))
