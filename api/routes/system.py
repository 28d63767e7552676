"""Service endpoints: liveness, readiness, Prometheus metrics, the model registry, and
API-key creation for admins.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from sqlalchemy.orm import Session, sessionmaker

from api.deps import Admin, Reader, ReleasingRoute, SessionDep
from api.prometheus import gauge
from api.routes.jobs import AUTH_ERRORS, INVALID
from api.schemas import Health, KeyCreate, KeyCreated, ModelPublic, ModelsPublic
from jobs.broker import DEFAULT_QUEUES
from jobs.store import queries as store
from jobs.store.api_keys import create_api_key
from jobs.store.settings import Settings
from models.registry import registered_architectures

router = APIRouter(tags=["service"], route_class=ReleasingRoute)
log = logging.getLogger("tuneyard.api")


@router.get("/healthz", response_model=Health, summary="The process is up")
def healthz() -> Health:
    return Health(status="ok")


def _check_database(factory: sessionmaker[Session]) -> str:
    try:
        with factory() as session:
            store.ping(session)
        return "ok"
    except Exception as exc:  # any driver error means "not ready"
        return f"unreachable: {type(exc).__name__}"


def _is_redis(url: str | None) -> bool:
    return bool(url) and url.startswith(("redis://", "rediss://"))


def _redis(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)


def _check_broker(settings: Settings) -> str:
    url = settings.broker_url or ""
    if _is_redis(url):
        try:
            client = _redis(url)
            try:
                client.ping()
            finally:
                client.close()
            return "ok"
        except Exception as exc:  # connection refused, timeout, auth: all "not ready"
            return f"unreachable: {type(exc).__name__}"
    # the embedded SQLite broker (or another kombu transport): open a connection
    from jobs.broker import broker_reachable

    return "ok" if broker_reachable(settings) else "unreachable"


@router.get("/readyz", response_model=Health, summary="Database and broker are reachable",
            responses={503: {"model": Health, "description": "Something is unreachable."}})  # fmt: skip
def readyz(request: Request) -> Health | JSONResponse:
    factory = request.app.state.session_factory
    checks = {"database": _check_database(factory),
              "broker": _check_broker(request.app.state.settings)}  # fmt: skip
    ok = all(v == "ok" for v in checks.values())
    health = Health(status="ok" if ok else "unavailable", checks=checks)
    return health if ok else JSONResponse(health.model_dump(), status_code=503)


@router.get("/metrics", response_class=PlainTextResponse, summary="Prometheus metrics",
            responses={200: {"content": {"text/plain": {}}}})  # fmt: skip
def prometheus_metrics(request: Request) -> PlainTextResponse:
    lines = request.app.state.request_stats.render()
    try:
        with request.app.state.session_factory() as session:
            by_state = store.job_counts_by_status(session)
            queued = store.queued_by_queue(session)
        lines += gauge("tuneyard_jobs", "Jobs by state.", by_state, "state")
        lines += gauge("tuneyard_queue_depth", "Queued jobs waiting per queue.", queued, "queue")
        lines += ["# TYPE tuneyard_database_up gauge", "tuneyard_database_up 1"]
    except Exception:  # still expose request metrics when the database is down
        log.warning("/metrics: database unreachable", exc_info=True)
        queued = {}
        lines += ["# TYPE tuneyard_database_up gauge", "tuneyard_database_up 0"]
    lines += _broker_depth(request.app.state.settings, set(queued) | set(DEFAULT_QUEUES))
    return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")


def _broker_depth(settings: Settings, queues: set[str]) -> list[str]:
    """Messages waiting in Redis per queue (kombu keeps a list per queue name)."""
    if not _is_redis(settings.broker_url):
        return []
    try:
        client = _redis(settings.broker_url or "")
        try:
            depth = {q: client.llen(q) for q in sorted(queues)}
        finally:
            client.close()
    except Exception:  # the broker is down: /readyz says so; keep /metrics answering
        return []
    return gauge("tuneyard_broker_messages", "Job ids waiting in the broker per queue.",
                 depth, "queue")  # fmt: skip


@router.get("/v1/models", response_model=ModelsPublic, tags=["models"],
            summary="Registered architectures and what the trainer can run for them",
            responses={**AUTH_ERRORS})  # fmt: skip
def list_models(principal: Reader) -> ModelsPublic:
    data = [
        ModelPublic(architecture=e.architecture, family=e.family, tie_support=e.tie_support.value,
                    capabilities=dict(vars(e.capabilities)), notes=e.notes)
        for e in registered_architectures()
    ]  # fmt: skip
    return ModelsPublic(data=data)


@router.post("/v1/keys", response_model=KeyCreated, status_code=201, tags=["keys"],
             summary="Create an API key for the caller's project (admin)",
             responses={**AUTH_ERRORS, **INVALID})  # fmt: skip
def create_key(body: KeyCreate, principal: Admin, session: SessionDep) -> KeyCreated:
    """The key is in this answer only; the server keeps its hash."""
    key, raw = create_api_key(session, principal.project_name, body.role)
    session.commit()
    log.info("key %s (%s) created for project %s", key.prefix, key.role, principal.project_name)
    return KeyCreated(id=key.id, project=principal.project_name, role=key.role,
                      prefix=key.prefix, key=raw)  # fmt: skip
