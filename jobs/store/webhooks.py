"""Webhooks: the event names, the URL rules, a project's subscriptions, and the outbox.

An event is written to the outbox (`webhook_deliveries`, one row per subscribed webhook) by
`enqueue_event`, inside the caller's transaction: the delivery exists exactly when the event
that caused it was committed. Job status changes are enqueued by
`jobs.orchestration.states.transition` (`job.<status>`, one name per `JobStatus`), published
checkpoints by `jobs.store.ingest` (`checkpoint.published`), exports by whoever settles them
(`export.succeeded`, `export.failed`). The sender (`worker.webhook_sender`) claims due rows
with `claim_due_deliveries` and reports each attempt with `record_attempt`; the claim's
attempt number fences a sender whose lease ran out. Private addresses (loopback, RFC 1918,
link-local, ...) are refused unless the operator allows them (`private_addresses_allowed`).
"""

from __future__ import annotations

import ipaddress
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from jobs.recipe.errors import FieldError
from jobs.store.engine import database_url, is_postgresql
from jobs.store.settings import Settings
from jobs.store.status import JobStatus
from jobs.store.tables import Job, Project, Webhook, WebhookDelivery, utcnow

JOB_EVENTS = tuple(f"job.{status.value}" for status in JobStatus)
ARTIFACT_EVENTS = ("checkpoint.published", "export.succeeded", "export.failed", "export.cancelled")
EVENTS = (*JOB_EVENTS, *ARTIFACT_EVENTS)
MAX_WEBHOOKS_PER_PROJECT = 20
MAX_URL_LENGTH = 2000
PRIVATE_FIX = (
    "use an address reachable on the public internet, or have the operator set "
    "TUNEYARD_WEBHOOK_ALLOW_PRIVATE=1 on the API and the scheduler"
)


def job_event(status: str) -> str:
    """The event name of a job entering `status`."""
    return f"job.{JobStatus(status).value}"


# --- URL rules ------------------------------------------------------------------------------


def private_addresses_allowed(settings: Settings) -> bool:
    """The operator's TUNEYARD_WEBHOOK_ALLOW_PRIVATE; unset, allowed only on the embedded
    SQLite default (one machine, where the receiver is usually on loopback)."""
    if settings.webhook_allow_private is not None:
        return settings.webhook_allow_private
    return database_url(settings).startswith("sqlite")


def address_allowed(address: str, allow_private: bool) -> bool:
    """Whether a delivery may connect to `address` (an IP literal)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if allow_private:
        return not ip.is_multicast and not ip.is_unspecified
    return ip.is_global and not ip.is_multicast


def url_problem(url: str, allow_private: bool) -> FieldError | None:
    """What is wrong with a webhook URL, as a FieldError at `url`, or None.

    A host name is checked for what it names at every delivery (`worker.webhook_sender`);
    here only IP literals and `localhost` names can be judged."""
    if len(url) > MAX_URL_LENGTH or not url.isascii() or not url.isprintable() or " " in url:
        return FieldError(
            "url",
            "is too long, or holds spaces, control or non-ASCII characters",
            f"send a URL of at most {MAX_URL_LENGTH} ASCII characters: the path "
            "percent-encoded, an international host name in its xn-- form",
        )
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises on a port that is no number or out of range
    except ValueError as exc:
        return FieldError("url", f"is not a URL ({exc})", "send e.g. https://ci.example.com/hook")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return FieldError(
            "url",
            "must be an http or https URL with a host",
            "send e.g. https://ci.example.com/hook",
        )
    if parts.username is not None or parts.password is not None:
        return FieldError(
            "url",
            "holds credentials (user:password@)",
            "remove them; the receiver checks the Tuneyard-Signature header instead",
        )
    if parts.fragment:
        return FieldError("url", "has a #fragment, which is never sent", "remove the #fragment")
    host = parts.hostname.rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        host = "127.0.0.1"
    try:
        allowed = address_allowed(host, allow_private)
    except ValueError:
        return None  # a host name: judged when it is resolved, at each delivery
    if not allowed:
        return FieldError("url", f"points at a private or reserved address ({host})", PRIVATE_FIX)
    return None


# --- subscriptions --------------------------------------------------------------------------


def create_webhook(
    session: Session, project_id: int, url: str, events: list[str], secret: str
) -> Webhook:
    """Add a subscription; ValueError when the project already has the most it may have."""
    count = session.scalar(select(func.count()).where(Webhook.project_id == project_id))
    if (count or 0) >= MAX_WEBHOOKS_PER_PROJECT:
        raise ValueError(
            f"the project has {MAX_WEBHOOKS_PER_PROJECT} webhooks, the most it may have; "
            "delete one first"
        )
    webhook = Webhook(project_id=project_id, url=url, events=sorted(set(events)), secret=secret)
    session.add(webhook)
    session.flush()
    return webhook


def list_webhooks(session: Session, project_id: int) -> list[Webhook]:
    stmt = select(Webhook).where(Webhook.project_id == project_id).order_by(Webhook.id)
    return list(session.scalars(stmt))


def get_webhook(session: Session, project_id: int, webhook_id: int) -> Webhook | None:
    """The project's webhook `webhook_id`; None for another project's, as for none at all."""
    webhook = session.get(Webhook, webhook_id)
    return webhook if webhook is not None and webhook.project_id == project_id else None


def delete_webhook(session: Session, project_id: int, webhook_id: int) -> bool:
    """Delete a subscription and its deliveries (pending ones are never sent)."""
    result = session.execute(
        delete(Webhook).where(Webhook.id == webhook_id, Webhook.project_id == project_id)
    )
    return bool(result.rowcount)


def list_deliveries(
    session: Session, webhook_id: int, before: int | None, limit: int
) -> list[WebhookDelivery]:
    """A webhook's deliveries, newest first, those with a row id below `before`."""
    stmt = select(WebhookDelivery).where(WebhookDelivery.webhook_id == webhook_id)
    if before is not None:
        stmt = stmt.where(WebhookDelivery.id < before)
    return list(session.scalars(stmt.order_by(WebhookDelivery.id.desc()).limit(limit)))


# --- the outbox -----------------------------------------------------------------------------


def _insert(session: Session) -> Any:
    if is_postgresql(session):
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert(WebhookDelivery)


def enqueue_event(
    session: Session,
    project_id: int,
    event: str,
    data: dict[str, Any],
    *,
    dedupe_key: str | None = None,
) -> int:
    """Write one delivery of `event` per webhook of the project that subscribed to it, in the
    caller's transaction (not committed); returns how many. With `dedupe_key`, an event
    reported again under the same key (a replay) adds no second delivery."""
    if event not in EVENTS:
        raise ValueError(f"unknown webhook event {event!r}; add it to jobs.store.webhooks.EVENTS")
    hooks = [h for h in list_webhooks(session, project_id) if event in h.events]
    if not hooks:
        return 0
    project = session.get(Project, project_id)
    now = utcnow()
    rows = []
    for hook in hooks:
        delivery_id = str(uuid.uuid4())
        payload = {
            "id": delivery_id,
            "event": event,
            "created_at": now.isoformat(),
            "project": project.name if project else None,
            "data": data,
        }
        rows.append(
            {
                "delivery_id": delivery_id,
                "webhook_id": hook.id,
                "event": event,
                "dedupe_key": dedupe_key,
                "payload": payload,
                "status": "pending",
                "attempts": 0,
                "next_attempt_at": now,
                "created_at": now,
            }
        )
    stmt = _insert(session).on_conflict_do_nothing(index_elements=["webhook_id", "dedupe_key"])
    session.connection().execute(stmt, rows)
    return len(rows)


def job_summary(job: Job) -> dict[str, Any]:
    """What every job event's `data.job` says of the job."""
    return {
        "id": job.id,
        "name": job.name,
        "status": job.status,
        "attempt": job.attempt,
        "error_code": job.error_code,
        "error_message": job.error_message,
    }


def enqueue_job_event(session: Session, job: Job, from_status: str, reason: str) -> int:
    """The outbox rows for a job that just entered `job.status` (called by `transition`)."""
    data = {"job": job_summary(job), "from_status": from_status, "reason": reason}
    return enqueue_event(session, job.project_id, job_event(job.status), data)


def enqueue_checkpoint_events(
    session: Session, job_id: str, attempt: int, checkpoints: list[dict[str, Any]]
) -> int:
    """`checkpoint.published` for each checkpoint row (step, path, size_bytes, metrics), once
    per job, attempt and step however often the worker re-reads its events."""
    job = session.get(Job, job_id)
    if job is None or not checkpoints:
        return 0
    added = 0
    for row in checkpoints:
        checkpoint = {k: row.get(k) for k in ("step", "path", "size_bytes", "metrics")}
        data = {"job": job_summary(job), "attempt": attempt, "checkpoint": checkpoint}
        key = f"checkpoint:{job_id}:{attempt}:{row['step']}"
        added += enqueue_event(
            session, job.project_id, "checkpoint.published", data, dedupe_key=key
        )
    return added


@dataclass(frozen=True)
class DueDelivery:
    """A claimed delivery: what the sender needs to send it and to report the attempt."""

    row_id: int
    delivery_id: str
    event: str
    url: str
    secret: str
    payload: dict[str, Any]
    attempt: int  # this attempt's number (1 for the first): the claim's fencing token


def claim_due_deliveries(session: Session, limit: int, lease_seconds: float) -> list[DueDelivery]:
    """Claim up to `limit` pending deliveries that are due: each gets its attempt counted and
    is held for `lease_seconds` (due again then, should its sender never report).

    `FOR UPDATE SKIP LOCKED` on PostgreSQL lets senders claim side by side; SQLite's
    `BEGIN IMMEDIATE` serialises them. The caller commits before it sends."""
    now = utcnow()
    stmt = (
        select(WebhookDelivery, Webhook.url, Webhook.secret)
        .join(Webhook, Webhook.id == WebhookDelivery.webhook_id)
        .where(WebhookDelivery.status == "pending", WebhookDelivery.next_attempt_at <= now)
        .order_by(WebhookDelivery.next_attempt_at, WebhookDelivery.id)
        .limit(limit)
        .with_for_update(skip_locked=True, of=WebhookDelivery)
    )
    claimed = []
    for row, url, secret in session.execute(stmt).all():
        row.attempts += 1
        row.last_attempt_at = now
        row.next_attempt_at = now + timedelta(seconds=lease_seconds)
        claimed.append(
            DueDelivery(row.id, row.delivery_id, row.event, url, secret, row.payload, row.attempts)
        )
    session.flush()
    return claimed


@dataclass(frozen=True)
class AttemptResult:
    """What one POST got: a status code and the start of the body, or an error."""

    status_code: int | None = None
    response: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def record_attempt(
    session: Session, delivery: DueDelivery, result: AttemptResult, retry_at: datetime | None
) -> bool:
    """Store an attempt's result: `succeeded` on a 2xx, else `pending` until `retry_at`, or
    `failed` when `retry_at` is None. False when the claim was lost (its lease ran out and
    another attempt began) or the webhook was deleted: nothing is written then."""
    now = utcnow()
    values: dict[str, Any] = {
        "last_status_code": result.status_code,
        "last_response": result.response,
        "last_error": result.error,
    }
    if result.ok:
        values.update(status="succeeded", delivered_at=now, next_attempt_at=None)
    elif retry_at is None:
        values.update(status="failed", next_attempt_at=None)
    else:
        values.update(next_attempt_at=retry_at)
    stmt = (
        update(WebhookDelivery)
        .where(
            WebhookDelivery.id == delivery.row_id,
            WebhookDelivery.attempts == delivery.attempt,
            WebhookDelivery.status == "pending",
        )
        .values(**values)
    )
    return bool(session.execute(stmt).rowcount)
