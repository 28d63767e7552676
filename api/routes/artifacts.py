"""A job's artifacts in the artifact store: the list, and short-lived download links.

`GET /v1/jobs/{job_id}/artifacts` lists what the workers stored completely (checkpoints by
step, then exports), read from the `artifacts` rows: an upload whose manifest is not
written has no row and is not listed, nor is a checkpoint retention deleted (from the
moment its deletion is recorded, while its objects leave the store). `GET /v1/jobs/{job_id}/artifacts/{name}/download`
answers a presigned GET URL for every file of one artifact, with its size and SHA-256 to
check the download against, valid `PRESIGN_SECONDS`. Signing is local (no call to the
store). Both are scoped to the caller's project like every job lookup: another project's
job answers the same 404 as a missing one.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Annotated, Literal

from fastapi import APIRouter, Path
from pydantic import BaseModel

from api.deps import Reader, SessionDep, SettingsDep
from api.errors import ApiError, not_found
from api.routes.jobs import AUTH_ERRORS, NOT_FOUND, find_job
from jobs.artifacts.s3 import PRESIGN_SECONDS, ArtifactStore
from jobs.recipe.paths.stored import parse_store
from jobs.store.artifacts import find_artifact, list_artifacts
from jobs.store.tables import Artifact

router = APIRouter(prefix="/v1/jobs/{job_id}/artifacts", tags=["artifacts"])
ArtifactName = Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.=+@-]+$")]


class ArtifactPublic(BaseModel):
    name: str
    kind: Literal["checkpoint", "export"]
    step: int | None
    size_bytes: int
    sha256: str  # of the artifact's manifest, which lists every file's SHA-256
    files: int
    key: str  # its s3:// URL: what `restore_from.path` names to restore a checkpoint
    created_at: datetime


class ArtifactsPublic(BaseModel):
    data: list[ArtifactPublic]


class ArtifactFileLink(BaseModel):
    path: str
    size: int
    sha256: str
    url: str


class ArtifactDownload(BaseModel):
    name: str
    kind: str
    sha256: str
    size_bytes: int
    expires_at: datetime
    files: list[ArtifactFileLink]


def _public(row: Artifact) -> ArtifactPublic:
    return ArtifactPublic(
        name=row.name,
        kind=row.kind,  # type: ignore[arg-type]  # the table's check constraint
        step=row.step,
        size_bytes=row.size_bytes,
        sha256=row.sha256,
        files=len(row.files.get("files", [])),
        key=row.key,
        created_at=row.created_at,
    )


@lru_cache(maxsize=4)
def _store(url: str) -> ArtifactStore:
    return ArtifactStore(parse_store(url))  # a boto3 client per store, made once


@router.get(
    "",
    response_model=ArtifactsPublic,
    summary="A job's stored artifacts",
    responses={**NOT_FOUND, **AUTH_ERRORS},
)
def list_job_artifacts(job_id: str, principal: Reader, session: SessionDep) -> ArtifactsPublic:
    """Checkpoints and exports stored completely in the artifact store."""
    job = find_job(session, principal, job_id)
    return ArtifactsPublic(data=[_public(row) for row in list_artifacts(session, job.id)])


@router.get(
    "/{name}/download",
    response_model=ArtifactDownload,
    summary="Download links for one artifact",
    responses={
        **NOT_FOUND,
        **AUTH_ERRORS,
        503: {"description": "This server has no artifact store configured."},
    },
)
def download_artifact(
    job_id: str, name: ArtifactName, principal: Reader, session: SessionDep, settings: SettingsDep
) -> ArtifactDownload:
    """A presigned GET URL per file, valid for a few minutes, with the size and SHA-256
    each download must match."""
    job = find_job(session, principal, job_id)
    row = find_artifact(session, job.id, name)
    if row is None:
        raise not_found("artifact", name)
    if not settings.artifact_store:
        raise ApiError(
            503, "unavailable", "no artifact store is configured (TUNEYARD_ARTIFACT_STORE)"
        )
    try:
        store = _store(settings.artifact_store)
    except ValueError as exc:  # the operator's setting, reported without a traceback
        raise ApiError(503, "unavailable", f"TUNEYARD_ARTIFACT_STORE: {exc}") from None
    key = store.location.key_of(row.key)
    if key is None:  # stored under an earlier store setting
        raise ApiError(503, "unavailable", f"artifact {name} is not in the configured store")
    files = [
        ArtifactFileLink(
            path=f["path"],
            size=f["size"],
            sha256=f["sha256"],
            url=store.presigned_url(f"{key}/{f['path']}", PRESIGN_SECONDS),
        )
        for f in row.files.get("files", [])
    ]
    expires = datetime.now(UTC) + timedelta(seconds=PRESIGN_SECONDS)
    return ArtifactDownload(
        name=row.name,
        kind=row.kind,
        sha256=row.sha256,
        size_bytes=row.size_bytes,
        expires_at=expires,
        files=files,
    )
