"""The default roots (`jobs.recipe.settings.RecipeSettings`): TUNEYARD_HOME, which holds the
embedded database with the API key hashes, is never inside one, wherever the process runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jobs.recipe.paths.roots import check_checkpoint_path, check_data_path
from jobs.recipe.settings import RecipeSettings


def holds(root: Path, path: Path) -> bool:
    real_root, real_path = Path(os.path.realpath(root)), Path(os.path.realpath(path))
    return real_root == real_path or real_root in real_path.parents


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "share" / "tuneyard"
    home.mkdir(parents=True)
    (home / "tuneyard.db").write_bytes(b"SQLite format 3\x00")
    (home / "demo").mkdir()
    return home


@pytest.mark.parametrize("cwd", ["above", "home"])
def test_no_default_root_holds_the_home(home: Path, monkeypatch, cwd: str) -> None:
    monkeypatch.chdir(home.parent.parent if cwd == "above" else home)
    settings = RecipeSettings(home=home)
    data, checkpoints = settings.allowed_data_roots(), settings.allowed_checkpoint_roots()
    for roots in (data, checkpoints):
        assert not [root for root in roots if holds(root, home)], roots
    database = str(home / "tuneyard.db")
    assert check_data_path(database, "model.pretrained_model_name_or_path", data).errors
    restore = check_checkpoint_path(database, "restore_from", checkpoints, must_exist=True)
    assert restore.errors


def test_a_home_reached_through_a_symlink_is_still_left_out(home: Path, monkeypatch) -> None:
    link = home.parent.parent / "linked"
    link.symlink_to(home.parent)
    monkeypatch.chdir(home.parent.parent)
    settings = RecipeSettings(home=link / "tuneyard")
    assert not [root for root in settings.allowed_data_roots() if holds(root, home)]


def test_defaults_keep_a_separate_working_directory_and_the_demo(
    home: Path, tmp_path: Path, monkeypatch
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    roots = RecipeSettings(home=home).allowed_data_roots()
    assert Path.cwd() in roots and home / "demo" in roots and home not in roots
