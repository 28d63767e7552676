"""The reconciler's pass over exports (`tuneyard scheduler` runs it beside the jobs' pass).

An export whose worker stopped renewing its lease is settled by
`jobs.orchestration.export_states.settle_expired_export` (re-queued for another attempt,
or ended) and sent again; a queued export nobody claimed within the grace window, and not
waiting in the broker (Redis flushed, or the API's send refused), is sent again. A
duplicate message is harmless: claiming is decided in the database.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from jobs.broker import dispatch_export, queued_job_ids
from jobs.orchestration.export_states import settle_expired_export
from jobs.orchestration.states import TransitionRefused
from jobs.store.engine import session_scope
from jobs.store.exports import expired_export_leases, stale_queued_exports
from jobs.store.tables import utcnow
from worker.config import WorkerConfig

log = logging.getLogger("tuneyard.reconciler")


def reconcile_exports(config: WorkerConfig) -> list[str]:
    """One pass; the ids of the exports it settled or sent again."""
    acted: list[str] = []
    to_send: list[tuple[str, str]] = []
    with session_scope() as session:
        for export in expired_export_leases(session):
            try:
                if settle_expired_export(session, export):
                    to_send.append((export.id, export.queue))
            except TransitionRefused as exc:
                log.warning("export %s: takeover refused: %s", export.id, exc)
                continue
            acted.append(export.id)
    older = utcnow() - timedelta(seconds=config.redispatch_grace_seconds)
    with session_scope() as session:
        stale = stale_queued_exports(session, older)
    waiting = queued_job_ids({queue for _, queue in stale}) if stale else None
    for export_id, queue in stale:
        if waiting is None or export_id not in waiting:
            to_send.append((export_id, queue))
    for export_id, queue in to_send:
        if dispatch_export(export_id, queue):
            acted.append(export_id)
    return acted
