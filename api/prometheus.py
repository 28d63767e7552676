"""Prometheus metrics with `prometheus_client`, correct across `tuneyard api --workers N`.

Request counts and latencies are process counters. With several API processes the CLI sets
`PROMETHEUS_MULTIPROC_DIR` before the workers start; every process then writes its
counters to files there and a scrape of any one of them sums all of them (prometheus_client's
multiprocess mode), so a scrape no longer jumps between one process's numbers and another's.

At scrape time the database adds gauges that hold no project's data: queued jobs per queue,
workers by status, and the stale messages the workers dropped, by reason. Job counts by state
are per project, so `/metrics` shows them only to an admin key, and only for its project
(`tuneyard_project_jobs{project, state}`).
"""

from __future__ import annotations

import os
import time
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import REGISTRY
from starlette.types import ASGIApp, Message, Receive, Scope, Send

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
REQUESTS = Counter(
    "tuneyard_http_requests", "HTTP requests answered.", ["method", "route", "status"]
)
LATENCY = Histogram(
    "tuneyard_http_request_duration_seconds",
    "Time to answer a request.",
    ["method", "route"],
    buckets=BUCKETS,
)


def request_metrics_text() -> bytes:
    """The request counters of this process, or of every API process in multiprocess mode."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry)
    return generate_latest(REGISTRY)


CONTENT_TYPE = CONTENT_TYPE_LATEST


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def gauge(name: str, help_text: str, values: dict[Any, float], *labels: str) -> list[str]:
    """Exposition lines of one gauge; keys are a label value, or a tuple of them."""
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
    for key, value in sorted(values.items()):
        parts = key if isinstance(key, tuple) else (key,)
        pairs = ",".join(f'{k}="{_escape(str(v))}"' for k, v in zip(labels, parts, strict=True))
        lines.append(f"{name}{{{pairs}}} {value}")
    return lines


class MetricsMiddleware:
    """Times every HTTP request; the route label is the template (`/v1/jobs/{job_id}`)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), [500]

        async def send_and_record(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            route, method = _route_of(scope), scope["method"]
            REQUESTS.labels(method, route, str(status[0])).inc()
            LATENCY.labels(method, route).observe(time.perf_counter() - start)


def _route_of(scope: dict[str, Any]) -> str:
    route = scope.get("route")
    path = getattr(route, "path_format", None) or getattr(route, "path", None)
    return str(path) if path else "unmatched"
