"""Server-side commands: `tuneyard migrate`, `tuneyard api`, `tuneyard keys create|revoke`.

`migrate` runs Alembic's `upgrade head` against TUNEYARD_DATABASE_URL from any working
directory (optionally waiting for the database first, as the prestart step does). `api`
serves `api.main:app` with uvicorn, with the options of `api.server` (request headers
read within `TUNEYARD_HEADER_TIMEOUT_SECONDS`, no query strings in the access log);
`--workers N` runs N processes (with a shared Prometheus multiprocess directory), and
`--no-access-log` silences the per-request lines (`tuneyard up` passes it: a dashboard
polling every few seconds would bury the stack's own messages).
`keys create` prints a new API key once; only its hash is stored; its project's name holds
no control character (it is shown in every listing).
"""

from __future__ import annotations

import copy
from typing import Any

import typer

ACCESS_LOGGER = "tuneyard.access"  # `api.middleware.AccessLogMiddleware` writes to it
keys_app = typer.Typer(help="Create and revoke API keys.", no_args_is_help=True)


def migrate(
    revision: str = typer.Option("head", help="Alembic revision to upgrade to."),
    wait: float = typer.Option(0.0, help="Wait up to this many seconds for the database."),
) -> None:
    """Upgrade the database schema (alembic upgrade head)."""
    from jobs.store.engine import database_url, upgrade_database, wait_for_database
    from jobs.store.settings import get_settings

    settings = get_settings()
    where = database_url(settings).split("@")[-1]
    if wait > 0:
        try:
            wait_for_database(settings, wait)
        except TimeoutError as exc:
            typer.echo(f"error: {exc}; check TUNEYARD_DATABASE_URL", err=True)
            raise typer.Exit(1) from exc
    upgrade_database(settings, revision)
    typer.echo(f"database at {where} is at revision {revision}")


def api_log_config(access_log: bool) -> dict[str, Any] | None:
    """The logging config `tuneyard api` hands uvicorn (applied in every worker process):
    `jobs.store.log_context`'s, with the access logger held to warnings when it is off."""
    from uvicorn.config import LOGGING_CONFIG

    from jobs.store.log_context import uvicorn_log_config

    config = uvicorn_log_config()
    if access_log:
        return config
    config = config if config is not None else copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("loggers", {})[ACCESS_LOGGER] = {"level": "WARNING"}
    return config


def api(
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8000, help="Port to listen on."),
    workers: int = typer.Option(
        1,
        min=1,
        help="API processes: the way to use more cores (Prometheus counters are "
        "summed across them).",
    ),
    access_log: bool = typer.Option(
        True, "--access-log/--no-access-log", help="Log one line per request."
    ),
) -> None:
    """Serve the HTTP API (and the dashboard) with uvicorn; logs are JSON lines."""
    import os
    import tempfile

    import uvicorn

    from api.server import uvicorn_options

    if workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # Before the processes start: each writes its counters there, a scrape sums them.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="tuneyard-prom-")
    uvicorn.run(
        "api.main:app",
        host=host,
        port=port,
        workers=workers,
        log_level="info",
        log_config=api_log_config(access_log),
        **uvicorn_options(),
    )


@keys_app.command("create")
def create_key(
    project: str = typer.Option(..., help="Project name (created if new)."),
    role: str = typer.Option(..., help="admin, submit or read."),
) -> None:
    """Create an API key and print it (shown once)."""
    from jobs.recipe.load.bounds import CONTROL_FIX, control_msg, unsafe_char
    from jobs.store.api_keys import check_role, create_api_key
    from jobs.store.engine import session_scope

    try:
        check_role(role)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    char = unsafe_char(project)
    if char is not None:
        typer.echo(f"error: --project {control_msg(char)}; {CONTROL_FIX}", err=True)
        raise typer.Exit(2)
    try:
        with session_scope() as session:
            key, raw = create_api_key(session, project, role)
            key_id = key.id
    except ValueError as exc:  # a new project's name it may not have
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(raw)
    typer.echo(f"key {key_id} ({role}) for project '{project}'; it is shown only once", err=True)


@keys_app.command("revoke")
def revoke_key(key_id: int = typer.Argument(..., help="The key's id.")) -> None:
    """Revoke an API key by id."""
    from jobs.store.api_keys import revoke_api_key
    from jobs.store.engine import session_scope

    with session_scope() as session:
        revoked = revoke_api_key(session, key_id)
    if not revoked:
        typer.echo(f"error: key {key_id} does not exist or is already revoked", err=True)
        raise typer.Exit(1)
    typer.echo(f"key {key_id} revoked")


def register(app: typer.Typer) -> None:
    app.command("migrate")(migrate)
    app.command("api")(api)
    app.add_typer(keys_app, name="keys")
