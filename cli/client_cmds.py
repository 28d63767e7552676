"""Client commands: talk to a tuneyard server over HTTP (`submit`, `jobs`, `watch`, `wait`, ...).

Every command here is a thin httpx call to the `/v1` API; the server selected by `--server`
or `TUNEYARD_URL`, authenticated by `TUNEYARD_API_KEY`. Read commands take `--json` for
scripts. Exit codes are stable so CI can branch on them (see `ExitCode` below): a job that
succeeded exits 0, failed 1, cancelled 3; a refused request (bad recipe, unknown job, bad
key) exits 2 and prints the server's reason.
"""

from __future__ import annotations

import json
import sys
import time
from enum import IntEnum
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table

DEFAULT_URL = "http://127.0.0.1:8000"
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})
console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


class ExitCode(IntEnum):
    SUCCEEDED = 0
    FAILED = 1
    REFUSED = 2  # the server refused the request: 401/403/404/409/422
    CANCELLED = 3
    TIMED_OUT = 4  # `wait --timeout` ran out before the job finished
    PAUSED = 5  # the job is paused: no progress until someone resumes it
    UNREACHABLE = 6  # no answer from the server, or a 5xx


STATE_EXIT = {
    "succeeded": ExitCode.SUCCEEDED,
    "failed": ExitCode.FAILED,
    "cancelled": ExitCode.CANCELLED,
    "paused": ExitCode.PAUSED,
}


class ClientError(Exception):
    """A request the CLI cannot complete; carries the exit code and what to tell the user."""

    def __init__(self, message: str, exit_code: ExitCode, errors: list[dict] | None = None):
        super().__init__(message)
        self.exit_code = exit_code
        self.errors = errors or []


class TuneyardClient:
    """A small synchronous client for the `/v1` API."""

    def __init__(self, server: str = DEFAULT_URL, api_key: str | None = None, timeout=30.0):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.server = server.rstrip("/")
        self.http = httpx.Client(base_url=self.server, headers=headers, timeout=timeout)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ClientError(
                f"cannot reach {self.server}: {exc}; is the server up (`tuneyard up`) "
                "and --server / TUNEYARD_URL right?",
                ExitCode.UNREACHABLE,
            ) from exc
        if response.status_code >= 400:
            raise _error_from(response)
        if not response.content:
            return None
        if "json" in response.headers.get("content-type", ""):
            return response.json()
        return response.text

    def submit(self, body: dict, idempotency_key: str | None = None) -> dict:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self.request("POST", "/v1/jobs", json=body, headers=headers)

    def job(self, job_id: str) -> dict:
        return self.request("GET", f"/v1/jobs/{job_id}")

    def jobs(self, **params: Any) -> list[dict]:
        query = {k: v for k, v in params.items() if v is not None}
        return items_of(self.request("GET", "/v1/jobs", params=query))

    def action(self, job_id: str, verb: str) -> dict:
        return self.request("POST", f"/v1/jobs/{job_id}/{verb}")

    def metrics(
        self, job_id: str, after_step: int | None = None, max_points: int | None = None
    ) -> list:
        params = {
            "kind": "train",
            "limit": 1000,
            "after_step": after_step,
            "max_points": max_points,
        }
        query = {k: v for k, v in params.items() if v is not None}
        return items_of(self.request("GET", f"/v1/jobs/{job_id}/metrics", params=query))

    def logs(self, job_id: str, after: int = 0) -> dict:
        return self.request("GET", f"/v1/jobs/{job_id}/logs", params={"after": after})


def items_of(body: Any) -> list:
    """The records of a collection answer (`{"data": [...], ...}`)."""
    return body.get("data", []) if isinstance(body, dict) else []


def _error_from(response: httpx.Response) -> ClientError:
    try:
        body = response.json()
    except ValueError:
        body = {"detail": response.text[:500]}
    errors = body.get("errors") if isinstance(body, dict) else None
    detail = body.get("error") or body.get("detail", body) if isinstance(body, dict) else body
    if isinstance(detail, dict):
        detail = detail.get("message") or json.dumps(detail)
    code = response.status_code
    if code == 401:
        message = "the server refused the API key; set TUNEYARD_API_KEY (`tuneyard keys create`)"
    elif errors:
        message = "the server refused the request:"
    else:
        message = f"HTTP {code}: {detail}"
    exit_code = ExitCode.UNREACHABLE if code >= 500 else ExitCode.REFUSED
    return ClientError(message, exit_code, errors)


# ----------------------------------------------------------------------------- options
ServerOpt = Annotated[
    str, typer.Option("--server", envvar="TUNEYARD_URL", help="tuneyard server URL.")
]
KeyOpt = Annotated[
    str | None,
    typer.Option("--api-key", envvar="TUNEYARD_API_KEY", help="API key.", show_default=False),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the raw JSON answer.")]
JobArg = Annotated[str, typer.Argument(help="Job id.")]


def fail(error: ClientError) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {error}")
    for item in error.errors:
        loc = item.get("loc", "")
        loc = ".".join(str(p) for p in loc) if isinstance(loc, list) else loc
        fix = f"  [dim]fix: {item['fix']}[/dim]" if item.get("fix") else ""
        err_console.print(f"  [bold]{loc}[/bold]: {item.get('msg', '')}{fix}")
    return typer.Exit(int(error.exit_code))


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def parse_overrides(tokens: list[str]) -> list[str]:
    """`a.b=v` and `--a.b v` / `--a.b=v` tokens as a list of `a.b=v` strings."""
    overrides, i = [], 0
    while i < len(tokens):
        token = tokens[i]
        if token.startswith("--") and "=" not in token:
            if i + 1 >= len(tokens):
                raise typer.BadParameter(f"{token} needs a value, e.g. `{token} 1e-4`")
            overrides.append(f"{token[2:]}={tokens[i + 1]}")
            i += 2
            continue
        if "=" not in token:
            raise typer.BadParameter(f"override {token!r} must look like `optimizer.lr=1e-4`")
        overrides.append(token.removeprefix("--"))
        i += 1
    return overrides


def job_progress(job: dict) -> tuple[int | None, int | None]:
    """(latest step, max_steps) from the job's summary."""
    return (job.get("latest_metrics") or {}).get("step"), job.get("max_steps")


def describe_end(job: dict) -> str:
    status = job.get("status", "?")
    if status == "failed":
        code = job.get("error_code") or "error"
        return f"job {job['id']} failed ({code}): {job.get('error_message') or 'no message'}"
    if status == "paused":
        return f"job {job['id']} is paused; resume it with `tuneyard resume {job['id']}`"
    return f"job {job['id']} {status}"


def wait_for_job(client: TuneyardClient, job_id: str, timeout: float | None, poll: float) -> dict:
    """Poll until the job ends (or pauses); raises ClientError(TIMED_OUT) after `timeout`."""
    deadline = time.monotonic() + timeout if timeout else None
    while True:
        job = client.job(job_id)
        if job["status"] in TERMINAL_STATES or job["status"] == "paused":
            return job
        if deadline and time.monotonic() > deadline:
            raise ClientError(
                f"job {job_id} still {job['status']} after {timeout:g}s", ExitCode.TIMED_OUT
            )
        time.sleep(poll)


def finish(job: dict, as_json: bool = False) -> None:
    """Print how the job ended and exit with its code."""
    code = STATE_EXIT.get(job["status"], ExitCode.FAILED)
    if as_json:
        print_json(job)
    else:
        (console if code == ExitCode.SUCCEEDED else err_console).print(describe_end(job))
    raise typer.Exit(int(code))


class ProgressLine:
    """One progress display: a live rich bar on a terminal, plain lines everywhere else."""

    def __init__(self, out: Console, job_id: str):
        self.out, self.job_id, self.last_text = out, job_id, ""
        self.start: tuple[float, int] | None = None
        self.live = None
        if out.is_terminal:
            from rich.progress import BarColumn, Progress, TextColumn

            self.live = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[info]}"),
                console=out,
            )
            self.task = self.live.add_task(job_id[:8], total=None, info="")

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
        parts = [job["status"], f"step {step}/{max_steps or '?'}"]
        if record and record.get("loss") is not None:
            parts.append(f"loss {record['loss']:.4f}")
        if record and record.get("tps") is not None:
            parts.append(f"tps {record['tps']:.0f}")
        text = "  ".join(parts)
        eta = f"eta {self.eta(step, max_steps)}" if job["status"] == "running" else ""
        if self.live:
            self.live.update(self.task, completed=step, total=max_steps, info=f"{text}  {eta}")
        elif text != self.last_text:  # on a pipe: one line per new step or state
            self.out.print(f"{self.job_id[:8]}  {text}  {eta}".rstrip())
        self.last_text = text


def watch_job(
    client: TuneyardClient, job_id: str, poll: float, out: Console, as_json: bool
) -> dict:
    """Follow a job's train metrics until it ends or pauses; returns the final job."""
    cursor, latest = None, None
    with ProgressLine(out if not as_json else Console(file=sys.stderr), job_id) as line:
        while True:
            job = client.job(job_id)
            # First the latest step only (downsampling keeps it), then every new record.
            records = client.metrics(job_id, cursor, max_points=2 if cursor is None else None)
            for record in records:
                cursor, latest = record["step"], record
                if as_json:
                    sys.stdout.write(json.dumps(record, default=str) + "\n")
            line.update(job, latest)
            if job["status"] in TERMINAL_STATES or job["status"] == "paused":
                return job
            time.sleep(poll)


def follow_logs(client: TuneyardClient, job_id: str, follow: bool, as_json: bool) -> None:
    """Print every log line, page by page; with `follow`, poll for more until the job ends."""
    cursor = 0
    while True:
        body = client.logs(job_id, after=cursor)
        for line in body["lines"]:
            sys.stdout.write(json.dumps(line) + "\n" if as_json else f"{line['text']}\n")
        sys.stdout.flush()
        cursor = body.get("next_after") or cursor
        if body["lines"]:
            continue  # a full page: more may be waiting already
        if not follow or client.job(job_id)["status"] in TERMINAL_STATES:
            return
        time.sleep(1.0)


# ----------------------------------------------------------------------------- commands
def submit(
    ctx: typer.Context,
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML or JSON file.", exists=True)],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="Overrides: optimizer.lr=1e-4 or --optimizer.lr 1e-4")
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
        bool, typer.Option("--wait", help="Wait for the job; exit with its code.")
    ] = False,
    timeout: Annotated[float | None, typer.Option(help="With --wait: give up after S s.")] = None,
    server: ServerOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Submit a recipe as a job (validated by the server before anything is stored)."""
    tokens = [*(overrides or []), *ctx.args]
    body: dict[str, Any] = {
        "name": name or recipe.stem,
        "recipe_yaml": recipe.read_text(),
        "overrides": parse_overrides(tokens),
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
    client = TuneyardClient(server, api_key)
    try:
        job = client.submit(body, idempotency_key)
        if as_json and not wait:
            print_json(job)
        elif not as_json:
            console.print(f"submitted job [bold]{job['id']}[/bold] ({job['status']})")
            console.print(f"  dashboard: {client.server}/jobs/{job['id']}")
        if wait:
            finish(wait_for_job(client, job["id"], timeout, poll=1.0), as_json)
    except ClientError as exc:
        raise fail(exc) from None


def jobs(
    status: Annotated[str | None, typer.Option(help="Only jobs in this state.")] = None,
    label: Annotated[str | None, typer.Option(help="Only jobs with this key=value label.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many jobs.")] = 20,
    server: ServerOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List jobs, newest first."""
    try:
        rows = TuneyardClient(server, api_key).jobs(status=status, label=label, limit=limit)
    except ClientError as exc:
        raise fail(exc) from None
    if as_json:
        return print_json(rows)
    table = Table("id", "name", "state", "progress", "loss", "created", box=None)
    for job in rows:
        step, max_steps = job_progress(job)
        loss = (job.get("latest_metrics") or {}).get("loss")
        table.add_row(
            str(job["id"]),
            job.get("name", ""),
            job["status"],
            f"{step or 0}/{max_steps or '?'}",
            f"{loss:.4f}" if loss is not None else "",
            str(job.get("created_at", ""))[:19],
        )
    console.print(table if rows else "no jobs")


def status(
    job_id: JobArg,
    server: ServerOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show one job: state, attempts, progress, error."""
    try:
        job = TuneyardClient(server, api_key).job(job_id)
    except ClientError as exc:
        raise fail(exc) from None
    if as_json:
        return print_json(job)
    step, max_steps = job_progress(job)
    console.print(f"[bold]{job.get('name', '')}[/bold] {job['id']}")
    console.print(f"  state     {job['status']}")
    console.print(f"  attempt   {job.get('attempt', 0)}/{job.get('max_attempts', '?')}")
    console.print(f"  progress  {step or 0}/{max_steps or '?'}")
    if job.get("error_code") or job.get("error_message"):
        console.print(f"  error     {job.get('error_code')}: {job.get('error_message')}")


def _act(verb: str, past: str):
    def command(
        job_id: JobArg,
        server: ServerOpt = DEFAULT_URL,
        api_key: KeyOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        try:
            job = TuneyardClient(server, api_key).action(job_id, verb)
        except ClientError as exc:
            raise fail(exc) from None
        if as_json:
            return print_json(job)
        console.print(f"{past} job {job_id}: now {job.get('status', '?')}")

    command.__doc__ = f"{verb.capitalize()} a job (409 with the current state if it cannot)."
    return command


def wait(
    job_id: JobArg,
    timeout: Annotated[float | None, typer.Option(help="Give up after S seconds (exit 4).")] = None,
    poll: Annotated[float, typer.Option(help="Seconds between polls.")] = 2.0,
    server: ServerOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Wait for a job: exit 0 succeeded, 1 failed, 3 cancelled, 4 timeout, 5 paused."""
    try:
        finish(wait_for_job(TuneyardClient(server, api_key), job_id, timeout, poll), as_json)
    except ClientError as exc:
        raise fail(exc) from None


def logs(
    job_id: JobArg,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines.")
    ] = False,
    server: ServerOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Print a job's log (the trainer's stdout and stderr)."""
    try:
        follow_logs(TuneyardClient(server, api_key), job_id, follow, as_json)
    except ClientError as exc:
        raise fail(exc) from None


def watch(
    job_id: JobArg,
    poll: Annotated[float, typer.Option(help="Seconds between polls.")] = 1.0,
    server: ServerOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Live progress (step, loss, tokens/s, ETA) until the job ends; exits like `wait`."""
    client = TuneyardClient(server, api_key)
    try:
        job = watch_job(client, job_id, poll, console, as_json)
    except ClientError as exc:
        raise fail(exc) from None
    finish(job, as_json=as_json)


def register(app: typer.Typer) -> None:
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
