"""The worker's Celery app: broker from settings, one task module, heartbeat on start.

`celery -A worker.celery_app worker -Q cpu --pool threads` (or `tuneyard worker`) runs it.
Messages are acknowledged before the task runs (`acks_late=False`) and a busy worker takes
no more messages (prefetch 1; on Redis `worker_disable_prefetch`), because the database
lease, not the broker, owns a running job. Logs are JSON lines (`jobs.store.log_context`;
TUNEYARD_LOG_FORMAT=text for plain text).
"""

from __future__ import annotations

import logging

from celery import Celery
from celery.signals import setup_logging, worker_ready, worker_shutdown

from jobs.broker import broker_url_for, celery_config

_broker = broker_url_for()
app = Celery("tuneyard")
app.conf.update(celery_config(_broker))
app.conf.worker_disable_prefetch = _broker.startswith("redis")
app.conf.worker_pool = "threads"
app.conf.imports = ["worker.tasks", "worker.export_task"]


@setup_logging.connect
def _json_logs(loglevel: int | str | None = None, **_: object) -> None:
    """JSON lines (request_id/job_id/attempt/worker when bound) instead of Celery's text."""
    from jobs.store.log_context import configure_json_logging

    configure_json_logging(loglevel or logging.INFO)


@worker_ready.connect
def _start_heartbeat(**_: object) -> None:
    from worker.state import worker_state

    state = worker_state()
    logging.getLogger("tuneyard.worker").info("worker %s ready: %s", state.name, state.resources())
    state.start_heartbeat()


@worker_shutdown.connect
def _stop_heartbeat(**_: object) -> None:
    from worker.state import worker_state

    worker_state().stop_heartbeat()
