"""Orchestration policy: every decision about what a job's status becomes after something happened.

The worker and the reconciler only report what happened (an attempt's process ended, a
lease expired, the job's status was read while running); the functions here decide and
apply the status through `jobs.orchestration.states.transition`, with the attempt as fencing
token:

- `classify_exit` reads torchrun's exit code, the trainer's last outcome event and the first
  cause among the ranks' failure records (`first_cause`) into an `Outcome`: user errors fail
  the job at once, everything else (crash, killed rank, rendezvous timeout, preemption) is an
  infrastructure failure that is retried.
- `first_cause` picks, among what each failing rank recorded, the failure that ended the
  attempt (user errors first, then crashes of a rank's own before those a lost peer caused,
  then the earliest) and the ranks that reported it.
- `settle_attempt` writes an attempt's end. A cancel request wins over any outcome; a pause
  request whose attempt finished anyway means the job succeeded; otherwise the outcome's
  verdict decides.
- `retry_or_fail` spends the retry budget: only attempts that failed count (a pause and
  resume spends none); the next attempt resumes from LATEST while budget remains.
- `settle_expired_lease` decides what a job whose worker vanished becomes: a requested
  cancel or pause completes, anything else is an infrastructure failure of the attempt.
- `stop_request` says which running-job statuses ask the worker to stop its processes.

Each settling function returns True when the job went back to `queued`: the caller sends
its id to the broker after committing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from jobs.orchestration.states import transition
from jobs.recipe.exit_codes import (
    FAILURE_CODES,
    MESSAGE_MAX,
    ExitCode,
    RankFailure,
    clip_text,
    is_user_error,
)
from jobs.store.status import TERMINAL, JobStatus
from jobs.store.tables import Job, JobEvent


class Verdict(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # a user error: retrying cannot help
    RETRY = "retry"  # an infrastructure failure: a new attempt may succeed


@dataclass(frozen=True)
class Outcome:
    """How one attempt ended, as the worker observed it."""

    verdict: Verdict
    code: str | None = None  # a FAILURE_CODES value, or an infrastructure code
    message: str = ""
    exit_code: int | None = None


# Trainer events that decide an attempt's outcome.
OUTCOME_EVENTS = frozenset({"failed", "preempted", "finished"})
# What a running job's status asks its worker to do with the processes.
STOP_REQUESTS = {JobStatus.CANCELLING: "cancel", JobStatus.PAUSING: "pause"}


def is_outcome_event(record: dict[str, Any]) -> bool:
    return record.get("event") in OUTCOME_EVENTS


def stop_request(status: str) -> str | None:
    """ "cancel" or "pause" when the job's status asks the worker to stop, else None."""
    return STOP_REQUESTS.get(status)  # a StrEnum key hashes like its string


def _code_name(exit_code: int) -> str:
    try:
        return FAILURE_CODES.get(ExitCode(exit_code), f"exit_{exit_code}")
    except ValueError:
        return "killed" if exit_code < 0 else f"exit_{exit_code}"


# Crash messages of a rank whose peer went away (gloo, NCCL, sockets): a consequence of
# another rank's failure, so a rank's own crash is preferred as the cause.
PEER_LOSS_MARKERS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "remote process exited",
    "ncclremoteerror",
    "communicator was aborted",
)


@dataclass(frozen=True)
class FailureCause:
    """The failure that ended an attempt, as the first rank to see it recorded it."""

    code: str  # a FAILURE_CODES value
    exit_code: int
    message: str
    fix: str
    step: int
    ranks: tuple[int, ...]  # every rank that recorded this same failure
    world_size: int

    def describe(self) -> str:
        """The job's error: `[rank 1] <message> (fix: <fix>)`; no ranks in a one-rank run."""
        text = f"{self.message} (fix: {self.fix})" if self.fix else self.message
        return text if self.world_size <= 1 else f"[{_rank_list(self.ranks)}] {text}"

    def reported_in(self, event: dict[str, Any] | None) -> bool:
        """True when rank 0's last outcome event already reports this cause."""
        if not event or event.get("event") != "failed" or 0 not in self.ranks:
            return False
        message = clip_text(str(event.get("message", "")), MESSAGE_MAX)  # as records clip it
        return event.get("code") == self.code and message == self.message

    def as_event(self, timestamp: float) -> dict[str, Any]:
        """The `failed` event that shows a cause rank 0 did not report among the job's events."""
        return {
            "event": "failed",
            "step": self.step,
            "code": self.code,
            "exit_code": self.exit_code,
            "message": self.describe(),
            "ranks": list(self.ranks),
            "reported_by": "worker",
            "timestamp": timestamp,
        }


def first_cause(
    records: Sequence[RankFailure], rank0_event: dict[str, Any] | None = None
) -> FailureCause | None:
    """The cause of a failed attempt among its ranks' failure records, or None without any.

    A user error comes first (torchrun stopping the other ranks makes them crash or die);
    then a crash of a rank's own before one a lost peer caused; then the earliest. Rank 0's
    `failed` event stands in for a rank 0 record that could not be written.
    """
    candidates = list(records)
    if not candidates:
        return None
    world_size = max(record.world_size for record in candidates)
    if not any(record.rank == 0 for record in candidates):
        stand_in = _event_record(rank0_event, world_size)
        candidates += [stand_in] if stand_in is not None else []
    first = min(candidates, key=lambda r: (_cause_tier(r), r.timestamp, r.rank))
    ranks = sorted({r.rank for r in candidates if _same_failure(r, first)})
    return FailureCause(
        code=first.code,
        exit_code=first.exit_code,
        message=first.message,
        fix=first.fix,
        step=first.step,
        ranks=tuple(ranks),
        world_size=world_size,
    )


def _same_failure(a: RankFailure, b: RankFailure) -> bool:
    return (a.exit_code, a.message) == (b.exit_code, b.message)


def _cause_tier(record: RankFailure) -> int:
    if is_user_error(record.exit_code):
        return 0
    message = record.message.lower()
    return 2 if any(marker in message for marker in PEER_LOSS_MARKERS) else 1


def _event_record(event: dict[str, Any] | None, world_size: int) -> RankFailure | None:
    if not event or event.get("event") != "failed":
        return None
    fields = ("exit_code", "message", "fix", "step", "timestamp")
    data = {name: event[name] for name in fields if name in event}
    return RankFailure.from_json({**data, "rank": 0, "world_size": world_size})


def _rank_list(ranks: tuple[int, ...]) -> str:
    """`rank 1`, `ranks 0, 1`, `ranks 0-63`: runs of three or more ranks shortened."""
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    parts = [f"{r[0]}-{r[-1]}" if len(r) >= 3 else ", ".join(map(str, r)) for r in runs]
    shown = ", ".join(parts[:8]) + (", ..." if len(parts) > 8 else "")
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {shown}"


def classify_exit(
    returncode: int, last_event: dict[str, Any] | None, cause: FailureCause | None = None
) -> Outcome:
    """The outcome of an attempt nobody asked to stop.

    torchrun reports a failed rank as its own exit code 1, so what the ranks recorded is the
    better witness: the first cause among every rank's failure record, else rank 0's `failed`
    event (`code`, `exit_code`, `message`); the exit code is the fallback.
    """
    if cause is not None and returncode != 0:
        verdict = Verdict.FAILED if is_user_error(cause.exit_code) else Verdict.RETRY
        return Outcome(verdict, cause.code, cause.describe(), cause.exit_code)
    event_name = (last_event or {}).get("event")
    if event_name == "failed":
        exit_code = int(last_event.get("exit_code", returncode or ExitCode.CRASH))
        code = str(last_event.get("code") or _code_name(exit_code))
        verdict = Verdict.FAILED if is_user_error(exit_code) else Verdict.RETRY
        return Outcome(verdict, code, str(last_event.get("message") or ""), exit_code)
    if event_name == "preempted" or returncode == ExitCode.PREEMPTED:
        return Outcome(Verdict.RETRY, "preempted", "the trainer was preempted", returncode)
    if returncode == 0:
        return Outcome(Verdict.SUCCEEDED, exit_code=0)
    if is_user_error(returncode):
        message = f"trainer exited with {returncode}"
        return Outcome(Verdict.FAILED, _code_name(returncode), message, returncode)
    reason = f"torchrun exited with {returncode}" + (
        " (killed by a signal)" if returncode < 0 else ""
    )
    return Outcome(Verdict.RETRY, _code_name(returncode), reason, returncode)


def launch_failure(message: str) -> Outcome:
    """The outcome of an attempt whose processes could not be started at all."""
    return Outcome(Verdict.FAILED, "launch_failed", message)


def settle_attempt(
    session: Session, job: Job, attempt: int, outcome: Outcome, stop_kind: str | None, worker: str
) -> bool | None:
    """Write how `attempt` ended; None when the job moved on without it (nothing written).

    `job` is locked by the caller. Returns True when the job went back to `queued`.
    """
    if job.attempt != attempt or job.status in TERMINAL:
        return None
    data = {"worker": worker, "code": outcome.code, "exit_code": outcome.exit_code}
    status = JobStatus(job.status)
    if status == JobStatus.CANCELLING or stop_kind == "cancel":
        _move(session, job, JobStatus.CANCELLED, "cancelled on request", data)
        return False
    if status == JobStatus.PAUSING:
        if outcome.verdict == Verdict.SUCCEEDED:
            _move(session, job, JobStatus.SUCCEEDED, "finished before it could pause", data)
        else:
            reason = "paused on request; resume continues from the LATEST checkpoint"
            _move(session, job, JobStatus.PAUSED, reason, data)
        return False
    if outcome.verdict == Verdict.SUCCEEDED:
        _move(session, job, JobStatus.SUCCEEDED, "trainer finished", data)
        return False
    if outcome.verdict == Verdict.FAILED:
        reason = f"user error {outcome.code}: {outcome.message}"
        _move(
            session,
            job,
            JobStatus.FAILED,
            reason,
            data,
            error_code=outcome.code,
            error_message=outcome.message,
        )
        return False
    return retry_or_fail(session, job, outcome.code or "crash", outcome.message, data)


def retry_or_fail(session: Session, job: Job, code: str, message: str, data: dict) -> bool:
    """An infrastructure failure of the current attempt: queue the next one, or fail if spent."""
    attempt = job.attempt
    _move(session, job, JobStatus.RETRYING, f"attempt {attempt} failed ({code}): {message}", data)
    failures = failed_attempts(session, job.id)
    if failures >= job.max_attempts:
        reason = f"{code}: {failures} failed attempts of {job.max_attempts} allowed"
        _move(session, job, JobStatus.FAILED, reason, data, error_code=code, error_message=message)
        return False
    reason = (
        f"attempt {attempt + 1} resumes from LATEST "
        f"({failures} of {job.max_attempts} allowed failures used)"
    )
    _move(session, job, JobStatus.QUEUED, reason, data)
    return True


def settle_expired_lease(session: Session, job: Job) -> bool:
    """The job's worker stopped renewing its lease: finish what was asked, or retry."""
    owner = job.lease_owner
    data = {"lease_owner": owner, "lease_expired_at": str(job.lease_expires_at)}
    reason = f"lease of worker {owner} expired"
    if job.status == JobStatus.CANCELLING:
        _move(session, job, JobStatus.CANCELLED, reason, data)
        return False
    if job.status == JobStatus.PAUSING:
        _move(session, job, JobStatus.PAUSED, reason, data)
        return False
    return retry_or_fail(session, job, "worker_lost", reason, data)


def failed_attempts(session: Session, job_id: str) -> int:
    """Attempts of a job that ended in an infrastructure failure (entered `retrying`).

    `attempt` counts claims, and a pause/resume cycle is a claim too; the retry budget
    (`max_attempts`) is spent only by failures.
    """
    query = (
        select(func.count())
        .select_from(JobEvent)
        .where(JobEvent.job_id == job_id, JobEvent.to_status == JobStatus.RETRYING.value)
    )
    return int(session.execute(query).scalar_one())


def failed_attempts_by_job(session: Session, job_ids: list[str]) -> dict[str, int]:
    """`failed_attempts` of several jobs in one query; a job without failures is absent."""
    if not job_ids:
        return {}
    query = (
        select(JobEvent.job_id, func.count())
        .where(JobEvent.job_id.in_(job_ids), JobEvent.to_status == JobStatus.RETRYING.value)
        .group_by(JobEvent.job_id)
    )
    return {job_id: int(count) for job_id, count in session.execute(query)}


def _move(
    session: Session, job: Job, to: JobStatus, reason: str, data: dict, **fields: Any
) -> None:
    transition(session, job.id, to, attempt=job.attempt, reason=reason, data=data, **fields)
