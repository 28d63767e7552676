"""Claiming a job: the status change that makes a worker the owner of one attempt.

`claim_job` moves a queued job to `starting` under its row lock (the attempt number goes
up: it is the fencing token every later write of that worker carries) and gives the
caller a lease and the `Claim` it runs from. A job that is not queued any more (a
duplicate or stale message) gives no claim, and neither does a job that requires an optional
package the worker lacks (`plan.requires`): the job stays queued, one `requirements_unmet`
event per worker says why, and the reconciler sends it again for another worker.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.orchestration.states import transition
from jobs.recipe.plan.requirements import missing_packages
from jobs.store.leases import Claim, claim_of, lease_until, take_gang_slot
from jobs.store.queries import lock_job
from jobs.store.status import JobStatus
from jobs.store.tables import Job, JobEvent

UNMET_EVENT = "requirements_unmet"


def claim_job(
    session: Session,
    job_id: str,
    worker: str,
    lease_seconds: float,
    run_dir: str,
    packages: Iterable[str] | None = None,
) -> Claim | None:
    """Claim a queued job for `worker`; None when it is not queued (a duplicate message) or
    needs a package missing from `packages` (the worker's optional packages; None: unchecked)."""
    job = lock_job(session, job_id)
    if job.status != JobStatus.QUEUED:
        return None
    missing = (
        []
        if packages is None
        else missing_packages((job.plan or {}).get("requires") or {}, packages)
    )
    if missing:
        _note_unmet(session, job, worker, missing)
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


def join_gang(
    session: Session, job_id: str, worker: str, packages: Iterable[str] | None = None
) -> Claim | None:
    """A slot of a gathering multi-node job, unless the worker lacks a package it requires."""
    job = session.get(Job, job_id)
    needs = (job.plan or {}).get("requires") or {} if job is not None else {}
    missing = [] if packages is None else missing_packages(needs, packages)
    if job is not None and missing:
        _note_unmet(session, job, worker, missing)
        return None
    return take_gang_slot(session, job_id, worker)


def _note_unmet(session: Session, job: Job, worker: str, missing: list[str]) -> None:
    """One event per worker that passed the job over, naming what it lacks."""
    seen = session.execute(
        select(JobEvent.data).where(JobEvent.job_id == job.id, JobEvent.kind == UNMET_EVENT)
    ).scalars()
    if any((data or {}).get("worker") == worker for data in seen):
        return
    message = f"worker {worker} lacks {', '.join(missing)}; the job waits for a worker that has it"
    session.add(
        JobEvent(
            job_id=job.id,
            attempt=job.attempt,
            kind=UNMET_EVENT,
            message=message,
            data={"worker": worker, "missing": missing},
        )
    )
    session.flush()
