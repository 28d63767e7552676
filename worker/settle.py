"""Reporting how an attempt ended, and sending a re-queued job to the broker.

Shared by the supervisor (an attempt it ran ended) and the task (a gang that never formed).
What the job's status becomes is `jobs.orchestration.policy`'s decision; this module only
opens the transaction, locks the row, hands the outcome over and, when the policy put the
job back in `queued`, sends its id after the commit.
"""

from __future__ import annotations

import logging

from jobs.broker import dispatch_job
from jobs.orchestration.policy import Outcome, settle_attempt
from jobs.orchestration.states import TransitionRefused
from jobs.store.engine import session_scope
from jobs.store.leases import Claim
from jobs.store.queries import lock_job

log = logging.getLogger("tuneyard.worker")


def report_outcome(claim: Claim, worker: str, outcome: Outcome, stop_kind: str | None) -> bool:
    """Record the attempt's end; False when the job moved on without this worker."""
    with session_scope() as session:
        job = lock_job(session, claim.job_id)
        try:
            requeued = settle_attempt(session, job, claim.attempt, outcome, stop_kind, worker)
        except TransitionRefused as exc:
            log.warning("job %s: outcome %s refused: %s", claim.job_id, outcome.verdict, exc)
            return False
    if requeued is None:
        return False
    if requeued:
        dispatch_after_commit(claim.job_id, claim.queue)
    return True


def dispatch_after_commit(job_id: str, queue: str) -> bool:
    """Send the job id to the broker and note it; False leaves it to the reconciler."""
    with session_scope() as session:
        return dispatch_job(session, job_id, queue)
