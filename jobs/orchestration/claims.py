"""Claiming a job: the status change that makes a worker the owner of one attempt.

`claim_job` moves a queued job to `starting` under its row lock (the attempt number goes
up: it is the fencing token every later write of that worker carries) and gives the
caller a lease and the `Claim` it runs from. A job that is not queued any more (a
duplicate or stale message) gives no claim.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from jobs.orchestration.states import transition
from jobs.store.leases import Claim, claim_of, lease_until
from jobs.store.queries import lock_job
from jobs.store.status import JobStatus


def claim_job(
    session: Session, job_id: str, worker: str, lease_seconds: float, run_dir: str
) -> Claim | None:
    """Claim a queued job for `worker`; None when it is not queued (a duplicate message)."""
    job = lock_job(session, job_id)
    if job.status != JobStatus.QUEUED:
        return None
    transition(
        session,
        job_id,
        JobStatus.STARTING,
        reason=f"claimed by worker {worker}",
        data={"worker": worker},
        lease_owner=worker,
        lease_expires_at=lease_until(lease_seconds),
        run_dir=job.run_dir or run_dir,
    )
    return claim_of(job)
