"""Export states: the (from, to) rule table, the one locked `transition_export`, and the
few policy decisions an export needs (what a subprocess exit, an expired lease or a user's
cancel makes of it).

An export is smaller than a job: no pause, no gang, no `retrying` stop. A worker claims a
`queued` export (`running`, attempt + 1, a lease); the subprocess' exit settles it
(`succeeded`, `failed` for a refusal, `queued` again for a crash while attempts remain);
the reconciler treats an expired lease like a crash. A cancel ends a queued export at once
and asks a running one to stop (`cancelling`), which its worker, or the reconciler when
the worker is gone, ends `cancelled`. Every change writes one `export_events` row under the
export's row lock, and reaching a final status writes the `export.<status>` webhook event
to the outbox in the same transaction; only this module writes `Export.status`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.orchestration.states import IllegalTransition, StaleAttempt
from jobs.recipe.exit_codes import FAILURE_CODES, is_user_error
from jobs.store.status import EXPORT_TERMINAL, ExportStatus
from jobs.store.tables import Export, ExportEvent, utcnow
from jobs.store.webhooks import enqueue_event

S = ExportStatus


def _claim(export: Export, now: datetime) -> None:
    export.attempt += 1
    export.started_at = export.started_at or now
    export.error_code = export.error_message = None


def _requeue(export: Export, now: datetime) -> None:
    export.lease_owner = export.lease_expires_at = export.dispatched_at = None


def _finish(export: Export, now: datetime) -> None:
    export.lease_owner = export.lease_expires_at = None
    export.finished_at = now


@dataclass(frozen=True)
class Rule:
    name: str
    effect: Callable[[Export, datetime], None] | None = None


RULES: dict[tuple[ExportStatus, ExportStatus], Rule] = {
    (S.QUEUED, S.RUNNING): Rule("claimed", _claim),
    (S.QUEUED, S.CANCELLED): Rule("cancelled_before_start", _finish),
    (S.RUNNING, S.SUCCEEDED): Rule("published", _finish),
    (S.RUNNING, S.FAILED): Rule("failed", _finish),
    (S.RUNNING, S.QUEUED): Rule("retry", _requeue),
    (S.RUNNING, S.CANCELLING): Rule("cancel_requested"),
    (S.CANCELLING, S.CANCELLED): Rule("cancelled", _finish),
    (S.CANCELLING, S.SUCCEEDED): Rule("finished_before_cancel", _finish),
    (S.CANCELLING, S.FAILED): Rule("failed_while_cancelling", _finish),
}

SETTABLE_FIELDS = frozenset(
    {"lease_owner", "lease_expires_at", "path", "size_bytes", "error_code", "error_message"}
)
CANCEL = {S.QUEUED: S.CANCELLED, S.RUNNING: S.CANCELLING}


def lock_export(session: Session, export_id: str) -> Export:
    """The export row under a row lock (FOR UPDATE; a no-op clause on SQLite)."""
    stmt = (
        select(Export)
        .where(Export.id == export_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    return session.execute(stmt).scalar_one()


def transition_export(
    session: Session,
    export_id: str,
    to_status: ExportStatus,
    *,
    reason: str,
    attempt: int | None = None,
    data: dict[str, Any] | None = None,
    **fields: Any,
) -> Export:
    """Move an export to `to_status` under its row lock, or raise; writes one event."""
    unknown = set(fields) - SETTABLE_FIELDS
    if unknown:
        raise TypeError(f"transition_export() cannot set {sorted(unknown)}")
    export = lock_export(session, export_id)
    current = S(export.status)
    if attempt is not None and attempt != export.attempt:
        raise StaleAttempt(current, to_status, export.attempt, attempt)
    rule = RULES.get((current, to_status))
    if rule is None:
        raise IllegalTransition(current, to_status)
    now = utcnow()
    export.status = to_status.value
    if rule.effect:
        rule.effect(export, now)
    for name, value in fields.items():
        setattr(export, name, value)
    export.updated_at = now
    session.add(
        ExportEvent(
            export_id=export.id,
            attempt=export.attempt,
            kind="transition",
            from_status=current.value,
            to_status=export.status,
            message=reason,
            data={"rule": rule.name, **(data or {})},
            created_at=now,
        )
    )
    if export.status in EXPORT_TERMINAL:
        data = {"export": export_summary(export), "from_status": current.value, "reason": reason}
        enqueue_event(session, export.project_id, f"export.{export.status}", data)
    session.flush()
    return export


def export_summary(export: Export) -> dict[str, Any]:
    """What an export's webhook event says of it (no server paths)."""
    return {
        "id": export.id,
        "job_id": export.job_id,
        "step": export.step,
        "kind": export.kind,
        "dtype": export.dtype,
        "status": export.status,
        "attempt": export.attempt,
        "size_bytes": export.size_bytes,
        "error_code": export.error_code,
        "error_message": export.error_message,
    }


def request_cancel(session: Session, export_id: str) -> tuple[Export, bool]:
    """A user's cancel under the row lock; (export, changed). A `cancelling` export is a
    no-op; a finished one raises IllegalTransition(current, "cancel")."""
    export = lock_export(session, export_id)
    current = S(export.status)
    if current is S.CANCELLING:
        return export, False
    target = CANCEL.get(current)
    if target is None:
        raise IllegalTransition(current, "cancel")
    return transition_export(session, export_id, target, reason="cancel requested"), True


def available_export_controls(status: str) -> list[str]:
    return ["cancel"] if status in CANCEL else []


def claim_export(session: Session, export_id: str, worker: str, lease_seconds: float) -> int | None:
    """Take a `queued` export for `worker` with a lease; its new attempt, or None when it is
    not queued (a duplicate or redelivered message, or cancelled meanwhile)."""
    export = lock_export(session, export_id)
    if export.status != S.QUEUED:
        return None
    expires = utcnow() + timedelta(seconds=lease_seconds)
    export = transition_export(
        session,
        export_id,
        S.RUNNING,
        reason=f"claimed by worker {worker}",
        lease_owner=worker,
        lease_expires_at=expires,
    )
    return export.attempt


def settle_exit(
    session: Session, export_id: str, attempt: int, code: int, detail: str, **published: Any
) -> bool:
    """How the export subprocess' exit `code` ends this attempt; True when re-queued.

    0 publishes (`published`: path and size_bytes); a refusal (a user-level exit code: bad
    checkpoint, unsupported adapter) fails at once; a crash or a signal is retried while
    attempts remain. A `cancelling` export ends `cancelled` unless it published first."""
    export = lock_export(session, export_id)
    if code == 0:
        transition_export(
            session, export_id, S.SUCCEEDED, reason="export published", attempt=attempt, **published
        )
        return False
    if export.status == S.CANCELLING:
        transition_export(
            session, export_id, S.CANCELLED, reason="stopped on request", attempt=attempt
        )
        return False
    error = FAILURE_CODES.get(code, "crash")
    retry = not is_user_error(code) and export.attempt < export.max_attempts
    transition_export(
        session,
        export_id,
        S.QUEUED if retry else S.FAILED,
        reason=f"exit {code}" + ("; retrying" if retry else ""),
        attempt=attempt,
        error_code=error,
        error_message=detail[-2000:],
    )
    return retry


def settle_expired_export(session: Session, export: Export) -> bool:
    """The reconciler's decision for an export whose worker stopped renewing its lease:
    `cancelled` when it was being cancelled, else re-queued while attempts remain, else
    `failed`. True when re-queued (the caller dispatches it after the commit)."""
    holder = export.lease_owner or "?"
    reason = f"lease of worker {holder} expired"
    if export.status == S.CANCELLING:
        transition_export(session, export.id, S.CANCELLED, reason=reason)
        return False
    if export.attempt >= export.max_attempts:
        transition_export(
            session,
            export.id,
            S.FAILED,
            reason=reason,
            error_code="worker_lost",
            error_message=f"{reason} on the last of {export.max_attempts} attempts",
        )
        return False
    transition_export(session, export.id, S.QUEUED, reason=f"{reason}; retrying")
    return True
