"""Checkpoints in the artifact store: where they live, and which a recipe may restore from.

With `TUNEYARD_ARTIFACT_STORE=s3://<bucket>/<prefix>` the workers copy every published
checkpoint (and export) to `<prefix>/projects/<project>/jobs/<job id>/<kind>s/<name>/` of
that bucket (`artifact_key`), each with a manifest beside it that is written last (the
`jobs.artifacts` package). This module is the one statement of that layout, so the API's
submit check, the worker's upload and restore, and the listing agree on every key.

`restore_from.path` may name such a checkpoint as an `s3://` URL. It is checked from the
text alone, without a network call: the store must be configured, the URL inside it, in the
shape of a stored checkpoint, and, with a scope, in the caller's project's own part and of
one of its jobs; any other project's URL gets the one answer, whether it exists or not. The
worker downloads it and checks it against its manifest before the launch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote

from jobs.recipe.errors import FieldError, shown
from jobs.recipe.paths.scope import PROJECT_DIR, PROJECTS_DIR, JobScope

SCHEME = "s3://"
ARTIFACT_KINDS = ("checkpoint", "export")
MAX_KEY = 1024  # S3's own limit on a key, in bytes
BUCKET = re.compile(r"\A[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]\Z")
# A prefix of plain path segments, no empty, `.` or `..` one, no control characters.
SEGMENT = re.compile(r"\A[A-Za-z0-9_][A-Za-z0-9._=+@-]{0,199}\Z")
JOB_ID = re.compile(r"\A[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")
STEP_NAME = re.compile(r"\Astep_([0-9]{1,10})\Z")
STORE_FIX = "set TUNEYARD_ARTIFACT_STORE=s3://<bucket>/<prefix> on the API and the workers"


@dataclass(frozen=True)
class StoreLocation:
    """`s3://bucket/prefix` taken apart: the bucket and the key prefix (no slashes around)."""

    bucket: str
    prefix: str

    def url(self, key: str) -> str:
        return f"{SCHEME}{self.bucket}/{key}"

    def key_of(self, url: str) -> str | None:
        """The key of an `s3://` URL in this bucket and under the prefix; None otherwise."""
        head = f"{SCHEME}{self.bucket}/"
        if not url.startswith(head):
            return None
        key = url[len(head) :].rstrip("/")
        below = f"{self.prefix}/" if self.prefix else ""
        return key if key.startswith(below) and len(key) > len(below) else None


def parse_store(text: str) -> StoreLocation:
    """`s3://bucket[/prefix]` -> StoreLocation; ValueError saying what is wrong."""
    if not text.startswith(SCHEME):
        raise ValueError(f"{shown(text)} is not an s3://bucket/prefix URL")
    bucket, _, prefix = text[len(SCHEME) :].partition("/")
    prefix = prefix.strip("/")
    if not BUCKET.match(bucket):
        raise ValueError(f"{shown(bucket)} is not an S3 bucket name")
    if prefix and not all(SEGMENT.match(part) for part in prefix.split("/")):
        raise ValueError(f"{shown(prefix)} is not a key prefix of plain path segments")
    return StoreLocation(bucket, prefix)


def project_key(project: str) -> str:
    """The project's key segment: its name when it is a plain path component (the same rule
    as a checkpoint root's `projects/<project>/`), else `~` and the name percent-encoded, a
    segment no plain name can be."""
    return project if PROJECT_DIR.match(project) else "~" + quote(project, safe="")


def job_key(store: StoreLocation, project: str, job_id: str) -> str:
    """Where one job's artifacts live in the store."""
    parts = [store.prefix] if store.prefix else []
    return "/".join([*parts, PROJECTS_DIR, project_key(project), "jobs", job_id])


def artifact_key(store: StoreLocation, project: str, job_id: str, kind: str, name: str) -> str:
    """The key prefix of one stored checkpoint (`step_<N>`) or export of a job."""
    if kind not in ARTIFACT_KINDS or not SEGMENT.match(name):
        raise ValueError(f"no artifact key for kind {kind!r} and name {name!r}")
    return f"{job_key(store, project, job_id)}/{kind}s/{name}"


@dataclass(frozen=True)
class StoredCheckpoint:
    """A stored checkpoint's key taken apart."""

    key: str
    project_key: str
    job_id: str
    step: int


def parse_checkpoint_key(store: StoreLocation, key: str) -> StoredCheckpoint | None:
    """`<prefix>/projects/<p>/jobs/<id>/checkpoints/step_<N>` -> its parts; None otherwise."""
    below = key[len(store.prefix) + 1 :] if store.prefix else key
    parts = below.split("/")
    if len(parts) != 6 or parts[0] != PROJECTS_DIR or parts[2] != "jobs":
        return None
    step = STEP_NAME.match(parts[5])
    if parts[4] != "checkpoints" or step is None or not JOB_ID.match(parts[3]):
        return None
    return StoredCheckpoint(key, parts[1], parts[3], int(step.group(1)))


def is_store_url(value: object) -> bool:
    return isinstance(value, str) and value.startswith(SCHEME)


def stored_checkpoint_errors(
    url: str, loc: str, store_url: str | None, scope: JobScope | None
) -> list[FieldError]:
    """Why `url` cannot be restored from, from its text alone: [] when it names a stored
    checkpoint of the configured store (and, with a scope, of one of the project's jobs)."""
    if not store_url:
        msg = f"{shown(url)} names the artifact store, and none is configured"
        return [FieldError(loc, msg, STORE_FIX)]
    try:
        store = parse_store(store_url)
    except ValueError as exc:
        return [FieldError(loc, f"TUNEYARD_ARTIFACT_STORE: {exc}", STORE_FIX)]
    where = store.url(f"{store.prefix}/" if store.prefix else "")
    shape = f"{where}{PROJECTS_DIR}/<project>/jobs/<job id>/checkpoints/step_<N>"
    fix = f"give a stored checkpoint, {shape}, as `tuneyard artifacts <job>` lists them"
    key = store.key_of(url) if len(url) <= MAX_KEY and url.isprintable() else None
    if key is None:
        return [FieldError(loc, f"{shown(url)} is not in the artifact store {where}", fix)]
    found = parse_checkpoint_key(store, key)
    if found is None:
        return [FieldError(loc, f"{shown(url)} does not name a stored checkpoint", fix)]
    if scope is not None and (
        found.project_key != project_key(scope.project) or not scope.owns_job(found.job_id)
    ):
        msg = f"{shown(url)} is not a stored checkpoint of project {scope.project}"
        return [
            FieldError(loc, msg, f"restore from a checkpoint of a job of project {scope.project}")
        ]
    return []
