"""The reconciler (`tuneyard scheduler`): repairs what crashed workers and lost messages leave.

Each pass, in its own short transactions:
1. active jobs whose lease expired are taken over: `retrying` then `queued` for a new
   attempt (or `failed` when attempts are spent); a job that was being cancelled or paused
   ends `cancelled` / `paused`. A job with a fresh lease is never touched.
2. jobs `queued` but not claimed within the grace window, and not waiting in the broker
   (Redis flushed or restarted, or the API's enqueue failed) are dispatched again; a
   duplicate message is harmless because claiming is decided in the database.
3. workers whose heartbeat is older than `stale_worker_seconds` are marked `lost`.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from dataclasses import dataclass, field
from datetime import timedelta

from jobs.orchestration.states import JobStatus, TransitionRefused, transition
from jobs.store.engine import session_scope
from jobs.store.leases import expired_leases, mark_lost_workers, stale_queued_jobs
from jobs.store.settings import get_settings
from jobs.store.tables import utcnow
from worker.config import WorkerConfig, get_worker_config
from worker.settle import dispatch_after_commit, retry_or_fail

log = logging.getLogger("tuneyard.reconciler")


@dataclass
class ReconcileReport:
    expired: list[str] = field(default_factory=list)
    redispatched: list[str] = field(default_factory=list)
    lost_workers: list[str] = field(default_factory=list)


def expire_leases(report: ReconcileReport) -> list[tuple[str, str]]:
    """Take over jobs with expired leases; returns (job_id, queue) to dispatch after commit."""
    to_dispatch = []
    with session_scope() as session:
        for job in expired_leases(session):
            owner = job.lease_owner
            data = {"lease_owner": owner, "lease_expired_at": str(job.lease_expires_at)}
            reason = f"lease of worker {owner} expired"
            try:
                if job.status == JobStatus.CANCELLING:
                    transition(
                        session, job.id, "cancelled", attempt=job.attempt, reason=reason, data=data
                    )
                elif job.status == JobStatus.PAUSING:
                    transition(
                        session, job.id, "paused", attempt=job.attempt, reason=reason, data=data
                    )
                elif retry_or_fail(session, job, "worker_lost", reason, data):
                    to_dispatch.append((job.id, job.queue))
            except TransitionRefused as exc:
                log.warning("job %s: takeover refused: %s", job.id, exc)
                continue
            report.expired.append(job.id)
    return to_dispatch


def queued_in_broker(queues: set[str]) -> set[str] | None:
    """Job ids waiting in the broker's queues (Redis only); None when it cannot be read."""
    settings = get_settings()
    if not (settings.broker_url or "").startswith("redis"):
        return None
    import redis

    client = redis.Redis.from_url(settings.broker_url)
    ids: set[str] = set()
    try:
        for queue in queues:
            for raw in client.lrange(queue, 0, -1):
                job_id = _job_id_of(raw)
                if job_id:
                    ids.add(job_id)
    except redis.RedisError:
        return None
    finally:
        client.close()
    return ids


def _job_id_of(raw: bytes) -> str | None:
    try:
        message = json.loads(raw)
        body = json.loads(base64.b64decode(message["body"]))
        return str(body[0][0])
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def redispatch_lost(report: ReconcileReport, config: WorkerConfig) -> None:
    """Send again the queued jobs nobody claimed within the grace window."""
    older_than = utcnow() - timedelta(seconds=config.redispatch_grace_seconds)
    with session_scope() as session:
        stale = [(job.id, job.queue) for job in stale_queued_jobs(session, older_than)]
    if not stale:
        return
    waiting = queued_in_broker({queue for _, queue in stale})
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
    with session_scope() as session:
        older = utcnow() - timedelta(seconds=config.stale_worker_seconds)
        report.lost_workers = mark_lost_workers(session, older)
    return report


def run_forever(config: WorkerConfig | None = None, stop: threading.Event | None = None) -> None:
    """The `tuneyard scheduler` loop; a failing pass is logged and the next one runs."""
    config = config or get_worker_config()
    stop = stop or threading.Event()
    log.info("reconciler running every %.1fs", config.reconcile_seconds)
    while not stop.is_set():
        try:
            report = reconcile_once(config)
            if report.expired or report.redispatched or report.lost_workers:
                log.info("reconciled: %s", report)
        except Exception as exc:  # database or broker down: try again next pass
            log.warning("reconcile pass failed: %s", exc)
        stop.wait(config.reconcile_seconds)
