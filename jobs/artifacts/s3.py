"""Artifacts in S3-compatible storage, through boto3: upload, download, presigned URLs.

The endpoint, region and credentials are the standard AWS settings (`AWS_ENDPOINT_URL` /
`AWS_ENDPOINT_URL_S3`, `AWS_REGION` or `AWS_DEFAULT_REGION`, `AWS_ACCESS_KEY_ID` /
`AWS_SECRET_ACCESS_KEY`, profiles), read by boto3 itself; `TUNEYARD_ARTIFACT_STORE` names
the bucket and prefix. Files go through boto3's transfer manager (multipart above
`MULTIPART_BYTES`) with `ChecksumAlgorithm=SHA256`, so the server checks every part as it
arrives, and each object carries its file's SHA-256 in its metadata.

An upload is idempotent and resumes: a file whose object already has the same size and
SHA-256 is not sent again, and the manifest goes last; a changed artifact loses its old
manifest first, so a reader never sees files and a manifest that disagree as complete. A
download writes into a `.partial` directory, checks every file against the manifest and
only then renames it into place.

A delete is the upload in reverse: the manifest goes first, so the artifact stops being
complete at once, then every object under the key, listed and deleted in batches; a key
already gone is deleted all the same.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.artifacts.manifest import (
    MANIFEST_SUFFIX,
    Manifest,
    ManifestError,
    ManifestFile,
    file_sha256,
    parse_manifest,
    scan_directory,
    verify_directory,
    verify_file,
)
from jobs.recipe.paths.stored import StoreLocation, parse_store

MULTIPART_BYTES = 64 * 1024 * 1024
DELETE_BATCH = 1000  # the most keys one DeleteObjects request may name
PRESIGN_SECONDS = 900  # a download link lives 15 minutes
SHA_META = "sha256"  # x-amz-meta-sha256: the object's whole-file SHA-256, hex


class StoreError(Exception):
    """The store cannot be reached, or refused a request."""


@dataclass(frozen=True)
class StoredArtifact:
    """An artifact the store holds completely: its key prefix and manifest."""

    key: str
    url: str
    manifest: Manifest
    manifest_sha256: str


def manifest_key(key: str) -> str:
    return key + MANIFEST_SUFFIX


def s3_client() -> Any:
    """A boto3 S3 client from the standard AWS settings (AWS_REGION read too)."""
    import boto3
    from botocore.config import Config

    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    config = Config(signature_version="s3v4", retries={"max_attempts": 5, "mode": "standard"})
    return boto3.client("s3", region_name=region, config=config)


class ArtifactStore:
    """One bucket and prefix of an S3-compatible store."""

    def __init__(self, location: StoreLocation, client: Any = None) -> None:
        self.location = location
        self.client = client if client is not None else s3_client()

    @classmethod
    def from_url(cls, url: str | None) -> ArtifactStore | None:
        """The store `TUNEYARD_ARTIFACT_STORE` names, or None when it names none."""
        return cls(parse_store(url)) if url else None

    @property
    def bucket(self) -> str:
        return self.location.bucket

    # ---- reading ----------------------------------------------------------------------
    def read_manifest(self, key: str) -> Manifest | None:
        """The artifact's manifest; None when it has none (absent or unfinished)."""
        data = self._get_bytes(manifest_key(key))
        return None if data is None else parse_manifest(data)

    def stored(self, key: str) -> StoredArtifact | None:
        data = self._get_bytes(manifest_key(key))
        if data is None:
            return None
        manifest = parse_manifest(data)
        return StoredArtifact(key, self.location.url(key), manifest, manifest.sha256())

    def presigned_url(self, key: str, seconds: int = PRESIGN_SECONDS) -> str:
        """A GET URL for one object that works for `seconds` without credentials."""
        params = {"Bucket": self.bucket, "Key": key}
        return self.client.generate_presigned_url("get_object", Params=params, ExpiresIn=seconds)

    # ---- uploading --------------------------------------------------------------------
    def upload_directory(
        self, directory: Path, key: str, *, job_id: str, kind: str, name: str, step: int | None
    ) -> StoredArtifact:
        """Store `directory` under `key`; the manifest goes last. Safe to call again after an
        interruption: what is already stored is not sent twice."""
        try:
            files = scan_directory(directory)
        except OSError as exc:
            raise ManifestError(f"cannot read {directory}: {exc}") from exc
        manifest = Manifest(job_id=job_id, kind=kind, name=name, step=step, files=files)
        current = self._current_manifest(key)
        if current == manifest:
            return StoredArtifact(key, self.location.url(key), manifest, manifest.sha256())
        if current is not None or self._exists(manifest_key(key)):
            self._call("delete_object", Bucket=self.bucket, Key=manifest_key(key))
        for entry in files:
            self._upload_file(directory / entry.path, f"{key}/{entry.path}", entry)
        body = manifest.to_bytes()
        self._call(
            "put_object",
            Bucket=self.bucket,
            Key=manifest_key(key),
            Body=body,
            ContentType="application/json",
            ChecksumAlgorithm="SHA256",
        )
        return StoredArtifact(key, self.location.url(key), manifest, manifest.sha256())

    def _current_manifest(self, key: str) -> Manifest | None:
        try:
            return self.read_manifest(key)
        except ManifestError:
            return None  # an unreadable manifest is replaced like an outdated one

    def _upload_file(self, path: Path, object_key: str, entry: ManifestFile) -> None:
        head = self._head(object_key)
        if (
            head is not None
            and head.get("ContentLength") == entry.size
            and head.get("Metadata", {}).get(SHA_META) == entry.sha256
        ):
            return  # stored by an earlier, interrupted upload
        from boto3.s3.transfer import TransferConfig

        config = TransferConfig(
            multipart_threshold=MULTIPART_BYTES, multipart_chunksize=MULTIPART_BYTES
        )
        extra = {"ChecksumAlgorithm": "SHA256", "Metadata": {SHA_META: entry.sha256}}
        self._call(
            "upload_file", str(path), self.bucket, object_key, ExtraArgs=extra, Config=config
        )
        stored = self._head(object_key)
        if stored is None or stored.get("ContentLength") != entry.size:
            raise StoreError(f"{object_key}: the store holds another size than was sent")

    # ---- downloading ------------------------------------------------------------------
    def download(self, key: str, target: Path) -> StoredArtifact:
        """The complete, verified artifact at `target` (reused when it already matches)."""
        found = self.stored(key)
        if found is None:
            raise ManifestError(f"{self.location.url(key)} has no manifest: not a stored artifact")
        if target.is_dir() and not verify_directory(target, found.manifest):
            return found
        partial = target.with_name(target.name + ".partial")
        partial.mkdir(parents=True, exist_ok=True)
        for extra in set(_relative_files(partial)) - {f.path for f in found.manifest.files}:
            (partial / extra).unlink()
        for entry in found.manifest.files:
            self._download_file(f"{key}/{entry.path}", partial / entry.path, entry)
        problems = verify_directory(partial, found.manifest)
        if problems:
            raise ManifestError(f"{found.url}: " + "; ".join(problems[:5]))
        if target.exists():
            shutil.rmtree(target)
        os.replace(partial, target)
        return found

    def _download_file(self, object_key: str, path: Path, entry: ManifestFile) -> None:
        if verify_file(path, entry) is None:
            return  # kept from an interrupted download
        path.parent.mkdir(parents=True, exist_ok=True)
        self._call("download_file", self.bucket, object_key, str(path))
        if file_sha256(path) != entry.sha256:
            path.unlink()
            raise ManifestError(f"{object_key}: SHA-256 differs from the manifest")

    # ---- deleting ---------------------------------------------------------------------
    def delete(self, key: str) -> int:
        """Remove the artifact at `key`: its manifest first, then every object under it;
        how many objects were deleted. A missing key is not an error."""
        self._call("delete_object", Bucket=self.bucket, Key=manifest_key(key))
        deleted = 0
        paginator = self._call("get_paginator", "list_objects_v2")
        pages = paginator.paginate(Bucket=self.bucket, Prefix=key + "/")
        batch: list[dict[str, str]] = []
        for page in self._pages(pages):
            for item in page.get("Contents", []):
                batch.append({"Key": item["Key"]})
                if len(batch) == DELETE_BATCH:
                    deleted += self._delete_batch(batch)
                    batch = []
        if batch:
            deleted += self._delete_batch(batch)
        return deleted

    def _pages(self, pages: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield from pages
        except (BotoCoreError, ClientError) as exc:
            raise StoreError(f"list {self.location.url('')}: {exc}") from exc

    def _delete_batch(self, batch: list[dict[str, str]]) -> int:
        answer = self._call(
            "delete_objects", Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True}
        )
        errors = [e for e in answer.get("Errors", []) if str(e.get("Code")) != "NoSuchKey"]
        if errors:
            first = errors[0]
            raise StoreError(
                f"delete {self.location.url(first.get('Key', ''))}: {first.get('Code')} "
                f"{first.get('Message', '')} ({len(errors)} of {len(batch)} objects not deleted)"
            )
        return len(batch)

    # ---- boto3 ------------------------------------------------------------------------
    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self.client, method)(*args, **kwargs)
        except (BotoCoreError, ClientError) as exc:
            raise StoreError(f"{method} {self.location.url('')}: {exc}") from exc
        except Exception as exc:  # the transfer manager wraps errors in its own types
            if exc.__class__.__module__.startswith(("boto3", "s3transfer")):
                raise StoreError(f"{method} {self.location.url('')}: {exc}") from exc
            raise

    def _head(self, object_key: str) -> dict[str, Any] | None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return self.client.head_object(Bucket=self.bucket, Key=object_key)
        except ClientError as exc:
            if _is_missing(exc):
                return None
            raise StoreError(f"head {self.location.url(object_key)}: {exc}") from exc
        except BotoCoreError as exc:
            raise StoreError(f"head {self.location.url(object_key)}: {exc}") from exc

    def _exists(self, object_key: str) -> bool:
        return self._head(object_key) is not None

    def _get_bytes(self, object_key: str) -> bytes | None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=object_key)
            return answer["Body"].read()
        except ClientError as exc:
            if _is_missing(exc):
                return None
            raise StoreError(f"get {self.location.url(object_key)}: {exc}") from exc
        except BotoCoreError as exc:
            raise StoreError(f"get {self.location.url(object_key)}: {exc}") from exc


def _is_missing(exc: Any) -> bool:
    error = exc.response.get("Error", {})
    return str(error.get("Code")) in {"404", "NoSuchKey", "NotFound"}


def _relative_files(root: Path) -> list[str]:
    return [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]
