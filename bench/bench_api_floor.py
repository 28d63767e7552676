"""The floor for `POST /v1/jobs`: a bare FastAPI app doing only what the contract needs.

Hash the bearer key and look it up, insert the job row and its `submitted` event in one
transaction, commit, and push the id to the broker with the same Celery client tuneyard
uses. No validation, no response model, no middleware. `bench_api_submit.py` runs it
beside `tuneyard api` on the same PostgreSQL and Redis, so the ratio between the two is
what tuneyard's own work costs. Served with `uvicorn bench_api_floor:app` and the
environment of `bench_api_submit.api_server` (TUNEYARD_DATABASE_URL, TUNEYARD_BROKER_URL).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy import create_engine, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from jobs.broker import connect_broker, enqueue_job  # noqa: E402
from jobs.store.engine import normalize_url  # noqa: E402
from jobs.store.settings import get_settings  # noqa: E402

# One pooled connection per threadpool thread (anyio's default: 40), none opened per request.
engine = create_engine(
    normalize_url(os.environ["TUNEYARD_DATABASE_URL"]), pool_size=40, max_overflow=10
)
settings = get_settings()
app = FastAPI()
KEY = text("SELECT k.project_id FROM api_keys k WHERE k.key_hash = :h AND k.revoked_at IS NULL")
JOB = text(
    "INSERT INTO jobs (id, project_id, name, status, spec, recipe, plan, resources, queue, "
    "priority, labels, attempt, max_attempts, dispatched_at, created_at, updated_at) VALUES "
    "(:id, :p, :name, 'queued', CAST(:spec AS jsonb), CAST(:spec AS jsonb), '{}', '{}', 'cpu', "
    "0, '{}', 0, 3, :now, :now, :now)"
)
EVENT = text(
    "INSERT INTO job_events (job_id, attempt, kind, to_status, message, data, created_at) "
    "VALUES (:id, 0, 'submitted', 'queued', 'job submitted', '{}', :now)"
)


@app.on_event("startup")
def _connect() -> None:
    connect_broker(settings)


@app.post("/v1/jobs", status_code=201)
def create_job(request_body: dict, request: Request) -> JSONResponse:
    raw = request.headers.get("authorization", "").removeprefix("Bearer ")
    key_hash = hashlib.sha256(raw.encode()).hexdigest()
    job_id, now = str(uuid.uuid4()), datetime.now(UTC)
    with engine.begin() as conn:
        project = conn.execute(KEY, {"h": key_hash}).scalar()
        if project is None:
            return JSONResponse({"error": "unauthorized"}, 401)
        conn.execute(
            JOB,
            {
                "id": job_id,
                "p": project,
                "now": now,
                "name": str(request_body.get("name", "job"))[:200],
                "spec": json.dumps(request_body),
            },
        )
        conn.execute(EVENT, {"id": job_id, "now": now})
    enqueue_job(job_id, "cpu", settings)
    return JSONResponse({"id": job_id, "status": "queued"}, 201)


@app.get("/healthz")
def healthz() -> dict:
    return {"status": "ok"}
