"""The checkpoint retention service: applies each project's policy to its finished jobs.

The scheduler (`worker.reconciler.run_forever`) calls `apply_retention_due` on every pass;
it works at most once per `retention_seconds` (`TUNEYARD_WORKER_RETENTION_SECONDS`). For
each project with a policy it picks what `jobs.store.retention.policy_deletions` allows,
removes each checkpoint directory, and records the deletion (who, why, when) in the same
short transaction per project. It runs where the checkpoints' filesystem is mounted, like
the workers. A path is removed only when it is a `step_<N>` directory inside its own job's
run directory and not a symlink: a path the database holds never leads the service into
anything else. A directory already gone is recorded as deleted all the same.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from sqlalchemy.orm import Session

from jobs.recipe.paths.scope import STEP_DIR
from jobs.store.engine import session_scope
from jobs.store.retention import (
    POLICY,
    StoredCheckpoint,
    finished_checkpoints,
    policies,
    policy_deletions,
    record_deletion,
)
from jobs.store.tables import Job, utcnow
from worker.config import WorkerConfig

log = logging.getLogger("tuneyard.retention")


@dataclass
class RetentionReport:
    deleted: list[tuple[str, int, str]] = field(default_factory=list)  # job, step, reason
    refused: list[tuple[str, int, str]] = field(default_factory=list)  # job, step, path


def removable(path: str, run_dir: str | None) -> bool:
    """`path` is a `step_<N>` directory inside `run_dir`, reached without a symlink."""
    if not run_dir or not STEP_DIR.match(Path(path).name) or os.path.islink(path):
        return False
    real, root = os.path.realpath(path), os.path.realpath(run_dir)
    return real.startswith(root + os.sep)


def _delete(session: Session, item: StoredCheckpoint, reason: str, report: RetentionReport) -> None:
    job = session.get(Job, item.job_id)
    if not removable(item.path, job.run_dir if job is not None else None):
        report.refused.append((item.job_id, item.step, item.path))
        log.warning("job %s step %d: not removing %s", item.job_id, item.step, item.path)
        return
    shutil.rmtree(item.path, ignore_errors=True)
    if os.path.exists(item.path):  # held open or not ours to remove: try again next pass
        report.refused.append((item.job_id, item.step, item.path))
        return
    record_deletion(session, item.job_id, item.step, item.path, POLICY, reason)
    report.deleted.append((item.job_id, item.step, reason))


def apply_retention_once(now: datetime | None = None) -> RetentionReport:
    """One pass over every project's policy; each project in its own transaction."""
    report = RetentionReport()
    with session_scope() as session:
        project_policies = [(p.project_id, p.max_bytes, p.max_age_days) for p in policies(session)]
    for project_id, max_bytes, max_age_days in project_policies:
        with session_scope() as session:
            stored = finished_checkpoints(session, project_id)
            chosen = policy_deletions(stored, max_bytes, max_age_days, now or utcnow())
            for item, reason in chosen:
                _delete(session, item, reason, report)
    if report.deleted:
        log.info("retention deleted %d checkpoint(s): %s", len(report.deleted), report.deleted)
    return report


_last_run = {"at": float("-inf")}


def apply_retention_due(config: WorkerConfig) -> RetentionReport | None:
    """`apply_retention_once` when `config.retention_seconds` have passed since the last
    pass in this process; None otherwise."""
    if time.monotonic() - _last_run["at"] < config.retention_seconds:
        return None
    _last_run["at"] = time.monotonic()
    return apply_retention_once()
