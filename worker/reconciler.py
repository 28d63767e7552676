"""The reconciler (`tuneyard scheduler`): repairs what crashed workers and lost messages leave.

Each pass, in its own short transactions:
1. active jobs whose lease expired are taken over: `retrying` then `queued` for a new
   attempt (or `failed` when attempts are spent); a job that was being cancelled or paused
   ends `cancelled` / `paused`. A job with a fresh lease is never touched.
2. jobs `queued` but not claimed within the grace window, and not waiting in the broker
   (Redis flushed or restarted, or the API's enqueue failed) are dispatched again; a
   duplicate message is harmless because claiming is decided in the database.
3. workers whose heartbeat is older than `stale_worker_seconds` are marked `lost`.
4. every `retention_seconds`, each project's checkpoint retention policy is applied to its
   finished jobs (`worker.retention`).
5. exports get the same care as jobs (expired leases, lost messages): `worker.export_reconcile`.

Its log lines are JSON (`jobs.store.log_context`), like the API's and the workers'.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import timedelta

from jobs.broker import queued_job_ids
from jobs.orchestration.policy import settle_expired_lease
from jobs.orchestration.states import TransitionRefused
from jobs.store.engine import session_scope
from jobs.store.leases import expired_leases, mark_lost_workers, stale_queued_jobs
from jobs.store.log_context import configure_json_logging
from jobs.store.tables import utcnow
from worker import health
from worker.config import WorkerConfig, get_worker_config
from worker.export_reconcile import reconcile_exports
from worker.retention import apply_retention_due
from worker.settle import dispatch_after_commit

log = logging.getLogger("tuneyard.reconciler")


@dataclass
class ReconcileReport:
    expired: list[str] = field(default_factory=list)
    redispatched: list[str] = field(default_factory=list)
    lost_workers: list[str] = field(default_factory=list)
    exports: list[str] = field(default_factory=list)  # settled or sent again


def expire_leases(report: ReconcileReport) -> list[tuple[str, str]]:
    """Take over jobs with expired leases; returns (job_id, queue) to dispatch after commit."""
    to_dispatch = []
    with session_scope() as session:
        for job in expired_leases(session):
            try:
                if settle_expired_lease(session, job):
                    to_dispatch.append((job.id, job.queue))
            except TransitionRefused as exc:
                log.warning("job %s: takeover refused: %s", job.id, exc)
                continue
            report.expired.append(job.id)
    return to_dispatch


def redispatch_lost(report: ReconcileReport, config: WorkerConfig) -> None:
    """Send again the queued jobs nobody claimed within the grace window."""
    older_than = utcnow() - timedelta(seconds=config.redispatch_grace_seconds)
    with session_scope() as session:
        stale = [(job.id, job.queue) for job in stale_queued_jobs(session, older_than)]
    if not stale:
        return
    waiting = queued_job_ids({queue for _, queue in stale})
    for job_id, queue in stale:
        if waiting is not None and job_id in waiting:
            continue  # still in the broker: just no free worker yet
        if dispatch_after_commit(job_id, queue):
            report.redispatched.append(job_id)


def reconcile_once(config: WorkerConfig | None = None) -> ReconcileReport:
    config = config or get_worker_config()
    report = ReconcileReport()
    for job_id, queue in expire_leases(report):
        dispatch_after_commit(job_id, queue)
    redispatch_lost(report, config)
    report.exports = reconcile_exports(config)
    with session_scope() as session:
        older = utcnow() - timedelta(seconds=config.stale_worker_seconds)
        report.lost_workers = mark_lost_workers(session, older)
    return report


def run_forever(config: WorkerConfig | None = None, stop: threading.Event | None = None) -> None:
    """The `tuneyard scheduler` loop; a failing pass is logged and the next one runs."""
    config = config or get_worker_config()
    stop = stop or threading.Event()
    configure_json_logging(logging.getLogger().level or logging.INFO)
    log.info("reconciler running every %.1fs", config.reconcile_seconds)
    while not stop.is_set():
        try:
            report = reconcile_once(config)
            if report.expired or report.redispatched or report.lost_workers or report.exports:
                log.info("reconciled: %s", report)
            apply_retention_due(config)
            health.mark("scheduler", ok=True)
        except Exception as exc:  # database or broker down: try again next pass
            log.warning("reconcile pass failed: %s", exc)
            health.mark("scheduler", ok=False, detail=f"reconcile failed: {type(exc).__name__}")
        stop.wait(config.reconcile_seconds)
