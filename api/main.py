"""The FastAPI application: `create_app(settings)` builds it, `app` is the one uvicorn runs
(`tuneyard api` serves `api.main:app`).

The factory wires settings, the session factory, error handlers, Prometheus request
metrics, the request body's size limit (`api.limits`) and deadline, gzip for large
answers, the access log, the refusal of keys in URLs, security headers (`api.middleware`),
the routers, the API docs
from shipped assets (`api.docs`) and, where present, the dashboard
(`api.dashboard.mount_dashboard`).
With `TUNEYARD_AUTH=off` every request acts as admin of the `default` project; the app
logs that at start, loudly when the database is not the embedded SQLite default.
"""

from __future__ import annotations

import gc
import importlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio.to_thread
from fastapi import FastAPI
from fastapi.routing import APIRoute
from sqlalchemy.orm import sessionmaker
from starlette.middleware.gzip import GZipMiddleware

from api.docs import mount_docs
from api.errors import COMMON_ERRORS, install_error_handlers
from api.limits import BodyMiddleware, BodyRefused, answer_body_refused
from api.middleware import (
    AccessLogMiddleware,
    KeyInQueryMiddleware,
    RequestIdMiddleware,
    SecurityHeadersMiddleware,
    UnexpectedErrorMiddleware,
)
from api.prometheus import MetricsMiddleware
from api.routes import (
    artifacts,
    exports,
    jobs,
    projects,
    steps,
    system,
    telemetry,
    templates,
    webhooks,
)
from api.tracing import install_tracing
from jobs.broker import connect_broker
from jobs.store.capacity import CapacityCache
from jobs.store.engine import database_url, get_engine
from jobs.store.settings import Settings, get_settings

log = logging.getLogger("tuneyard.api")
GZIP_MIN_BYTES = 8 * 1024  # above one job's answer (~6 KB), below a page of two

DESCRIPTION = """Submit, validate and watch LLM fine-tuning jobs.

Authenticate with `Authorization: Bearer <key>` (`tuneyard keys create --project P --role R`).
Field errors answer 422 with `{"errors": [{"loc", "msg", "fix"}]}`; every other error answers
`{"error": {"code", "message", ...}}` (a 409 adds `current_status`). Every answer carries
`X-Request-ID` (the caller's, when it sent a plain token): quote it when reporting a problem.
Lists share one page shape: `data`, `has_more` and `next_cursor` (pass it back as `cursor`)."""


def operation_id(route: APIRoute) -> str:
    """The route function's name (`create_job`, `list_jobs`): what a generated client calls."""
    return route.name


def announce_auth(settings: Settings) -> None:
    if settings.auth_enabled:
        log.info("API keys required (TUNEYARD_AUTH=on)")
        return
    if database_url(settings).startswith("sqlite"):
        log.warning(
            "TUNEYARD_AUTH=off: no API key needed; every caller is admin of project "
            "'default' (embedded local default only)"
        )
    else:
        log.warning(
            "TUNEYARD_AUTH=off on a shared database (%s): anyone who reaches this "
            "port is admin; set TUNEYARD_AUTH=on",
            database_url(settings).split("@")[-1],
        )


def _mount_dashboard(app: FastAPI) -> None:
    try:
        dashboard = importlib.import_module("api.dashboard")
    except ModuleNotFoundError as exc:  # the dashboard is optional in a trimmed install
        if exc.name != "api.dashboard":
            raise
        return
    dashboard.mount_dashboard(app)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        announce_auth(settings)
        # Import and connect the broker client here, once, before any request thread can
        # race on its first import; /readyz reports what this found.
        app.state.broker_at_startup = connect_broker(settings)
        # Sync routes run in anyio's threadpool; past a few threads per core they only
        # queue on the GIL, each request's latency growing with every thread it shares the
        # GIL with. Waiting in the limiter's FIFO instead keeps the tail near the median.
        # As many database sessions as threads (`api.deps.get_session` says why).
        threads = max(1, settings.api_threads)
        anyio.to_thread.current_default_thread_limiter().total_tokens = threads
        app.state.session_slots = anyio.Semaphore(threads)
        # What start-up built (modules, routes, the broker client) lives as long as the
        # process: frozen out of the cyclic collector, so a full collection walks only what
        # requests made instead of ~100k long-lived objects.
        gc.freeze()
        try:
            yield
        finally:
            gc.unfreeze()

    app = FastAPI(
        title="tuneyard",
        version="0.1.0",
        description=DESCRIPTION,
        lifespan=lifespan,
        responses=COMMON_ERRORS,
        generate_unique_id_function=operation_id,
        docs_url=None,  # `api.docs` serves them, from assets shipped with the package
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.broker_at_startup = "not connected yet"
    app.state.session_factory = sessionmaker(bind=get_engine(settings), expire_on_commit=False)
    app.state.capacity = CapacityCache(
        settings.capacity_cache_seconds, settings.worker_live_seconds
    )
    install_error_handlers(app)
    app.add_exception_handler(BodyRefused, answer_body_refused)
    # Inside the metrics middleware, so a refused body still counts as a 413 (or 408).
    app.add_middleware(
        BodyMiddleware,
        max_bytes=settings.max_body_bytes,
        seconds=settings.body_timeout_seconds,
    )
    app.add_middleware(KeyInQueryMiddleware)
    # A job list is ~6 KB a job, polled every few seconds by the dashboard: JSON compresses
    # ~10x. One job (a submit's answer, a read) is sent as it is: compressing ~6 KB cost
    # each submit a sixth of the event loop's instructions (zlib's set-up per answer) to
    # save 3 KB on the wire. Level 6, zlib's default, costs half of level 9's CPU for nearly
    # the same size. Server-sent event streams are never compressed (Starlette excludes
    # text/event-stream).
    app.add_middleware(GZipMiddleware, minimum_size=GZIP_MIN_BYTES, compresslevel=6)
    app.add_middleware(UnexpectedErrorMiddleware)
    app.add_middleware(MetricsMiddleware)
    install_tracing(app)  # TUNEYARD_OTEL=on: inside the request id, which the span carries
    app.add_middleware(AccessLogMiddleware)
    app.add_middleware(SecurityHeadersMiddleware)
    app.add_middleware(RequestIdMiddleware)
    routers = (jobs, telemetry, steps, projects, webhooks, system)
    for module in routers:
        app.include_router(module.router)
    app.include_router(artifacts.router)
    app.include_router(exports.router)
    app.include_router(templates.router)
    mount_docs(app)
    _mount_dashboard(app)
    return app


app = create_app()
