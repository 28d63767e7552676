"""Megatron prefixes and globs as path values (jobs.recipe.paths.forms)."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.recipe.paths.forms import GLOB, PREFIX, check_file_set


@pytest.fixture
def roots(tmp_path: Path) -> list[Path]:
    data = tmp_path / "data"
    (data / "corpus").mkdir(parents=True)
    for name in ("web_text_document", "code_text_document"):
        for suffix in (".bin", ".idx"):
            (data / "corpus" / f"{name}{suffix}").write_bytes(b"x")
    (data / "corpus" / "half_text_document.bin").write_bytes(b"x")
    return [data]


def _err(check) -> str:
    assert check.kind == "invalid", check
    return check.errors[0].msg


def test_a_prefix_with_both_halves_is_a_local_path(roots):
    prefix = str(roots[0] / "corpus" / "web_text_document")
    check = check_file_set(prefix, "dataset.paths.1", roots, PREFIX)
    assert check.kind == "local" and str(check.path) == prefix


def test_a_prefix_missing_its_index_is_refused(roots):
    msg = _err(check_file_set(str(roots[0] / "corpus" / "half_text_document"), "l", roots, PREFIX))
    assert "half_text_document.idx does not exist" in msg


def test_a_prefix_outside_the_roots_is_refused_before_looking(roots, tmp_path):
    assert "outside" in _err(check_file_set(str(tmp_path / "elsewhere"), "l", roots, PREFIX))
    assert "'..'" in _err(check_file_set(str(roots[0] / ".." / "x"), "l", roots, PREFIX))


def test_a_prefix_glob_names_complete_pairs(roots):
    pattern = str(roots[0] / "corpus" / "*_text_document*")
    assert "idx" in _err(check_file_set(pattern, "l", roots, PREFIX))  # half_... lacks its .idx
    pattern = str(roots[0] / "corpus" / "[wc]*_text_document*")
    assert check_file_set(pattern, "l", roots, PREFIX).kind == "local"


def test_a_glob_must_match_and_stay_inside(roots, tmp_path):
    assert check_file_set(str(roots[0] / "corpus" / "*.bin"), "l", roots, GLOB).kind == "local"
    assert "matches no file" in _err(check_file_set(str(roots[0] / "none_*.bin"), "l", roots, GLOB))
    assert "'..'" in _err(check_file_set(str(roots[0] / ".." / "*.bin"), "l", roots, GLOB))
    assert "outside" in _err(check_file_set(str(tmp_path / "*.bin"), "l", roots, GLOB))


def test_a_glob_match_that_is_a_symlink_out_is_refused(roots, tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"s")
    (roots[0] / "corpus" / "link.bin").symlink_to(secret)
    assert "symlink" in _err(check_file_set(str(roots[0] / "corpus" / "*.bin"), "l", roots, GLOB))


def test_an_existing_file_is_a_plain_path(roots):
    file = str(roots[0] / "corpus" / "web_text_document.bin")
    assert check_file_set(file, "l", roots, PREFIX).kind == "local"
    assert check_file_set(12, "l", roots, GLOB).kind == "invalid"


def test_a_glob_naming_too_many_files_is_refused(roots, monkeypatch):
    import jobs.recipe.paths.forms as path_forms

    monkeypatch.setattr(path_forms, "MAX_MATCHES", 2)
    msg = _err(check_file_set(str(roots[0] / "corpus" / "*"), "l", roots, GLOB))
    assert "more than 2 files" in msg


def test_a_glob_resolves_the_roots_once_not_once_per_file(tmp_path, monkeypatch):
    """A pattern over many shards checks each file against roots resolved once: 40 files and
    3 roots cost 3 + 41 resolutions (the roots, the pattern's directory, each file), where
    resolving the roots per file cost 4 for every file."""
    import os.path

    roots = [tmp_path / name for name in ("a", "b", "data")]
    for root in roots:
        root.mkdir()
    for index in range(40):
        (roots[2] / f"shard_{index:02d}.parquet").write_bytes(b"x")
    real = os.path.realpath
    calls = []
    monkeypatch.setattr(os.path, "realpath", lambda p, **kw: calls.append(p) or real(p, **kw))
    check = check_file_set(str(roots[2] / "shard_*.parquet"), "dataset.data_files", roots, GLOB)
    assert check.kind == "local", check.errors
    assert len(calls) == 3 + 1 + 40
