"""Service endpoints: liveness, readiness, Prometheus metrics, the model registry, and
API-key creation for admins.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from sqlalchemy.orm import Session, sessionmaker

from api.deps import Admin, Credentials, Reader, SessionDep, get_principal
from api.errors import ApiError
from api.prometheus import CONTENT_TYPE, gauge, request_metrics_text
from api.routes.jobs import AUTH_ERRORS, INVALID
from api.schemas import Health, KeyCreate, KeyCreated, ModelPublic, ModelsPublic
from jobs.broker import DEFAULT_QUEUES, broker_reachable, connect_broker, queue_lengths
from jobs.store import queries as store
from jobs.store.api_keys import create_api_key
from jobs.store.settings import Settings
from models.registry import registered_architectures

router = APIRouter(tags=["service"])
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


@router.get(
    "/readyz",
    response_model=Health,
    summary="Database and broker are reachable",
    responses={503: {"model": Health, "description": "Something is unreachable."}},
)
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


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    summary="Prometheus metrics",
    responses={200: {"content": {"text/plain": {}}}},
)
def prometheus_metrics(request: Request, session: SessionDep, creds: Credentials) -> Response:
    """Open: request counters, queue depth, workers, dropped messages, no project's data.
    With an admin key: also that project's jobs by state (`tuneyard_project_jobs`)."""
    lines: list[str] = []
    try:
        queued = store.queued_by_queue(session)
        workers, dropped = store.worker_gauges(session)
        lines += gauge("tuneyard_queue_depth", "Queued jobs waiting per queue.", queued, "queue")
        lines += gauge("tuneyard_workers", "Workers by status.", workers, "status")
        lines += gauge(
            "tuneyard_worker_dropped_messages",
            "Stale or malformed messages the live workers dropped, by reason.",
            dropped,
            "reason",
        )
        lines += _project_jobs(request, session, creds)
        lines += ["# TYPE tuneyard_database_up gauge", "tuneyard_database_up 1"]
    except Exception:  # still expose request metrics when the database is down
        log.warning("/metrics: database unreachable", exc_info=True)
        queued = {}
        lines += ["# TYPE tuneyard_database_up gauge", "tuneyard_database_up 0"]
    session.close()
    lines += _broker_depth(request.app.state.settings, set(queued) | set(DEFAULT_QUEUES))
    body = request_metrics_text() + ("\n".join(lines) + "\n").encode()
    return Response(body, media_type=CONTENT_TYPE)


def _project_jobs(request: Request, session: Session, creds: Any) -> list[str]:
    """The caller's project's jobs by state, for an admin key (or auth off); else nothing."""
    settings = request.app.state.settings
    if creds is None and settings.auth_enabled:
        return []
    try:
        principal = get_principal(settings, session, creds)
    except ApiError:
        return []
    if not principal.can("admin"):
        return []
    counts = store.job_counts_by_status(session, principal.project_id)
    values = {(principal.project_name, state): n for state, n in counts.items()}
    return gauge(
        "tuneyard_project_jobs",
        "This project's jobs by state (admin key only).",
        values,
        "project",
        "state",
    )


def _broker_depth(settings: Settings, queues: set[str]) -> list[str]:
    """Messages waiting in the broker per queue; nothing when the broker cannot be read."""
    depth = queue_lengths(queues, settings)
    if depth is None:
        return []
    return gauge(
        "tuneyard_broker_messages", "Job ids waiting in the broker per queue.", depth, "queue"
    )


@router.get(
    "/v1/models",
    response_model=ModelsPublic,
    tags=["models"],
    summary="Registered architectures and what the trainer can run for them",
    responses={**AUTH_ERRORS},
)
def list_models(principal: Reader) -> ModelsPublic:
    data = [
        ModelPublic(
            architecture=e.architecture,
            family=e.family,
            tie_support=e.tie_support.value,
            capabilities=dict(vars(e.capabilities)),
            notes=e.notes,
        )
        for e in registered_architectures()
    ]
    return ModelsPublic(data=data)


@router.post(
    "/v1/keys",
    response_model=KeyCreated,
    status_code=201,
    tags=["keys"],
    summary="Create an API key for the caller's project (admin)",
    responses={**AUTH_ERRORS, **INVALID},
)
def create_key(body: KeyCreate, principal: Admin, session: SessionDep) -> KeyCreated:
    """The key is in this answer only; the server keeps its hash."""
    key, raw = create_api_key(session, principal.project_name, body.role)
    session.commit()
    log.info("key %s (%s) created for project %s", key.prefix, key.role, principal.project_name)
    return KeyCreated(
        id=key.id, project=principal.project_name, role=key.role, prefix=key.prefix, key=raw
    )
