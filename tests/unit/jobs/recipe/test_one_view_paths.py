"""`one_view`'s memoised resolver answers exactly what `os.path.realpath` answers, on the
layouts that make resolving hard: relative and absolute links, links to links, `..` after
a link, hub-cache style `../../blobs` links, dangling links, missing tails and loops."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jobs.recipe.paths import one_view, real_path


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "data" / "sub").mkdir(parents=True)
    (root / "other" / "deep").mkdir(parents=True)
    (root / "hub" / "models--a--b" / "blobs").mkdir(parents=True)
    (root / "hub" / "models--a--b" / "snapshots" / "abc").mkdir(parents=True)
    (root / "hub" / "models--a--b" / "blobs" / "f1").write_text("{}")
    (root / "data" / "file.json").write_text("{}")
    os.symlink(
        "../../blobs/f1", root / "hub" / "models--a--b" / "snapshots" / "abc" / "config.json"
    )
    os.symlink("sub", root / "data" / "rel")  # relative, same directory
    os.symlink(root / "other", root / "data" / "abs")  # absolute
    os.symlink("abs/deep", root / "data" / "chain")  # a link through a link
    os.symlink("../other/deep/..", root / "data" / "updown")  # `..` inside the target
    os.symlink("nowhere", root / "data" / "dangling")
    os.symlink("loop_b", root / "data" / "loop_a")
    os.symlink("loop_a", root / "data" / "loop_b")
    os.symlink("/", root / "data" / "to_root")
    return root


CASES = [
    "data", "data/file.json", "data/rel", "data/rel/..", "data/abs", "data/abs/deep",
    "data/abs/..", "data/chain", "data/chain/..", "data/updown", "data/dangling",
    "data/dangling/more", "data/missing/tail/x", "data/./sub/../file.json", "data/loop_a",
    "data/loop_a/x", "data/to_root", "data/to_root/tmp",
    "hub/models--a--b/snapshots/abc/config.json",
]  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_matches_realpath(tree: Path, case: str) -> None:
    path = str(tree / case)
    with one_view():
        first, again = real_path(path), real_path(path)
    assert first == again == Path(os.path.realpath(path))


def test_one_view_shares_prefixes_and_a_relative_path_resolves_from_the_cwd(
    tree: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tree / "data")
    with one_view():
        answers = {case: real_path(tree / case) for case in CASES}
        assert real_path("rel") == Path(os.path.realpath("rel"))
    assert answers == {case: Path(os.path.realpath(tree / case)) for case in CASES}


def test_outside_a_view_nothing_is_kept(tree: Path) -> None:
    link = tree / "data" / "moving"
    os.symlink("sub", link)
    assert real_path(link) == tree / "data" / "sub"
    link.unlink()
    os.symlink("../other", link)
    assert real_path(link) == tree / "other"


def test_a_kept_small_file_is_read_again_once_it_changes(tmp_path: Path) -> None:
    from jobs.recipe.paths import read_bounded

    config = tmp_path / "config.json"
    config.write_text('{"a": 1}')
    assert read_bounded(config, "model", [tmp_path], 1024) == (b'{"a": 1}', [])
    config.write_text('{"a": 2}')  # same size, new content
    os.utime(config, ns=(1, 1))  # even with an old mtime: the ctime moved
    assert read_bounded(config, "model", [tmp_path], 1024) == (b'{"a": 2}', [])
    assert read_bounded(config, "model", [tmp_path], 4)[0] is None  # over a smaller cap
    replaced = tmp_path / "new.json"
    replaced.write_text('{"b": 3}')
    os.replace(replaced, config)  # another inode at the same path
    assert read_bounded(config, "model", [tmp_path], 1024) == (b'{"b": 3}', [])
    config.unlink()
    os.mkfifo(config)  # no longer a regular file: refused, never served from memory
    data, errors = read_bounded(config, "model", [tmp_path], 1024)
    assert data is None and "not a regular file" in errors[0].msg


def test_a_whole_path_is_answered_once_per_view_and_again_in_the_next(tree: Path) -> None:
    link = tree / "data" / "swapped"
    os.symlink("sub", link)
    with one_view():
        assert real_path(link) == tree / "data" / "sub"
        link.unlink()
        os.symlink("../other", link)
        assert real_path(link) == tree / "data" / "sub"  # one view: the first look holds
    with one_view():
        assert real_path(link) == tree / "other"


def test_roots_contain_their_subpaths_only_not_siblings_sharing_a_prefix(tmp_path: Path) -> None:
    from jobs.recipe.paths import check_path

    (tmp_path / "data").mkdir()
    (tmp_path / "data2").mkdir()
    (tmp_path / "data" / "x").mkdir()
    roots = [tmp_path / "data"]
    assert check_path(str(tmp_path / "data2"), "dataset.path", roots).kind == "invalid"
    assert check_path(str(tmp_path / "data" / "x"), "dataset.path", roots).kind == "local"
    assert check_path(str(tmp_path / "data"), "dataset.path", roots).kind == "local"
    assert check_path(str(tmp_path / "data2"), "dataset.path", [Path("/")]).kind == "local"
    escape = check_path(str(tmp_path / "data" / ".." / "data2"), "dataset.path", roots)
    assert escape.kind == "invalid" and "'..'" in escape.errors[0].msg
