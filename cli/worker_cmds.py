"""`tuneyard worker` and `tuneyard scheduler`: start a Celery worker, or the reconciler loop
and the webhook sender.

Both read `TUNEYARD_*` settings (database, broker; `TUNEYARD_WORKER_*` for timings). The
worker runs jobs in a thread pool (`--concurrency` jobs at once) so each job's supervisor
lives as long as its torchrun, which dies with the worker (parent-death signal).
"""

from __future__ import annotations

import logging
import os

import typer


def worker(
    queues: str = typer.Option("cpu", "--queues", "-Q", help="comma-separated: cpu, gpu-1, gpu-8"),
    name: str = typer.Option("", "--name", help="worker name (default: host-pid)"),
    concurrency: int = typer.Option(1, "--concurrency", "-c", min=1, help="jobs at once"),
    loglevel: str = typer.Option("INFO", "--loglevel"),
) -> None:
    """Run a worker that claims and runs jobs from the given queues."""
    os.environ["TUNEYARD_WORKER_QUEUES"] = queues
    if name:
        os.environ["TUNEYARD_WORKER_NAME"] = name
    from worker.celery_app import app as celery_app
    from worker.state import worker_state

    state = worker_state()
    argv = [
        "worker",
        "-Q",
        queues,
        "-c",
        str(concurrency),
        "--pool",
        "threads",
        "-n",
        f"{state.name}@%h",
        "--loglevel",
        loglevel,
        "--without-mingle",
        "--without-gossip",
        "--without-heartbeat",
    ]
    celery_app.worker_main(argv)


def scheduler(loglevel: str = typer.Option("INFO", "--loglevel")) -> None:
    """Run the reconciler (expired leases, lost queue messages, stale workers) and the
    webhook sender (the outbox's deliveries, in a thread beside it)."""
    logging.basicConfig(level=loglevel, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from jobs.store.log_context import configure_json_logging
    from worker.reconciler import run_forever
    from worker.webhook_sender import start_webhook_sender

    configure_json_logging(loglevel)  # before the sender's thread logs its first line
    start_webhook_sender()
    run_forever()


def health(
    role: str = typer.Argument(..., help="worker or scheduler"),
    ready: bool = typer.Option(
        False, "--ready", help="also require the last pass to reach the database"
    ),
    max_age: float = typer.Option(
        60.0, "--max-age", min=1.0, help="seconds since the loop last ran"
    ),
) -> None:
    """Probe a worker or scheduler in this container (exit 0 healthy, 1 not): for Kubernetes
    liveness (`tuneyard health worker`) and readiness (`--ready`) probes."""
    from worker.health import ROLES, check

    if role not in ROLES:
        typer.echo(f"role must be one of {', '.join(ROLES)}, not {role!r}", err=True)
        raise typer.Exit(2)
    verdict = check(role, max_age, ready=ready)
    typer.echo(verdict.reason, err=not verdict.healthy)
    raise typer.Exit(0 if verdict.healthy else 1)


def register(app: typer.Typer) -> None:
    app.command("worker")(worker)
    app.command("scheduler")(scheduler)
    app.command("health")(health)
