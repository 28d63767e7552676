"""Claiming a job: the status change that makes a worker the owner of one attempt.

`claim_job` moves a queued job to `starting` under its row lock (the attempt number goes
up: it is the fencing token every later write of that worker carries) and gives the
caller a lease and the `Claim` it runs from. A job that is not queued any more (a
duplicate or stale message) gives no claim, and neither does a job that requires an optional
package the worker lacks (`plan.requires`): the job stays queued, one `requirements_unmet`
event per worker says why, and the reconciler sends it again for another worker.

Every attempt (the first, a retry, a resume) passes here, so the claim is also where the
grants the stored recipe needs (`jobs.recipe.plan.grants`) are asked again: a job whose
grant was withdrawn since it was submitted, and that the worker's operator does not allow
either, fails (`grant_revoked`) before any process of it starts; no other worker could run it.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.orchestration.states import transition
from jobs.recipe.plan.grants import (
    project_grants,
    required_grants,
    revoked_grant_errors,
    unmet_grants,
)
from jobs.recipe.plan.requirements import missing_packages
from jobs.store.api_keys import remote_code_granted
from jobs.store.leases import Claim, claim_of, lease_until, take_gang_slot
from jobs.store.queries import lock_job
from jobs.store.status import JobStatus
from jobs.store.tables import Job, JobEvent

UNMET_EVENT = "requirements_unmet"
GRANT_REVOKED = "grant_revoked"


def claim_job(
    session: Session,
    job_id: str,
    worker: str,
    lease_seconds: float,
    run_dir: str,
    packages: Iterable[str] | None = None,
    operator_grants: Iterable[str] = (),
) -> Claim | None:
    """Claim a queued job for `worker`; None when it is not queued (a duplicate message),
    lost a grant it needs (it fails; `operator_grants`: what the worker's operator allows
    every project), or needs a package missing from `packages` (the worker's optional
    packages; None: unchecked)."""
    job = lock_job(session, job_id)
    if job.status != JobStatus.QUEUED:
        return None
    if _fail_if_ungranted(session, job, worker, operator_grants):
        return None
    missing = [] if packages is None else missing_packages(_requires(job), packages)
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
    missing = [] if packages is None or job is None else missing_packages(_requires(job), packages)
    if job is not None and missing:
        _note_unmet(session, job, worker, missing)
        return None
    return take_gang_slot(session, job_id, worker)


def _requires(job: Job) -> Iterable[str]:
    """The optional packages the job's plan requires (package -> the field that needs it)."""
    return (job.plan or {}).get("requires") or {}


def _fail_if_ungranted(
    session: Session, job: Job, worker: str, operator_grants: Iterable[str]
) -> bool:
    """Fail the locked, queued `job` when its stored recipe needs a grant nobody gives now."""
    needed = required_grants(job.recipe or {})
    if not needed:
        return False
    held = {*operator_grants, *project_grants(remote_code_granted(session, job.project_id))}
    unmet = unmet_grants(needed, held)
    if not unmet:
        return False
    message = "; ".join(str(error) for error in revoked_grant_errors(unmet))
    transition(
        session,
        job.id,
        JobStatus.FAILED,
        reason=f"{GRANT_REVOKED}: {message}",
        data={"worker": worker, "code": GRANT_REVOKED, "grants": unmet},
        error_code=GRANT_REVOKED,
        error_message=message,
    )
    return True


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
