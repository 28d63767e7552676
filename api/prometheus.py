"""Prometheus exposition at `/metrics`, written by hand (text format 0.0.4, no extra package).

A small ASGI middleware counts requests and observes their latency per method, route
template and status; at scrape time the database adds jobs by state and queued jobs per
queue (the database is the source of truth for what waits; the broker only carries ids).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class RequestStats:
    """Counters and latency histograms keyed by (method, route, status)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: dict[tuple[str, str, str], int] = defaultdict(int)
        self.sums: dict[tuple[str, str], float] = defaultdict(float)
        self.buckets: dict[tuple[str, str], list[int]] = {}

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        with self._lock:
            self.counts[(method, route, str(status))] += 1
            key = (method, route)
            counts = self.buckets.setdefault(key, [0] * (len(BUCKETS) + 1))
            for i, bound in enumerate(BUCKETS):
                if seconds <= bound:
                    counts[i] += 1
            counts[-1] += 1
            self.sums[key] += seconds

    def render(self) -> list[str]:
        with self._lock:
            lines = ["# HELP tuneyard_http_requests_total HTTP requests answered.",
                     "# TYPE tuneyard_http_requests_total counter"]  # fmt: skip
            for (method, route, status), n in sorted(self.counts.items()):
                lines.append(f"tuneyard_http_requests_total{_labels(method=method, route=route, status=status)} {n}")  # fmt: skip
            lines += ["# HELP tuneyard_http_request_duration_seconds Time to answer a request.",
                      "# TYPE tuneyard_http_request_duration_seconds histogram"]  # fmt: skip
            for (method, route), counts in sorted(self.buckets.items()):
                name = "tuneyard_http_request_duration_seconds"
                for bound, n in zip((*BUCKETS, "+Inf"), counts, strict=True):
                    lines.append(f"{name}_bucket{_labels(method=method, route=route, le=str(bound))} {n}")  # fmt: skip
                lines.append(f"{name}_sum{_labels(method=method, route=route)} {self.sums[(method, route)]:.6f}")  # fmt: skip
                lines.append(f"{name}_count{_labels(method=method, route=route)} {counts[-1]}")
            return lines


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def gauge(name: str, help_text: str, values: dict[str, float], label: str) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
    lines += [f"{name}{_labels(**{label: key})} {value}" for key, value in sorted(values.items())]
    return lines


class MetricsMiddleware:
    """Times every HTTP request; the route label is the template (`/v1/jobs/{job_id}`)."""

    def __init__(self, app: ASGIApp, stats: RequestStats):
        self.app = app
        self.stats = stats

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
            self.stats.observe(scope["method"], _route_of(scope), status[0],
                               time.perf_counter() - start)  # fmt: skip


def _route_of(scope: dict[str, Any]) -> str:
    route = scope.get("route")
    path = getattr(route, "path_format", None) or getattr(route, "path", None)
    return str(path) if path else "unmatched"
