"""Client commands: talk to a tuneyard server over HTTP (`submit`, `jobs`, `watch`, `wait`, ...).

Every command here is a thin call through `cli.http_client` to the `/v1` API; the server is
selected by the global `tuneyard --server URL` (or `TUNEYARD_URL`), the key by the global
`--api-key` (or `TUNEYARD_API_KEY`); a command's own `--server` / `--api-key` still wins. A
job is named by its full id or a unique prefix of at least 8 characters (the server resolves
it within the caller's project). Commands take `--json` for scripts, and with it a refusal
is JSON on stdout too (`cli.job_views.error_json`). Exit codes are stable so CI can branch on
them (`CliExitCode`): a job that succeeded exits 0, failed 1, cancelled 3; a refused request
(bad recipe, unknown or ambiguous job, bad key, an action the job's state does not allow)
exits 2 and prints the server's reason.
`cli.main` imports this module at every start, so rich and httpx are imported only inside
the commands: `tuneyard validate` never pays for them. Whatever the server sent is printed
through `cli.terminal` (`printable`, `markup_safe`): a job name holding ESC shows as `\x1b`.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.http_client import DEFAULT_URL, ClientError, CliExitCode, TuneyardClient, items_of
from cli.job_views import error_json, status_lines, summary_lines
from cli.terminal import markup_safe, printable
from jobs.recipe.load.overrides import override_texts
from jobs.store.status import SETTLED, TERMINAL, JobStatus

if TYPE_CHECKING:
    from rich.console import Console

STATE_EXIT = {
    JobStatus.SUCCEEDED: CliExitCode.SUCCEEDED,
    JobStatus.FAILED: CliExitCode.FAILED,
    JobStatus.CANCELLED: CliExitCode.CANCELLED,
    JobStatus.PAUSED: CliExitCode.PAUSED,
}


@functools.cache
def console(stderr: bool = False) -> Console:
    """The rich console for stdout (or stderr), made on first use."""
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def report_error(error: ClientError, as_json: bool = False) -> CliExitCode:
    """Print a refused or failed request the way the server explained it (with `as_json`:
    as one JSON document on stdout); its exit code."""
    if as_json:
        print_json(error_json(error))
        return error.exit_code
    err = console(stderr=True)
    err.print(f"[red]error:[/red] {markup_safe(error)}")
    if error.current_status:
        err.print(f"  current state: [bold]{markup_safe(error.current_status)}[/bold]")
    candidates = error.detail.get("candidates")
    if isinstance(candidates, list):
        err.print("  candidates: " + ", ".join(markup_safe(c) for c in candidates))
    for item in error.errors:
        loc = item.get("loc", "")
        loc = ".".join(str(p) for p in loc) if isinstance(loc, list) else str(loc)
        fix = f"  [dim]fix: {markup_safe(item['fix'])}[/dim]" if item.get("fix") else ""
        err.print(f"  [bold]{markup_safe(loc)}[/bold]: {markup_safe(item.get('msg', ''))}{fix}")
    return error.exit_code


def exits_on_client_error(command: Callable[..., None]) -> Callable[..., None]:
    """Wrap a command so a ClientError prints the server's reason and exits with its code
    (as JSON on stdout when the command was given `--json`)."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            command(*args, **kwargs)
        except ClientError as exc:
            code = report_error(exc, as_json=bool(kwargs.get("as_json")))
            raise typer.Exit(int(code)) from None

    return run


# ----------------------------------------------------------------------------- options
# The global options (`tuneyard --server URL --api-key K <command>`) read the environment;
# a command's own options do not, so `tuneyard --server A status X` is not overridden by
# TUNEYARD_URL through the command's option.
GlobalServerOpt = Annotated[
    str, typer.Option("--server", envvar="TUNEYARD_URL", help="tuneyard server URL.")
]
GlobalKeyOpt = Annotated[
    str | None,
    typer.Option("--api-key", envvar="TUNEYARD_API_KEY", help="API key.", show_default=False),
]
ServerOpt = Annotated[
    str | None,
    typer.Option("--server", help="Server URL (default: the global --server).", show_default=False),
]
KeyOpt = Annotated[
    str | None,
    typer.Option("--api-key", help="API key (default: the global --api-key).", show_default=False),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print the raw JSON answer (and errors) on stdout.")
]
JobArg = Annotated[str, typer.Argument(help="Job id, or a unique prefix of 8+ characters.")]


def global_options(
    ctx: typer.Context, server: GlobalServerOpt = DEFAULT_URL, api_key: GlobalKeyOpt = None
) -> None:
    """tuneyard: validate, queue and run LLM fine-tuning jobs."""
    ctx.obj = {"server": server, "api_key": api_key}


def connect(ctx: typer.Context, server: str | None, api_key: str | None) -> TuneyardClient:
    """The client for a command: its own --server / --api-key, else the global ones."""
    # Without the global options' callback (a command mounted elsewhere): the environment.
    given = ctx.find_root().obj or {
        "server": os.environ.get("TUNEYARD_URL"),
        "api_key": os.environ.get("TUNEYARD_API_KEY"),
    }
    return TuneyardClient(
        server or given.get("server") or DEFAULT_URL, api_key or given.get("api_key")
    )


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def override_strings(tokens: list[str]) -> list[str]:
    """CLI override tokens as the API's `a.b=v` strings; malformed ones refused before any
    request, with the validator's own errors (the grammar is `jobs.recipe.load.overrides`')."""
    texts, errors = override_texts(tokens)
    if errors:
        raise ClientError("invalid overrides:", CliExitCode.REFUSED, [e.to_dict() for e in errors])
    return texts


def job_progress(job: dict) -> tuple[int | None, int | None]:
    """(latest step, max_steps) from the job's summary."""
    return (job.get("latest_metrics") or {}).get("step"), job.get("max_steps")


def describe_end(job: dict) -> str:
    status, job_id = printable(job.get("status", "?")), printable(job["id"])
    if status == JobStatus.FAILED:
        code = printable(job.get("error_code") or "error")
        return (
            f"job {job_id} failed ({code}): {printable(job.get('error_message') or 'no message')}"
        )
    if status == JobStatus.PAUSED:
        return f"job {job_id} is paused; resume it with `tuneyard resume {job_id}`"
    return f"job {job_id} {status}"


def finish(job: dict, as_json: bool = False, summary: list[str] | None = None) -> None:
    """Print how the job ended (and `summary`, its lines from `summary_lines`) and exit
    with its code."""
    code = STATE_EXIT.get(job["status"], CliExitCode.FAILED)
    if as_json:
        print_json(job)
    else:
        out = console(stderr=code != CliExitCode.SUCCEEDED)
        out.print("\n".join([describe_end(job), *(summary or [])]), markup=False)
    raise typer.Exit(int(code))


def watch_and_finish(
    client: TuneyardClient, job_id: str, poll: float, timeout: float | None, as_json: bool
) -> None:
    """`watch` and `submit --wait`: the progress line until the job ends, then its summary
    (state, steps, final loss, last checkpoint), exiting with the job's code."""
    job = watch_job(client, job_id, poll, console(), as_json, timeout=timeout)
    summary = None if as_json else summary_lines(job, client.checkpoints(job["id"]))
    finish(job, as_json, summary)


class ProgressLine:
    """One progress display: a live rich bar on a terminal, plain lines everywhere else."""

    def __init__(self, out: Console, job_id: str):
        self.out, self.job_id, self.last_text = out, job_id, ""
        self.start: tuple[float, int] | None = None
        self.live = None
        if out.is_terminal:
            from rich.progress import BarColumn, Progress, TextColumn

            self.live = Progress(
                TextColumn("{task.description}", markup=False),
                BarColumn(),
                TextColumn("{task.fields[info]}", markup=False),
                console=out,
            )
            self.task = self.live.add_task(printable(job_id[:8]), total=None, info="")

    def __enter__(self) -> ProgressLine:
        if self.live:
            self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self.live.stop()

    def eta(self, step: int, max_steps: int | None) -> str:
        """Time left at the step rate seen since the first step this watch saw run."""
        now = time.monotonic()
        if self.start is None or step < self.start[1]:
            self.start = (now, step) if step > 0 else None
            return "-"
        done, elapsed = step - self.start[1], now - self.start[0]
        if not max_steps or done <= 0 or elapsed <= 0:
            return "-"
        seconds = int((max_steps - step) * elapsed / done)
        return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"

    def update(self, job: dict, record: dict | None) -> None:
        step = int((record or {}).get("step") or 0)
        max_steps = job_progress(job)[1]
        parts = [printable(job["status"]), f"step {step}/{printable(max_steps or '?')}"]
        if record and record.get("loss") is not None:
            parts.append(f"loss {record['loss']:.4f}")
        if record and record.get("tps") is not None:
            parts.append(f"tps {record['tps']:.0f}")
        text = "  ".join(parts)
        eta = f"eta {self.eta(step, max_steps)}" if job["status"] == JobStatus.RUNNING else ""
        if self.live:
            self.live.update(self.task, completed=step, total=max_steps, info=f"{text}  {eta}")
        elif text != self.last_text:  # on a pipe: one line per new step or state
            self.out.print(f"{printable(self.job_id[:8])}  {text}  {eta}".rstrip(), markup=False)
        self.last_text = text


def watch_job(
    client: TuneyardClient,
    job_id: str,
    poll: float,
    out: Console,
    as_json: bool,
    timeout: float | None = None,
) -> dict:
    """Follow a job's train metrics until it ends or pauses; returns the final job. With
    `as_json` each new record is a JSON line on stdout (the progress goes to stderr); after
    `timeout` seconds, a ClientError(TIMED_OUT)."""
    cursor, latest = None, None
    deadline = time.monotonic() + timeout if timeout else None
    job_id = client.job(job_id)["id"]  # a prefix resolved once: every poll names the job
    with ProgressLine(console(stderr=True) if as_json else out, job_id) as line:
        while True:
            job = client.job(job_id)
            # First the latest step only (downsampling keeps it), then every new record.
            page = client.metrics(job_id, cursor, max_points=2 if cursor is None else None)
            cursor = page.get("next_cursor") or cursor
            for record in items_of(page):
                latest = record
                if as_json:
                    sys.stdout.write(json.dumps(record, default=str) + "\n")
            line.update(job, latest)
            if job["status"] in SETTLED:
                return job
            if deadline and time.monotonic() > deadline:
                message = f"job {job_id} still {job['status']} after {timeout:g}s"
                raise ClientError(message, CliExitCode.TIMED_OUT)
            time.sleep(poll)


def follow_logs(client: TuneyardClient, job_id: str, follow: bool, as_json: bool) -> None:
    """Print every log line, page by page; with `follow`, poll for more until the job ends."""
    cursor, ended = None, False
    while True:
        body = client.logs(job_id, cursor)
        for line in items_of(body):
            text = json.dumps(line) if as_json else printable(line["text"], keep="\t")
            sys.stdout.write(text + "\n")
        sys.stdout.flush()
        cursor = body.get("next_cursor") or cursor
        if body.get("has_more"):
            continue  # a full page: more is waiting already
        if ended or not follow:
            return
        ended = client.job(job_id)["status"] in TERMINAL  # then one more page: the last lines
        if not ended:
            time.sleep(1.0)


# ----------------------------------------------------------------------------- commands
@exits_on_client_error
def submit(
    ctx: typer.Context,
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML or JSON file.", exists=True)],
    overrides: Annotated[
        list[str] | None,
        typer.Argument(help="Overrides: optimizer.lr=1e-4, --optimizer.lr 1e-4, a bare --flag"),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Job name (default: file name).")] = None,
    nproc_per_node: Annotated[int, typer.Option(help="Processes (GPUs) per node.")] = 1,
    nnodes: Annotated[int, typer.Option(help="Nodes.")] = 1,
    accelerator: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    priority: Annotated[int, typer.Option(help="Higher runs first.")] = 0,
    max_attempts: Annotated[int | None, typer.Option(help="Attempts before failing.")] = None,
    label: Annotated[list[str] | None, typer.Option(help="key=value label (repeat).")] = None,
    idempotency_key: Annotated[str | None, typer.Option(help="Idempotency-Key header.")] = None,
    wait: Annotated[
        bool,
        typer.Option("--wait", help="Show progress until the job ends; exit with its code."),
    ] = False,
    timeout: Annotated[float | None, typer.Option(help="With --wait: give up after S s.")] = None,
    server: ServerOpt = None,
    api_key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Submit a recipe as a job (validated by the server before anything is stored)."""
    override_list = override_strings([*(overrides or []), *ctx.args])
    body: dict[str, Any] = {
        "name": name or recipe.stem,
        "recipe_yaml": recipe.read_text(),
        "overrides": override_list,
        "resources": {
            "nnodes": nnodes,
            "nproc_per_node": nproc_per_node,
            "accelerator": accelerator,
        },
        "priority": priority,
        "labels": dict(item.split("=", 1) for item in label or [] if "=" in item),
    }
    if max_attempts is not None:
        body["max_attempts"] = max_attempts
    client = connect(ctx, server, api_key)
    job = client.submit(body, idempotency_key)
    if as_json and not wait:
        print_json(job)
    elif not as_json:
        job_id = markup_safe(job["id"])
        console().print(f"submitted job [bold]{job_id}[/bold] ({markup_safe(job['status'])})")
        console().print(f"  dashboard: {client.server}/jobs/{printable(job['id'])}", markup=False)
    if wait:
        watch_and_finish(client, job["id"], 1.0, timeout, as_json)


@exits_on_client_error
def jobs(
    ctx: typer.Context,
    status: Annotated[str | None, typer.Option(help="Only jobs in this state.")] = None,
    label: Annotated[str | None, typer.Option(help="Only jobs with this key=value label.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many jobs.")] = 20,
    server: ServerOpt = None,
    api_key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List jobs, newest first."""
    from rich.table import Table

    rows = connect(ctx, server, api_key).jobs(status=status, label=label, limit=limit)
    if as_json:
        return print_json(rows)
    table = Table("id", "name", "state", "progress", "loss", "created", box=None)
    for job in rows:
        step, max_steps = job_progress(job)
        loss = (job.get("latest_metrics") or {}).get("loss")
        cells = (
            job["id"],
            job.get("name", ""),
            job["status"],
            f"{step or 0}/{max_steps or '?'}",
            f"{loss:.4f}" if isinstance(loss, int | float) else "",
            str(job.get("created_at", ""))[:19],
        )
        table.add_row(*(markup_safe(cell) for cell in cells))
    console().print(table if rows else "no jobs")


@exits_on_client_error
def status(
    ctx: typer.Context,
    job_id: JobArg,
    server: ServerOpt = None,
    api_key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show one job: state, attempts, progress, error, the plan's key numbers, last metrics."""
    job = connect(ctx, server, api_key).job(job_id)
    if as_json:
        return print_json(job)
    console().print("\n".join(status_lines(job)), markup=False)


def _act(verb: str, past: str) -> Callable[..., None]:
    @exits_on_client_error
    def command(
        ctx: typer.Context,
        job_id: JobArg,
        server: ServerOpt = None,
        api_key: KeyOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        job = connect(ctx, server, api_key).action(job_id, verb)
        if as_json:
            return print_json(job)
        status = printable(job.get("status", "?"))
        console().print(f"{past} job {printable(job['id'])}: now {status}", markup=False)

    command.__doc__ = f"{verb.capitalize()} a job (exit 2 with its current state if it cannot)."
    return command


@exits_on_client_error
def wait(
    ctx: typer.Context,
    job_id: JobArg,
    timeout: Annotated[float | None, typer.Option(help="Give up after S seconds (exit 4).")] = None,
    poll: Annotated[float, typer.Option(help="Seconds between polls.")] = 2.0,
    server: ServerOpt = None,
    api_key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Wait for a job: exit 0 succeeded, 1 failed, 3 cancelled, 4 timeout, 5 paused."""
    finish(connect(ctx, server, api_key).wait_for(job_id, timeout, poll), as_json)


@exits_on_client_error
def logs(
    ctx: typer.Context,
    job_id: JobArg,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines.")
    ] = False,
    server: ServerOpt = None,
    api_key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Print a job's log (the trainer's stdout and stderr)."""
    follow_logs(connect(ctx, server, api_key), job_id, follow, as_json)


@exits_on_client_error
def watch(
    ctx: typer.Context,
    job_id: JobArg,
    poll: Annotated[float, typer.Option(help="Seconds between polls.")] = 1.0,
    server: ServerOpt = None,
    api_key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Live progress (step, loss, tokens/s, ETA) until the job ends, then a summary (steps,
    final loss, checkpoint); exits like `wait`."""
    watch_and_finish(connect(ctx, server, api_key), job_id, poll, None, as_json)


def register(app: typer.Typer) -> None:
    app.callback()(global_options)
    extra = {"allow_extra_args": True, "ignore_unknown_options": True}
    app.command(context_settings=extra)(submit)
    app.command()(jobs)
    app.command()(status)
    app.command()(watch)
    app.command()(logs)
    app.command()(wait)
    app.command(name="cancel")(_act("cancel", "cancelling"))
    app.command(name="pause")(_act("pause", "pausing"))
    app.command(name="resume")(_act("resume", "resuming"))
