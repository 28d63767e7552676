"""The broker: the only code in tuneyard that knows Celery, kombu or Redis.

It sends job ids (`enqueue_job`, and `dispatch_job`, which also records the dispatch in the
database) and export ids (`dispatch_export`), answers the readiness ping (`broker_reachable`), counts the messages waiting per
queue (`queue_lengths`) and tells which job ids are still waiting (`queued_job_ids`, what
the reconciler asks before it re-sends a job). The API, the worker and the reconciler call
these and nothing below them.

A message carries nothing but a job id; the database row says everything else, and the
worker's database lease (not the broker's delivery) decides who runs a job. The broker is
`TUNEYARD_BROKER_URL` (Redis in production), or, when unset, the embedded default: kombu's
SQLAlchemy transport on its own SQLite file `<TUNEYARD_HOME>/broker.db` (a separate file
from the jobs database so Alembic never sees kombu's tables and the two never contend for
SQLite's single writer lock). Celery, kombu and redis are imported inside functions only,
so importing this module costs nothing at start-up; a server calls `connect_broker` once
at start-up (the API's lifespan), which imports the client and opens its connection before
any request thread needs it. The client is built under a lock: concurrent first imports of
`celery` from request threads can see a half-initialised module.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Iterable
from typing import Any

from sqlalchemy.orm import Session

from jobs.store.engine import session_scope
from jobs.store.exports import mark_export_dispatched
from jobs.store.queries import mark_dispatched
from jobs.store.settings import Settings, get_settings
from jobs.store.tables import Job

log = logging.getLogger("tuneyard.broker")

RUN_JOB_TASK = "tuneyard.run_job"
RUN_EXPORT_TASK = "tuneyard.run_export"
DEFAULT_QUEUES = ("cpu", "gpu-1", "gpu-8")
_PUBLISH_RETRY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}


def broker_url_for(settings: Settings | None = None) -> str:
    """The broker URL in use: the configured one, or the embedded SQLite broker."""
    settings = settings or get_settings()
    if settings.broker_url:
        return settings.broker_url
    settings.home.mkdir(parents=True, exist_ok=True)
    return f"sqla+sqlite:///{settings.home / 'broker.db'}"


def celery_config(broker_url: str) -> dict[str, Any]:
    """Celery settings shared by the dispatch client and the worker app."""
    return {
        "broker_url": broker_url,
        "task_acks_late": False,  # acknowledge at once: the DB lease owns the job
        "worker_prefetch_multiplier": 1,
        "task_ignore_result": True,
        "result_backend": None,
        "task_serializer": "json",
        "accept_content": ["json"],
        "broker_connection_retry_on_startup": True,
        # kombu's SQLAlchemy transport hands these to create_engine, so Redis only.
        # No ack emulation: tasks are acknowledged on receipt anyway, and its bookkeeping
        # (two more Redis round trips per message, redelivery after the visibility timeout)
        # guards nothing the database lease and the reconciler's re-dispatch do not.
        "broker_transport_options": (
            {"visibility_timeout": 3600, "ack_emulation": False}
            if broker_url.startswith("redis")
            else {}
        ),
        "task_default_queue": "cpu",
        "task_create_missing_queues": True,
        "worker_hijack_root_logger": False,
    }


_clients: dict[str, Any] = {}
_clients_lock = threading.Lock()


def _client(broker_url: str) -> Any:
    """The process's Celery client for `broker_url`, built once under a lock."""
    app = _clients.get(broker_url)
    if app is not None:
        return app
    with _clients_lock:
        if broker_url not in _clients:
            from celery import Celery

            app = Celery("tuneyard-dispatch", set_as_current=False)
            app.conf.update(celery_config(broker_url))
            _clients[broker_url] = app
        return _clients[broker_url]


def connect_broker(settings: Settings | None = None, timeout: float = 2.0) -> str:
    """Build the client and open a producer connection now; "ok" or why not (never raises).

    A broker that is down at start-up is not fatal: submits then leave jobs to the
    reconciler until it is back.
    """
    try:
        app = _client(broker_url_for(settings))
        with app.producer_or_acquire() as producer:
            producer.connection.ensure_connection(max_retries=1, timeout=timeout)
        return "ok"
    except Exception as exc:  # any transport error: report it, keep serving
        log.warning("broker not reachable at start-up (%s); the reconciler will dispatch", exc)
        return f"unreachable at start-up: {type(exc).__name__}"


def enqueue_job(job_id: str, queue: str, settings: Settings | None = None) -> None:
    """Send `tuneyard.run_job(job_id)` to `queue`; raises if the broker cannot take it.

    The caller commits the job row first; if this raises, the job stays `queued` and the
    reconciler dispatches it again. Celery's producer pool keeps the connection open between
    sends.
    """
    app = _client(broker_url_for(settings))
    app.send_task(
        RUN_JOB_TASK, args=[str(job_id)], queue=queue, retry=True, retry_policy=_PUBLISH_RETRY
    )


def dispatch_export(export_id: str, queue: str, settings: Settings | None = None) -> bool:
    """Send `tuneyard.run_export(export_id)` to `queue` (the export's row is committed, with
    its dispatch mark) and note the send; False on refusal: the export stays `queued` and
    the reconciler sends it again after its grace window."""
    try:
        app = _client(broker_url_for(settings))
        app.send_task(
            RUN_EXPORT_TASK,
            args=[str(export_id)],
            queue=queue,
            retry=True,
            retry_policy=_PUBLISH_RETRY,
        )
    except Exception as exc:  # any transport error: the reconciler re-dispatches queued exports
        log.warning("export %s stays queued: the broker refused it (%s)", export_id, exc)
        return False
    try:
        with session_scope(settings) as session:
            mark_export_dispatched(session, export_id)
    except Exception as exc:  # the send happened; only the bookkeeping is lost
        log.warning("export %s: could not record the dispatch (%s)", export_id, exc)
    return True


def _sent(job_id: str, queue: str, settings: Settings | None) -> bool:
    """`enqueue_job`, with a refusal logged instead of raised: the job stays `queued` and
    the reconciler sends it again."""
    try:
        enqueue_job(job_id, queue, settings)
    except Exception as exc:  # any transport error: the reconciler re-dispatches queued jobs
        log.warning("job %s stays queued: the broker refused it (%s)", job_id, exc)
        return False
    return True


def dispatch_job(
    session: Session, job_id: str, queue: str, settings: Settings | None = None
) -> bool:
    """Send a committed queued job to the broker and record the dispatch; False on refusal.

    A refused send leaves the job `queued` with no `dispatched_at`: the reconciler sends it
    again. Recording the dispatch is a convenience (at worst the reconciler sends the id
    once more), so its failure is logged, not raised.
    """
    if not _sent(job_id, queue, settings):
        return False
    try:
        mark_dispatched(session, job_id)
        session.commit()
    except Exception as exc:  # the send happened; only the bookkeeping is lost
        session.rollback()
        log.warning("job %s: could not record the dispatch (%s)", job_id, exc)
    return True


def dispatch_new_job(session: Session, job: Job, settings: Settings | None = None) -> bool:
    """Send a job committed with its dispatch mark (`create_job(..., dispatching=True)`);
    False on refusal. A refusal takes the mark back, so the job waits `queued` with no
    `dispatched_at` and the reconciler sends it after its grace window (as it does for a
    process that died between the commit and the send, or when taking it back fails)."""
    if _sent(job.id, job.queue, settings):
        return True
    try:
        job.dispatched_at = None
        session.commit()
    except Exception as exc:  # the reconciler's grace window covers this too
        session.rollback()
        log.warning("job %s: could not take back its dispatch mark (%s)", job.id, exc)
    return False


def broker_reachable(settings: Settings | None = None, timeout: float = 2.0) -> bool:
    """True when a connection to the broker can be opened (for the API's /readyz)."""
    app = _client(broker_url_for(settings))
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=timeout)
        return True
    except Exception:  # any transport error means "not ready"; the reason is not needed
        return False


def queue_lengths(queues: Iterable[str], settings: Settings | None = None) -> dict[str, int] | None:
    """Messages waiting in each queue (for /metrics); None when the broker cannot be read."""
    app = _client(broker_url_for(settings))
    try:
        with app.connection_for_read() as conn:
            conn.ensure_connection(max_retries=1, timeout=2.0)
            channel = conn.default_channel
            return {
                name: channel.queue_declare(queue=name, passive=False).message_count
                for name in sorted(set(queues))
            }
    except Exception:  # broker down: /readyz reports it; /metrics keeps answering
        return None


def queued_job_ids(queues: Iterable[str], settings: Settings | None = None) -> set[str] | None:
    """Job ids whose messages wait in `queues`; None when the broker cannot be listed.

    Only Redis can be listed without consuming messages (kombu keeps one list per queue);
    for other transports the answer is None and the caller must assume nothing.
    """
    settings = settings or get_settings()
    url = settings.broker_url or ""
    if not url.startswith(("redis://", "rediss://")):
        return None
    import redis

    client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    try:
        return {
            job_id
            for queue in set(queues)
            for raw in client.lrange(queue, 0, -1)
            if (job_id := _job_id_of(raw)) is not None
        }
    except redis.RedisError:
        return None
    finally:
        client.close()


def _job_id_of(raw: bytes) -> str | None:
    """The job id in one kombu Redis message (JSON envelope, base64 JSON body `[[id], ...]`)."""
    try:
        message = json.loads(raw)
        body = json.loads(base64.b64decode(message["body"]))
        return str(body[0][0])
    except (ValueError, KeyError, IndexError, TypeError):
        return None
