"""Structured logs for the API, the worker and the scheduler: one JSON object per line.

`log_context(request_id=..., job_id=...)` binds fields for the code inside it (a context
variable, so it follows a request through its awaits and is copied into the threadpool
with it); `JsonFormatter` writes every record with the fields bound at that moment, plus
the record's own `extra=` fields among `CONTEXT_FIELDS`. `configure_json_logging()` makes
it the root handler's format (`TUNEYARD_LOG_FORMAT=text` keeps plain text). It lives
beside the store because every process that has a database session logs through it.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

CONTEXT_FIELDS = ("request_id", "job_id", "attempt", "worker")
_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "tuneyard_log_context", default=None
)


@contextlib.contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Bind `fields` (None values are dropped) to every log line written inside."""
    bound = {**(_context.get() or {}), **{k: v for k, v in fields.items() if v is not None}}
    token = _context.set(bound)
    try:
        yield
    finally:
        _context.reset(token)


def current_context() -> dict[str, Any]:
    return dict(_context.get() or {})


class JsonFormatter(logging.Formatter):
    """`{"ts", "level", "logger", "msg", request_id?, job_id?, attempt?, worker?, exc?}`."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **(_context.get() or {}),
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_json_logging(level: int | str = logging.INFO) -> None:
    """Root logging to stderr as JSON lines (unless TUNEYARD_LOG_FORMAT=text)."""
    if os.environ.get("TUNEYARD_LOG_FORMAT", "json").lower() == "text":
        logging.basicConfig(level=level)
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def uvicorn_log_config(level: str = "INFO") -> dict[str, Any] | None:
    """A `logging.config.dictConfig` for uvicorn (applied in every worker process): JSON
    lines on stderr for tuneyard's and uvicorn's loggers; None keeps uvicorn's plain text
    (TUNEYARD_LOG_FORMAT=text)."""
    if os.environ.get("TUNEYARD_LOG_FORMAT", "json").lower() == "text":
        return None
    handler = {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": "jobs.store.log_context.JsonFormatter"}},
        "handlers": {"stderr": handler},
        "root": {"handlers": ["stderr"], "level": level},
        "loggers": {
            name: {"handlers": [], "level": level, "propagate": True}
            for name in ("uvicorn", "uvicorn.error", "uvicorn.access")
        },
    }
