"""Optional OpenTelemetry tracing of API requests (`pip install tuneyard[otel]`,
`TUNEYARD_OTEL=on`).

Each HTTP request becomes a server span named `METHOD /route/template` carrying the
request id, the status code and, for job routes, the job id, so a trace joins the JSON log
lines of the same request. When `OTEL_EXPORTER_OTLP_ENDPOINT` is set and the SDK is
installed, spans are exported over OTLP/HTTP; otherwise whatever tracer provider the
process set up receives them (none: they cost nothing). Off, or without the package, the
API runs exactly as before.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("tuneyard.api")


def tracing_enabled() -> bool:
    return os.environ.get("TUNEYARD_OTEL", "off").lower() in {"1", "on", "true"}


def _configure_exporter() -> None:
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "tuneyard-api"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)


def install_tracing(app: FastAPI) -> bool:
    """Add the tracing middleware when enabled and importable; True when installed."""
    if not tracing_enabled():
        return False
    try:
        _configure_exporter()
        from opentelemetry import trace
    except ImportError as exc:
        log.warning(
            "TUNEYARD_OTEL=on but OpenTelemetry is not installed (%s); install tuneyard[otel]",
            exc.name,
        )
        return False
    app.add_middleware(TracingMiddleware, tracer=trace.get_tracer("tuneyard.api"))
    return True


class TracingMiddleware:
    """One server span per HTTP request."""

    def __init__(self, app: ASGIApp, tracer: Any) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from opentelemetry.trace import SpanKind

        with self.tracer.start_as_current_span(scope["method"], kind=SpanKind.SERVER) as span:

            async def traced_send(message: Message) -> None:
                if message["type"] == "http.response.start":
                    span.set_attribute("http.response.status_code", message["status"])
                await send(message)

            try:
                await self.app(scope, receive, traced_send)
            finally:
                route = getattr(scope.get("route"), "path_format", None) or "unmatched"
                span.update_name(f"{scope['method']} {route}")
                span.set_attribute("http.route", route)
                span.set_attribute(
                    "tuneyard.request_id", scope.get("state", {}).get("request_id", "")
                )
                job_id = (scope.get("path_params") or {}).get("job_id")
                if job_id:
                    span.set_attribute("tuneyard.job_id", str(job_id))
