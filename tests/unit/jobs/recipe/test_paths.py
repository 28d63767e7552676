"""Allowed roots for model, tokenizer, data and checkpoint paths (issue 2, section 7)."""

from __future__ import annotations

import os

import pytest
from recipe_asserts import error_at

from jobs.recipe.paths import is_hub_name

DATA_FIELDS = [
    ("model", "pretrained_model_name_or_path"),
    ("dataset", "path_or_dataset"),
    ("dataset", "tokenizer_name_or_path"),
]


@pytest.mark.parametrize(("section", "key"), DATA_FIELDS)
def test_absolute_path_outside_the_roots(validate, recipe, tmp_path, section, key):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    recipe[section][key] = str(outside)
    assert "outside" in error_at(validate(recipe), f"{section}.{key}").msg


@pytest.mark.parametrize(("section", "key"), DATA_FIELDS)
def test_dotdot_escape(validate, recipe, data_root, section, key):
    recipe[section][key] = str(data_root / ".." / "ckpt")
    assert "'..'" in error_at(validate(recipe), f"{section}.{key}").msg


def test_relative_dotdot_escape(validate, recipe, data_root, monkeypatch):
    monkeypatch.chdir(data_root)
    recipe["dataset"]["path_or_dataset"] = "../ckpt"
    error_at(validate(recipe), "dataset.path_or_dataset")


def test_relative_path_inside_a_root_is_made_absolute(validate, recipe, data_root, monkeypatch):
    monkeypatch.chdir(data_root)
    recipe["dataset"]["path_or_dataset"] = "squad"
    result = validate(recipe)
    assert result.recipe["dataset"]["path_or_dataset"] == str(data_root / "squad")


def test_symlink_leading_out(validate, recipe, data_root, tmp_path):
    target = tmp_path / "secret"
    target.mkdir()
    os.symlink(target, data_root / "link")
    recipe["dataset"]["path_or_dataset"] = str(data_root / "link")
    assert "symlink" in error_at(validate(recipe), "dataset.path_or_dataset").msg


def test_missing_local_path(validate, recipe, data_root):
    recipe["dataset"]["path_or_dataset"] = str(data_root / "nothing" / "here")
    assert "does not exist" in error_at(validate(recipe), "dataset.path_or_dataset").msg


def test_hub_names_stay_allowed(validate, recipe):
    recipe["model"]["pretrained_model_name_or_path"] = "meta-llama/Llama-3.2-1B"
    recipe["dataset"].update(path_or_dataset="rajpurkar/squad", tokenizer_name_or_path="org/tok")
    result = validate(recipe)
    assert result.valid and result.recipe["dataset"]["path_or_dataset"] == "rajpurkar/squad"


@pytest.mark.parametrize(
    ("value", "hub"),
    [
        ("org/name", True),
        ("org/name-1.5B", True),
        ("/org/name", False),
        ("../x", False),
        ("a/b/c", False),
        ("org/..", False),
        ("name", False),
    ],
)
def test_hub_name_form(value, hub):
    assert is_hub_name(value) is hub


def test_validation_dataset_paths_are_checked(validate, recipe, tmp_path):
    recipe["validation_dataset"] = {
        "_target_": "tuneyard.datasets.SquadDataset",
        "path_or_dataset": str(tmp_path),
        "split": "validation",
    }
    error_at(validate(recipe), "validation_dataset.path_or_dataset")


def test_jsonl_dataset_path_is_checked(validate, recipe, tmp_path):
    recipe["dataset"] = {
        "_target_": "tuneyard.datasets.JsonlInstructionDataset",
        "path": "/etc/passwd",
    }
    error_at(validate(recipe), "dataset.path")


def test_checkpoint_dir_inside_checkpoint_roots(validate, recipe, ckpt_root, data_root):
    recipe["checkpoint"] = {"checkpoint_dir": str(ckpt_root / "new" / "dir")}
    result = validate(recipe)
    assert result.valid and result.recipe["checkpoint"]["checkpoint_dir"].startswith(str(ckpt_root))
    recipe["checkpoint"] = {"checkpoint_dir": str(data_root / "ckpts")}
    assert (
        "TUNEYARD_CHECKPOINT_ROOTS" in error_at(validate(recipe), "checkpoint.checkpoint_dir").fix
    )


def test_restore_from_path_rules(validate, recipe, ckpt_root, tmp_path):
    recipe["restore_from"] = {"path": str(tmp_path / "elsewhere")}
    error_at(validate(recipe), "restore_from.path")
    recipe["restore_from"] = {"path": str(ckpt_root / "missing")}
    assert "does not exist" in error_at(validate(recipe), "restore_from.path").msg
    recipe["restore_from"] = {"path": str(ckpt_root / ".." / "data")}
    error_at(validate(recipe), "restore_from.path")
    recipe["restore_from"] = {"path": "LATEST"}
    assert validate(recipe).valid


def test_empty_path_value(validate, recipe):
    recipe["dataset"]["path_or_dataset"] = ""
    error_at(validate(recipe), "dataset.path_or_dataset")
