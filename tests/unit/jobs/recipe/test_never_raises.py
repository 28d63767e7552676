"""validate_job answers every malformed recipe with errors, never with an exception."""

from __future__ import annotations

import json

import pytest
from recipe_asserts import error_at

WEIRD = [5, "x", [1], True, 1.5, {"_target_": 5}, {"_target_": ["a"]}, {"a": {"b": 1}}]
SECTIONS = [
    "model",
    "dataset",
    "validation_dataset",
    "optimizer",
    "lr_scheduler",
    "loss_fn",
    "step_scheduler",
    "dataloader",
    "distributed",
    "checkpoint",
    "peft",
    "restore_from",
    "packed_sequence",
    "compile",
    "rng",
    "fp8",
    "recipe",
]


@pytest.mark.parametrize("section", SECTIONS)
@pytest.mark.parametrize("value", WEIRD, ids=repr)
def test_weird_section_values(validate, recipe, section, value):
    recipe[section] = value
    result = validate(recipe)
    assert not result.valid and result.errors
    json.dumps(result.to_dict())


@pytest.mark.parametrize("section", ["dataloader", "rng", "distributed", "step_scheduler"])
@pytest.mark.parametrize("value", [[1], {"a": 1}, 5])
def test_unhashable_or_odd_targets_in_fixed_sections(validate, recipe, section, value):
    recipe.setdefault(section, {})["_target_"] = value
    error_at(validate(recipe), f"{section}._target_")


@pytest.mark.parametrize("section", ["model", "dataset", "optimizer"])
def test_target_section_that_is_not_a_mapping(validate, recipe, section):
    recipe[section] = "torch.optim.AdamW"
    assert "mapping" in error_at(validate(recipe), section).msg


def test_a_recipe_file_that_is_not_utf8(validate, tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_bytes(b"model: \xff\n")
    assert "UTF-8" in error_at(validate(path), "<recipe>").msg
