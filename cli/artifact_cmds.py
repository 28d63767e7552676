"""Artifact commands: `tuneyard artifacts JOB` lists what the store holds for a job,
`tuneyard download JOB ARTIFACT [-o DIR]` fetches one.

`download` asks the server for the artifact's presigned URLs (`GET
/v1/jobs/{id}/artifacts/{name}/download`), fetches each file straight from the store with
httpx (no API key is sent there: the URL carries its own signature), and checks every file's
size and SHA-256 against what the server listed before renaming it into place, so a
download that was cut or corrupted is never left looking complete: it exits 1 and the next
run fetches again. File paths come from the server and are checked to stay inside DIR.
"""

from __future__ import annotations

import hashlib
from pathlib import Path, PurePosixPath
from typing import Annotated, Any
from urllib.parse import quote

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
from cli.http_client import ClientError, CliExitCode, items_of
from cli.terminal import markup_safe, printable

CHUNK = 1024 * 1024
ArtifactArg = Annotated[str, typer.Argument(help="Artifact name, e.g. step_100 (see `artifacts`).")]


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


@exits_on_client_error
def artifacts(
    ctx: typer.Context,
    job_id: JobArg,
    server: ServerOpt = None,
    api_key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List a job's checkpoints and exports stored in the artifact store."""
    answer = connect(ctx, server, api_key).request("GET", f"/v1/jobs/{job_id}/artifacts")
    if as_json:
        return print_json(answer)
    from rich.table import Table

    rows = items_of(answer)
    table = Table("name", "kind", "step", "size", "files", "sha256", "created", "key")
    for row in rows:
        cells = (
            row["name"],
            row["kind"],
            "" if row.get("step") is None else str(row["step"]),
            _size(int(row["size_bytes"])),
            str(row["files"]),
            row["sha256"][:12],
            str(row["created_at"])[:19],
            row["key"],
        )
        table.add_row(*(markup_safe(cell) for cell in cells))
    console().print(table if rows else "no stored artifacts")


def safe_target(out: Path, path: str) -> Path:
    """Where a listed file goes under `out`; ClientError for a path that would leave it."""
    parts = PurePosixPath(path).parts
    if path.startswith("/") or not parts or any(p in ("", ".", "..") for p in parts):
        raise ClientError(
            f"the server listed an unsafe file path {printable(path)!r}", CliExitCode.FAILED
        )
    return out.joinpath(*parts)


def fetch_file(http: Any, link: dict[str, Any], target: Path) -> None:
    """One file from its presigned URL, checked by size and SHA-256, then renamed in place."""
    if (
        target.is_file()
        and target.stat().st_size == link["size"]
        and _sha256(target) == link["sha256"]
    ):
        return  # already here from an earlier run
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".part")
    digest, size = hashlib.sha256(), 0
    with http.stream("GET", link["url"]) as response:
        if response.status_code != 200:
            raise ClientError(
                f"{link['path']}: the store answered HTTP {response.status_code}",
                CliExitCode.FAILED,
            )
        with partial.open("wb") as f:
            for chunk in response.iter_bytes(CHUNK):
                digest.update(chunk)
                size += len(chunk)
                f.write(chunk)
    if size != link["size"] or digest.hexdigest() != link["sha256"]:
        partial.unlink()
        raise ClientError(
            f"{link['path']}: {size} bytes with another SHA-256 than listed; run download again",
            CliExitCode.FAILED,
        )
    partial.replace(target)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@exits_on_client_error
def download(
    ctx: typer.Context,
    job_id: JobArg,
    artifact: ArtifactArg,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Directory to write into (default: ./ARTIFACT)."),
    ] = None,
    server: ServerOpt = None,
    api_key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Download one stored artifact and verify every file's SHA-256."""
    import httpx

    client = connect(ctx, server, api_key)
    links = client.request(
        "GET", f"/v1/jobs/{job_id}/artifacts/{quote(artifact, safe='')}/download"
    )
    out = output or Path.cwd() / PurePosixPath(artifact).name
    targets = [(link, safe_target(out, link["path"])) for link in links["files"]]
    try:
        with httpx.Client(timeout=httpx.Timeout(60.0, connect=10.0)) as http:
            for link, target in targets:
                fetch_file(http, link, target)
    except httpx.HTTPError as exc:
        raise ClientError(
            f"cannot download from the store: {exc}; run download again", CliExitCode.UNREACHABLE
        ) from exc
    summary = {
        "artifact": links["name"],
        "directory": str(out),
        "files": len(targets),
        "size_bytes": links["size_bytes"],
        "sha256": links["sha256"],
        "verified": True,
    }
    if as_json:
        return print_json(summary)
    message = f"downloaded {printable(links['name'])} ({len(targets)} files, {_size(int(links['size_bytes']))})"
    console().print(f"{message}, verified, into {printable(out)}", markup=False)


def register(app: typer.Typer) -> None:
    app.command()(artifacts)
    app.command()(download)
