"""Sending job ids to the broker: the only place the API and the reconciler touch Celery.

A message carries nothing but a job id; the database row says everything else, and the
worker's database lease (not the broker's delivery) decides who runs a job. The broker is
`TUNEYARD_BROKER_URL` (Redis in production), or, when unset, the embedded default: kombu's
SQLAlchemy transport on its own SQLite file `<TUNEYARD_HOME>/broker.db` (a separate file
from the jobs database so Alembic never sees kombu's tables and the two never contend for
SQLite's single writer lock). Celery is imported inside functions only (import rule).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from jobs.store.settings import Settings, get_settings

RUN_JOB_TASK = "tuneyard.run_job"
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
        # kombu's SQLAlchemy transport hands these to create_engine, so Redis only
        "broker_transport_options": (
            {"visibility_timeout": 3600} if broker_url.startswith("redis") else {}
        ),
        "task_default_queue": "cpu",
        "task_create_missing_queues": True,
        "worker_hijack_root_logger": False,
    }


@lru_cache(maxsize=4)
def _client(broker_url: str) -> Any:
    from celery import Celery

    app = Celery("tuneyard-dispatch", set_as_current=False)
    app.conf.update(celery_config(broker_url))
    return app


def enqueue_job(job_id: str, queue: str, settings: Settings | None = None) -> None:
    """Send `tuneyard.run_job(job_id)` to `queue`; raises if the broker cannot take it.

    The caller commits the job row first; if this raises, the job stays `queued` and the
    reconciler dispatches it again.
    """
    app = _client(broker_url_for(settings))
    app.send_task(
        RUN_JOB_TASK, args=[str(job_id)], queue=queue, retry=True, retry_policy=_PUBLISH_RETRY
    )


def broker_reachable(settings: Settings | None = None, timeout: float = 2.0) -> bool:
    """True when a connection to the broker can be opened (for the API's /readyz)."""
    app = _client(broker_url_for(settings))
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=timeout)
        return True
    except Exception:  # any transport error means "not ready"; the reason is not needed
        return False


def queue_lengths(
    queues: tuple[str, ...] = DEFAULT_QUEUES, settings: Settings | None = None
) -> dict[str, int]:
    """Messages waiting in each queue (for /metrics and the reconciler)."""
    app = _client(broker_url_for(settings))
    with app.connection_for_read() as conn:
        channel = conn.default_channel
        return {name: channel.queue_declare(queue=name).message_count for name in queues}
