"""TUNEYARD_OTEL=on: every request is a server span named by its route, carrying the
request id and the job id; off, no middleware is installed."""

from __future__ import annotations

from fastapi.testclient import TestClient
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from api.main import create_app
from api.tracing import TracingMiddleware


def test_requests_become_spans(pg_stack, body, monkeypatch) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "get_tracer", lambda name, *a, **k: provider.get_tracer(name))
    monkeypatch.setenv("TUNEYARD_OTEL", "on")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    with TestClient(create_app(pg_stack.settings)) as client:
        job_id = client.post("/v1/jobs", json=body, headers=pg_stack.headers()).json()["id"]
        client.get(f"/v1/jobs/{job_id}", headers={**pg_stack.headers("read"),
                                                  "X-Request-ID": "trace-me"})  # fmt: skip
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert {"POST /v1/jobs", "GET /v1/jobs/{job_id}"} <= set(spans), set(spans)
    read = spans["GET /v1/jobs/{job_id}"]
    assert read.attributes["tuneyard.request_id"] == "trace-me"
    assert read.attributes["tuneyard.job_id"] == job_id
    assert read.attributes["http.response.status_code"] == 200


def test_tracing_is_off_by_default(pg_stack, monkeypatch) -> None:
    monkeypatch.delenv("TUNEYARD_OTEL", raising=False)
    app = create_app(pg_stack.settings)
    assert all(m.cls is not TracingMiddleware for m in app.user_middleware)
