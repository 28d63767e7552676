"""What a stored artifact is: its manifest, the list of its files with sizes and SHA-256.

The manifest is the artifact's commit record. It is uploaded after every file, so an artifact
whose manifest is missing is an upload that has not finished (or was interrupted) and is
neither listed nor restored. It is read back as untrusted input (pydantic, bounded): a file
path in it is a plain relative path, never absolute and never `..`, so a manifest cannot
make a download write outside its target directory. `verify_directory` compares files on
disk with it, by size and SHA-256.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

FORMAT = 1
MANIFEST_SUFFIX = ".manifest.json"  # beside the artifact's files: `<artifact key>.manifest.json`
MAX_FILES = 100_000
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
HASH_CHUNK = 8 * 1024 * 1024
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class ManifestError(Exception):
    """A manifest that cannot be read, or files that do not match it."""


class ManifestFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    path: Annotated[str, Field(min_length=1, max_length=1024)]
    size: Annotated[int, Field(ge=0)]
    sha256: Sha256

    @field_validator("path")
    @classmethod
    def _plain_relative(cls, value: str) -> str:
        if any(part in ("..", ".", "") for part in value.split("/")):
            raise ValueError("must be a plain relative path")
        if "\\" in value or not value.isprintable() or value.endswith(MANIFEST_SUFFIX):
            raise ValueError("must be a plain relative path")
        return value


class Manifest(BaseModel):
    """One stored artifact: which job, what kind, and every file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: int = FORMAT
    job_id: Annotated[str, Field(max_length=64)]
    kind: Annotated[str, Field(max_length=32)]
    name: Annotated[str, Field(max_length=200)]
    step: int | None = None
    files: Annotated[tuple[ManifestFile, ...], Field(max_length=MAX_FILES)]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def to_bytes(self) -> bytes:
        return json.dumps(self.model_dump(mode="json"), indent=1, sort_keys=True).encode()

    def sha256(self) -> str:
        """The manifest's own digest: it names the artifact's whole content."""
        return hashlib.sha256(self.to_bytes()).hexdigest()


def parse_manifest(data: bytes) -> Manifest:
    """The manifest in `data`; ManifestError when it is not one."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"manifest of {len(data)} bytes is over {MAX_MANIFEST_BYTES}")
    try:
        manifest = Manifest.model_validate_json(data)
    except ValidationError as exc:
        raise ManifestError(f"not a manifest: {exc.errors()[0]['msg']}") from None
    if manifest.format != FORMAT:
        raise ManifestError(f"manifest format {manifest.format} is not {FORMAT}")
    if len({f.path for f in manifest.files}) != len(manifest.files):
        raise ManifestError("manifest lists a file twice")
    return manifest


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def scan_directory(root: Path) -> tuple[ManifestFile, ...]:
    """Every regular file under `root`, sorted, with size and SHA-256. Symbolic links are
    refused: a checkpoint is plain files, and a link could name anything on the worker."""
    found: list[ManifestFile] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames) + [d for d in dirnames if Path(dirpath, d).is_symlink()]:
            path = Path(dirpath, name)
            if path.is_symlink() or not path.is_file():
                raise ManifestError(f"{path} is not a regular file")
            relative = path.relative_to(root).as_posix()
            found.append(
                ManifestFile(path=relative, size=path.stat().st_size, sha256=file_sha256(path))
            )
    return tuple(sorted(found, key=lambda f: f.path))


def verify_file(path: Path, expected: ManifestFile) -> str | None:
    """Why `path` is not the file the manifest lists (None: it is)."""
    if not path.is_file() or path.is_symlink():
        return f"{expected.path}: missing"
    if path.stat().st_size != expected.size:
        return f"{expected.path}: {path.stat().st_size} bytes, the manifest says {expected.size}"
    if file_sha256(path) != expected.sha256:
        return f"{expected.path}: SHA-256 differs from the manifest"
    return None


def verify_directory(root: Path, manifest: Manifest) -> list[str]:
    """What differs between `root` and the manifest's files ([]: every file matches)."""
    problems = [p for f in manifest.files if (p := verify_file(root / f.path, f)) is not None]
    listed = {f.path for f in manifest.files}
    extra = [p for p in scan_paths(root) if p not in listed]
    return problems + [f"{p}: not in the manifest" for p in extra]


def scan_paths(root: Path) -> list[str]:
    """The relative paths of every file under `root` (no hashing)."""
    if not root.is_dir():
        return []
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if not p.is_dir())
