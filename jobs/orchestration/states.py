"""The job state machine and the one function that changes a job's status.

States and the moves between them are a table of small named rules keyed by
(from, to), in the style of Prefect's orchestration rules. `transition()` locks the job
row (`SELECT ... FOR UPDATE` on PostgreSQL; on SQLite every tuneyard transaction begins
IMMEDIATE, so writers are already serialised), refuses a move the table does not have
(`IllegalTransition`) or one made by a stale attempt (`StaleAttempt`), applies the rule's
side effects, and writes a `job_events` row and the webhook deliveries of the project's
subscribers to `job.<status>` (`jobs.store.webhooks`). Nothing else writes `jobs.status`. It
does not commit: the caller owns the transaction.

    queued     -> starting (a worker claims it: attempt += 1), cancelled, paused, failed
    starting   -> running, failed, cancelling, retrying, queued (lease lost before start)
    running    -> succeeded, failed, cancelling, pausing, retrying
    cancelling -> cancelled, failed
    pausing    -> paused, failed, succeeded (finished before it could pause), cancelling
    paused     -> queued (resume), cancelled
    retrying   -> queued (next attempt), failed (attempts exhausted), cancelled
    succeeded, failed, cancelled: terminal

`attempt` counts claims and is the fencing token: a worker passes the attempt it claimed,
and a transition from an older attempt is refused. Entering `queued` clears the lease and
`dispatched_at` (the job must be sent to the broker again); entering a terminal state sets
`finished_at` and clears the lease.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from jobs.store.queries import lock_job
from jobs.store.status import JobStatus
from jobs.store.tables import Job, JobEvent, utcnow
from jobs.store.webhooks import enqueue_job_event

Effect = Callable[[Job, datetime], None]


@dataclass(frozen=True)
class Rule:
    """One allowed move; `effect` adjusts the row beyond its status."""

    name: str
    effect: Effect | None = None


def _start_attempt(job: Job, now: datetime) -> None:
    job.attempt += 1
    job.error_code = None
    job.error_message = None


def _mark_started(job: Job, now: datetime) -> None:
    if job.started_at is None:
        job.started_at = now


def _requeue(job: Job, now: datetime) -> None:
    job.lease_owner = None
    job.lease_expires_at = None
    job.dispatched_at = None


def _finish(job: Job, now: datetime) -> None:
    job.finished_at = now
    job.lease_owner = None
    job.lease_expires_at = None


def _release_lease(job: Job, now: datetime) -> None:
    job.lease_owner = None
    job.lease_expires_at = None


S = JobStatus
RULES: dict[tuple[JobStatus, JobStatus], Rule] = {
    (S.QUEUED, S.STARTING): Rule("claim", _start_attempt),
    (S.QUEUED, S.CANCELLED): Rule("cancel_before_start", _finish),
    (S.QUEUED, S.PAUSED): Rule("pause_before_start", _release_lease),
    (S.QUEUED, S.FAILED): Rule("unschedulable", _finish),
    (S.STARTING, S.RUNNING): Rule("process_started", _mark_started),
    (S.STARTING, S.FAILED): Rule("launch_failed", _finish),
    (S.STARTING, S.CANCELLING): Rule("cancel_requested"),
    (S.STARTING, S.RETRYING): Rule("launch_interrupted", _release_lease),
    (S.STARTING, S.QUEUED): Rule("lease_lost_before_start", _requeue),
    (S.RUNNING, S.SUCCEEDED): Rule("finished", _finish),
    (S.RUNNING, S.FAILED): Rule("crashed", _finish),
    (S.RUNNING, S.CANCELLING): Rule("cancel_requested"),
    (S.RUNNING, S.PAUSING): Rule("pause_requested"),
    (S.RUNNING, S.RETRYING): Rule("attempt_failed", _release_lease),
    (S.CANCELLING, S.CANCELLED): Rule("cancelled", _finish),
    (S.CANCELLING, S.FAILED): Rule("failed_while_cancelling", _finish),
    (S.PAUSING, S.PAUSED): Rule("paused", _release_lease),
    (S.PAUSING, S.FAILED): Rule("failed_while_pausing", _finish),
    (S.PAUSING, S.SUCCEEDED): Rule("finished_before_pause", _finish),
    (S.PAUSING, S.CANCELLING): Rule("cancel_requested"),
    (S.PAUSED, S.QUEUED): Rule("resume", _requeue),
    (S.PAUSED, S.CANCELLED): Rule("cancel_paused", _finish),
    (S.RETRYING, S.QUEUED): Rule("next_attempt", _requeue),
    (S.RETRYING, S.FAILED): Rule("attempts_exhausted", _finish),
    (S.RETRYING, S.CANCELLED): Rule("cancel_between_attempts", _finish),
}

# Columns a caller may set alongside a transition (status and attempt belong to the rules).
SETTABLE_FIELDS = frozenset(
    {
        "lease_owner",
        "lease_expires_at",
        "error_code",
        "error_message",
        "run_dir",
        "dispatched_at",
        "started_at",
        "finished_at",
    }
)


class TransitionRefused(Exception):
    """Base for every refusal; carries the job's current status for a 409 answer."""

    def __init__(self, current_status: str, requested: str, message: str):
        self.current_status = current_status
        self.requested = requested
        super().__init__(message)


class IllegalTransition(TransitionRefused):
    def __init__(self, current_status: str, requested: str):
        super().__init__(
            current_status, requested, f"cannot move a {current_status} job to {requested}"
        )


class StaleAttempt(IllegalTransition):
    """The caller holds an older attempt than the row: its worker lost the job."""

    def __init__(self, current_status: str, requested: str, current: int, given: int):
        TransitionRefused.__init__(
            self,
            current_status,
            requested,
            f"attempt {given} is stale (the job is on attempt {current}); not moving to {requested}",
        )
        self.current_attempt = current
        self.given_attempt = given


# What a user's cancel / pause / resume asks for, by the job's current status. Statuses in
# ALREADY mean the request is in effect (answered as a no-op); any other status is refused.
CONTROL: dict[str, dict[JobStatus, JobStatus]] = {
    "cancel": {
        S.QUEUED: S.CANCELLED,
        S.PAUSED: S.CANCELLED,
        S.RETRYING: S.CANCELLED,
        S.STARTING: S.CANCELLING,
        S.RUNNING: S.CANCELLING,
        S.PAUSING: S.CANCELLING,
    },
    "pause": {S.QUEUED: S.PAUSED, S.RUNNING: S.PAUSING},
    "resume": {S.PAUSED: S.QUEUED},
}
ALREADY: dict[str, frozenset[JobStatus]] = {
    "cancel": frozenset({S.CANCELLING}),
    "pause": frozenset({S.PAUSING, S.PAUSED}),
    "resume": frozenset(),
}


def available_controls(status: str) -> list[str]:
    """The user requests that would change a job in `status` now."""
    return [verb for verb, table in CONTROL.items() if status in table]


def request_control(session: Session, job_id: str, verb: str, *, reason: str) -> tuple[Job, bool]:
    """Apply a user's cancel / pause / resume under the row lock; (job, changed).

    Raises IllegalTransition(current_status, verb) when the job's state does not allow it.
    """
    job = lock_job(session, job_id)
    current = JobStatus(job.status)
    if current in ALREADY[verb]:
        return job, False
    target = CONTROL[verb].get(current)
    if target is None:
        raise IllegalTransition(current, verb)
    return transition(session, job_id, target, reason=reason, data={"request": verb}), True


def allowed_targets(status: str) -> list[str]:
    """Where a job in `status` may go next (for docs, the CLI and the dashboard)."""
    return [str(to) for (frm, to) in RULES if frm == status]


def transition(
    session: Session,
    job_id: str,
    to_status: str,
    *,
    reason: str,
    attempt: int | None = None,
    data: dict[str, Any] | None = None,
    **fields: Any,
) -> Job:
    """Move a job to `to_status` under its row lock, or raise; writes one job_event."""
    unknown = set(fields) - SETTABLE_FIELDS
    if unknown:
        raise TypeError(f"transition() cannot set {sorted(unknown)}")
    target = JobStatus(to_status)
    job = lock_job(session, job_id)
    current = job.status
    if attempt is not None and attempt != job.attempt:
        raise StaleAttempt(current, target, job.attempt, attempt)
    rule = RULES.get((JobStatus(current), target))
    if rule is None:
        raise IllegalTransition(current, target)
    now = utcnow()
    job.status = target.value
    if rule.effect:
        rule.effect(job, now)
    for name, value in fields.items():
        setattr(job, name, value)
    job.updated_at = now
    session.add(_event(job, current, rule, reason, data, now))
    enqueue_job_event(session, job, current, reason)  # the outbox, in this transaction
    session.flush()
    return job


def _event(
    job: Job, from_status: str, rule: Rule, reason: str, data: dict[str, Any] | None, now: datetime
) -> JobEvent:
    return JobEvent(
        job_id=job.id,
        attempt=job.attempt,
        kind="transition",
        from_status=from_status,
        to_status=job.status,
        message=reason,
        data={"rule": rule.name, **(data or {})},
        created_at=now,
    )
