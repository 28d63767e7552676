"""The checkpoint retention service: applies each project's policy to its finished jobs.

The scheduler (`worker.reconciler.run_forever`) calls `apply_retention_due` on every pass;
it works at most once per `retention_seconds` (`TUNEYARD_WORKER_RETENTION_SECONDS`). For
each project with a policy it picks what `jobs.store.retention.policy_deletions` allows,
removes each checkpoint directory, and records the deletion (who, why, when) in the same
short transaction per project. It runs where the checkpoints' filesystem is mounted, like
the workers. A path is removed only when it is a `step_<N>` directory inside its own job's
run directory and not a symlink: a path the database holds never leads the service into
anything else. A directory already gone is recorded as deleted all the same.

With an artifact store (`TUNEYARD_ARTIFACT_STORE`) the pass then reaches the store: every
stored copy of a deleted checkpoint (the policy's, or the trainer's that the worker could
not delete) is deleted from it, manifest first, and its `artifacts` row marked; a store
error leaves the row live for the next pass. Last, it evicts local copies: a finished job's
checkpoint whose copy the store holds complete (its manifest read back and matching the
recorded digest) loses its files `checkpoint_cache_hours` after the job finished
(`TUNEYARD_WORKER_CHECKPOINT_CACHE_HOURS`). The eviction is recorded first, so whatever
reads the checkpoint fetches it from the store from then on, and the emptied `step_<N>`
directory stays, so that the job's LATEST and a `restore_from: {job: <id>}` still name it.
An evicted checkpoint is not deleted: the store holds it.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy.orm import Session

from jobs.artifacts.manifest import ManifestError
from jobs.artifacts.s3 import ArtifactStore, StoreError
from jobs.recipe.paths.scope import STEP_DIR
from jobs.store.artifacts import EvictableCheckpoint, evictable_checkpoints, mark_evicted
from jobs.store.engine import session_scope
from jobs.store.retention import (
    POLICY,
    StoredCheckpoint,
    finished_checkpoints,
    policies,
    policy_deletions,
    record_deletion,
)
from jobs.store.settings import get_settings
from jobs.store.tables import Job, utcnow
from worker.artifact_uploads import delete_stored_copies
from worker.config import WorkerConfig, get_worker_config

log = logging.getLogger("tuneyard.retention")


@dataclass
class RetentionReport:
    deleted: list[tuple[str, int, str]] = field(default_factory=list)  # job, step, reason
    refused: list[tuple[str, int, str]] = field(default_factory=list)  # job, step, path
    store_deleted: list[str] = field(default_factory=list)  # s3:// URLs
    evicted: list[tuple[str, int]] = field(default_factory=list)  # job, step
    store_errors: list[str] = field(default_factory=list)


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


def apply_retention_once(
    now: datetime | None = None, config: WorkerConfig | None = None
) -> RetentionReport:
    """One pass over every project's policy, each project in its own transaction; then,
    with an artifact store, the stored copies of deleted checkpoints and the eviction of
    local copies."""
    report = RetentionReport()
    now = now or utcnow()
    with session_scope() as session:
        project_policies = [(p.project_id, p.max_bytes, p.max_age_days) for p in policies(session)]
    for project_id, max_bytes, max_age_days in project_policies:
        with session_scope() as session:
            stored = finished_checkpoints(session, project_id)
            chosen = policy_deletions(stored, max_bytes, max_age_days, now)
            for item, reason in chosen:
                _delete(session, item, reason, report)
    if report.deleted:
        log.info("retention deleted %d checkpoint(s): %s", len(report.deleted), report.deleted)
    store = _store()
    if store is not None:
        _apply_to_store(store, now, (config or get_worker_config()).checkpoint_cache_hours, report)
    return report


def _store() -> ArtifactStore | None:
    try:
        return ArtifactStore.from_url(get_settings().artifact_store)
    except ValueError as exc:
        log.error("TUNEYARD_ARTIFACT_STORE: %s; retention leaves the store alone", exc)
        return None


def _apply_to_store(
    store: ArtifactStore, now: datetime, cache_hours: float, report: RetentionReport
) -> None:
    try:
        report.store_deleted += delete_stored_copies(store)
    except StoreError as exc:  # the rows stay live: the next pass deletes them
        report.store_errors.append(str(exc))
        log.warning("retention: stored copies not deleted, retried next pass: %s", exc)
    with session_scope() as session:
        candidates = evictable_checkpoints(session, now - timedelta(hours=cache_hours))
    for item in candidates:
        if not _evict(store, item, report):
            break  # the store does not answer: the rest wait for the next pass
    if report.store_deleted or report.evicted:
        log.info(
            "retention deleted %d stored copies, evicted %d local checkpoint(s)",
            len(report.store_deleted),
            len(report.evicted),
        )


def _evict(store: ArtifactStore, item: EvictableCheckpoint, report: RetentionReport) -> bool:
    """Evict one finished job's local checkpoint once the store is seen to hold it whole;
    False when the store could not be asked (the pass stops evicting: a store that is down
    must not hold the scheduler once per checkpoint)."""
    if not removable(item.path, item.run_dir):
        report.refused.append((item.job_id, item.step, item.path))
        return True
    key = store.location.key_of(item.key)
    try:
        found = store.stored(key) if key is not None else None
    except StoreError as exc:
        report.store_errors.append(str(exc))
        log.warning("job %s step %d: kept locally: %s", item.job_id, item.step, exc)
        return False
    except ManifestError as exc:
        found = None
        log.warning("job %s step %d: unreadable manifest: %s", item.job_id, item.step, exc)
    if found is None or found.manifest_sha256 != item.sha256:
        incomplete = f"{item.key} is not complete in the store"
        log.warning("job %s step %d: kept locally: %s", item.job_id, item.step, incomplete)
        return True
    with session_scope() as session:
        mark_evicted(session, item.checkpoint_id)
    _empty_directory(Path(item.path))
    report.evicted.append((item.job_id, item.step))
    return True


def _empty_directory(root: Path) -> None:
    """Remove everything inside `root` (links unfollowed), keeping `root` itself."""
    if not root.is_dir():
        return
    for child in root.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
    if any(root.iterdir()):  # held open: the store is read from now on all the same
        log.warning("%s: evicted, but some of its files could not be removed", root)


_last_run = {"at": float("-inf")}


def apply_retention_due(config: WorkerConfig) -> RetentionReport | None:
    """`apply_retention_once` when `config.retention_seconds` have passed since the last
    pass in this process; None otherwise."""
    if time.monotonic() - _last_run["at"] < config.retention_seconds:
        return None
    _last_run["at"] = time.monotonic()
    return apply_retention_once(config=config)
