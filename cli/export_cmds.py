"""`tuneyard export JOB`: ask the server for an export of one of a job's checkpoints.

`--step N` picks the checkpoint (default: the latest), `--merge-lora/--no-merge-lora` a LoRA
run's merged model or its adapter alone, `--dtype` the stored dtype. A worker runs the
export; `--wait` polls it until it ends and exits like `tuneyard wait` does for a job (0
succeeded, 1 failed, 3 cancelled, 4 timed out), printing where the export lies in the job's
run directory. Like every client command it talks to `/v1` through `cli.http_client`.
"""

from __future__ import annotations

import time
from typing import Annotated, Literal

import typer

from cli.client_cmds import (
    JobArg,
    JsonOpt,
    KeyOpt,
    ServerOpt,
    connect,
    console,
    exits_on_client_error,
    print_json,
)
from cli.http_client import ClientError, CliExitCode, TuneyardClient
from cli.terminal import printable
from jobs.store.status import EXPORT_TERMINAL, ExportStatus

EXPORT_EXIT = {
    ExportStatus.SUCCEEDED: CliExitCode.SUCCEEDED,
    ExportStatus.FAILED: CliExitCode.FAILED,
    ExportStatus.CANCELLED: CliExitCode.CANCELLED,
}


def wait_for_export(
    client: TuneyardClient, export_id: str, timeout: float | None, poll: float
) -> dict:
    """Poll the export until it ends; ClientError(TIMED_OUT) after `timeout` seconds."""
    deadline = time.monotonic() + timeout if timeout else None
    while True:
        export = client.request("GET", f"/v1/exports/{export_id}")
        if export["status"] in EXPORT_TERMINAL:
            return export
        if deadline and time.monotonic() > deadline:
            message = f"export {export_id} still {export['status']} after {timeout:g}s"
            raise ClientError(message, CliExitCode.TIMED_OUT)
        time.sleep(poll)


def describe(export: dict) -> str:
    what = f"{printable(export['kind'])} export {printable(export['id'])}"
    where = f"of job {printable(export['job_id'])} step {export['step']} ({export['dtype']})"
    status = printable(export["status"])
    if status == ExportStatus.SUCCEEDED:
        size = (export.get("size_bytes") or 0) / 2**20
        return f"{what} {where} succeeded: {printable(export['path'])} ({size:.1f} MiB)"
    if status == ExportStatus.FAILED:
        error = printable(export.get("error_message") or "no message")
        return f"{what} {where} failed ({printable(export.get('error_code'))}): {error}"
    return f"{what} {where}: {status}"


@exits_on_client_error
def export(
    ctx: typer.Context,
    job_id: JobArg,
    step: Annotated[
        int | None, typer.Option(help="Checkpoint step (default: the latest).", show_default=False)
    ] = None,
    merge_lora: Annotated[
        bool,
        typer.Option(
            "--merge-lora/--no-merge-lora",
            help="A LoRA run: the base with the adapter merged, or the adapter alone.",
        ),
    ] = True,
    dtype: Annotated[
        Literal["float32", "bfloat16", "float16"], typer.Option(help="Stored dtype.")
    ] = "float32",
    wait: Annotated[bool, typer.Option("--wait", help="Wait until the export ends.")] = False,
    timeout: Annotated[float | None, typer.Option(help="With --wait: give up after S s.")] = None,
    poll: Annotated[float, typer.Option(help="Seconds between polls.")] = 1.0,
    server: ServerOpt = None,
    api_key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Export a job's checkpoint: a merged LoRA model, the adapter alone, or full weights."""
    client = connect(ctx, server, api_key)
    body = {"merge_lora": merge_lora, "dtype": dtype} | ({} if step is None else {"step": step})
    created = client.request("POST", f"/v1/jobs/{job_id}/exports", json=body)
    if not wait:
        return print_json(created) if as_json else console().print(describe(created), markup=False)
    if not as_json:
        console().print(describe(created), markup=False)
    ended = wait_for_export(client, created["id"], timeout, poll)
    code = EXPORT_EXIT.get(ended["status"], CliExitCode.FAILED)
    if as_json:
        print_json(ended)
    else:
        console(stderr=code != CliExitCode.SUCCEEDED).print(describe(ended), markup=False)
    raise typer.Exit(int(code))


def register(app: typer.Typer) -> None:
    app.command()(export)
