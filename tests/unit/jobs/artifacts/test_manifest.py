"""An artifact's manifest: every file with size and SHA-256, read back as untrusted input,
and a directory checked against it file by file."""

from __future__ import annotations

import hashlib
import json

import pytest

from jobs.artifacts.manifest import (
    Manifest,
    ManifestError,
    parse_manifest,
    scan_directory,
    verify_directory,
)


def _checkpoint(root):
    (root / "model").mkdir(parents=True)
    (root / "model" / "weights.safetensors").write_bytes(b"\x00" * 1000)
    (root / "trainer_state.json").write_text('{"step": 3}')
    return root


def test_scan_lists_every_file_sorted_with_size_and_sha256(tmp_path) -> None:
    files = scan_directory(_checkpoint(tmp_path / "step_3"))
    assert [(f.path, f.size) for f in files] == [
        ("model/weights.safetensors", 1000),
        ("trainer_state.json", 11),
    ]
    assert files[1].sha256 == hashlib.sha256(b'{"step": 3}').hexdigest()


def test_a_symlink_is_refused(tmp_path) -> None:
    root = _checkpoint(tmp_path / "step_3")
    (root / "link").symlink_to("/etc/passwd")
    with pytest.raises(ManifestError, match="not a regular file"):
        scan_directory(root)


def test_a_manifest_round_trips_and_its_digest_names_its_content(tmp_path) -> None:
    files = scan_directory(_checkpoint(tmp_path / "step_3"))
    manifest = Manifest(job_id="j", kind="checkpoint", name="step_3", step=3, files=files)
    again = parse_manifest(manifest.to_bytes())
    assert again == manifest and again.sha256() == manifest.sha256()
    assert manifest.size == 1011
    other = Manifest(job_id="j", kind="checkpoint", name="step_3", step=3, files=files[:1])
    assert other.sha256() != manifest.sha256()


@pytest.mark.parametrize(
    "path", ["/etc/passwd", "../outside", "a/../../b", "a//b", "./a", "a\\..\\b", "x.manifest.json"]
)
def test_a_manifest_cannot_name_a_path_outside_its_directory(path: str) -> None:
    body = {"format": 1, "job_id": "j", "kind": "checkpoint", "name": "step_1", "step": 1,
            "files": [{"path": path, "size": 1, "sha256": "0" * 64}]}  # fmt: skip
    with pytest.raises(ManifestError, match="plain relative path"):
        parse_manifest(json.dumps(body).encode())


@pytest.mark.parametrize(
    "data",
    [b"", b"[]", b"{not json", b'{"format": 2, "job_id": "j", "kind": "k", "name": "n", "files": []}',
     b'{"format": 1, "job_id": "j", "kind": "k", "name": "n", "files": [], "extra": 1}'],
)  # fmt: skip
def test_what_is_not_a_manifest_is_refused(data: bytes) -> None:
    with pytest.raises(ManifestError):
        parse_manifest(data)


def test_a_file_listed_twice_is_refused() -> None:
    entry = {"path": "a", "size": 1, "sha256": "0" * 64}
    body = {"job_id": "j", "kind": "checkpoint", "name": "n", "files": [entry, entry]}
    with pytest.raises(ManifestError, match="twice"):
        parse_manifest(json.dumps(body).encode())


def test_verification_names_each_file_that_differs(tmp_path) -> None:
    root = _checkpoint(tmp_path / "step_3")
    manifest = Manifest(job_id="j", kind="checkpoint", name="step_3", files=scan_directory(root))
    assert verify_directory(root, manifest) == []
    (root / "trainer_state.json").write_text('{"step": 4}')  # same size, other bytes
    (root / "model" / "weights.safetensors").write_bytes(b"\x00" * 10)  # cut short
    (root / "stray.bin").write_bytes(b"x")
    assert verify_directory(root, manifest) == [
        "model/weights.safetensors: 10 bytes, the manifest says 1000",
        "trainer_state.json: SHA-256 differs from the manifest",
        "stray.bin: not in the manifest",
    ]
    (root / "trainer_state.json").unlink()
    assert "trainer_state.json: missing" in verify_directory(root, manifest)
