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


NEW_SECTIONS = ["wandb", "mlflow", "tokenizer", "distributed_config", "parallelizer",
                "autopipeline", "benchmark", "teacher_model", "kd_loss_fn"]  # fmt: skip
NESTED = [
    ("model", "config"), ("model", "num_hidden_layers"), ("dataset", "tokenizer"),
    ("dataset", "paths"), ("dataset", "file_pattern"), ("distributed", "mp_policy"),
    ("checkpoint", "is_async"), ("packed_sequence", "drop_long_samples"),
]  # fmt: skip
ODD = [*WEIRD, None, "", "*", "../*", [0.5, {"x": 1}], {"_target_": "transformers.LlamaConfig"},
       {"_target_": "transformers.AutoConfig.from_pretrained"}, "\x00", -1]  # fmt: skip


@pytest.mark.parametrize("section", NEW_SECTIONS)
@pytest.mark.parametrize("value", ODD, ids=repr)
def test_odd_values_in_the_newer_sections_never_raise(validate, recipe, section, value):
    recipe[section] = value
    json.dumps(validate(recipe).to_dict())  # valid, or errors at fields: never an exception


@pytest.mark.parametrize(("section", "key"), NESTED)
@pytest.mark.parametrize("value", ODD, ids=repr)
def test_odd_nested_values_never_raise(validate, recipe, section, key, value):
    recipe.setdefault(section, {})[key] = value
    if section == "dataset":
        recipe["dataset"]["_target_"] = "tuneyard.datasets.MegatronPretraining"
    json.dumps(validate(recipe).to_dict())
