"""Service endpoints: liveness, readiness, Prometheus metrics, the model registry, and
API-key creation for admins.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from sqlalchemy.orm import Session, sessionmaker

from api.deps import Admin, Reader, ReleasingRoute, SessionDep
from api.prometheus import gauge
from api.routes.jobs import AUTH_ERRORS, INVALID
from api.schemas import Health, KeyCreate, KeyCreated, ModelPublic, ModelsPublic
from jobs.broker import DEFAULT_QUEUES, broker_reachable, connect_broker, queue_lengths
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


def _check_broker(settings: Settings) -> str:
    return "ok" if broker_reachable(settings) else "unreachable"


@router.get("/readyz", response_model=Health, summary="Database and broker are reachable",
            responses={503: {"model": Health, "description": "Something is unreachable."}})  # fmt: skip
def readyz(request: Request) -> Health | JSONResponse:
    """`database` and `broker` are live checks and decide the status; `broker_client` says
    whether the submit path's broker client was imported and connected at start-up (a live
    check that succeeds after a failed start connects it now)."""
    factory, state = request.app.state.session_factory, request.app.state
    checks = {"database": _check_database(factory), "broker": _check_broker(state.settings)}
    if checks["broker"] == "ok" and state.broker_at_startup != "ok":
        state.broker_at_startup = connect_broker(state.settings)
    ok = all(v == "ok" for v in checks.values())
    checks["broker_client"] = state.broker_at_startup
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
    """Messages waiting in the broker per queue; nothing when the broker cannot be read."""
    depth = queue_lengths(queues, settings)
    if depth is None:
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
