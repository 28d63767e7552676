"""Numbers spelled as strings (`eps: "1e-8"`) become numbers where the keyword takes one
(jobs.recipe.automodel.numbers), as AutoModel's config loader reads them: what validates
reaches the optimizer as a float."""

from __future__ import annotations

import pytest
from recipe_asserts import error_at

from jobs.recipe.automodel.numbers import fold_numeric_strings, spelled_number
from jobs.recipe.typed import Recipe


@pytest.mark.parametrize(
    ("text", "number"),
    [("1e-8", 1e-8), ("64", 64), ("-0.5", -0.5), (".5e-3", 5e-4), ("1.", 1.0), ("2E5", 2e5)],
)
def test_spelled_numbers(text, number):
    assert spelled_number(text) == number and type(spelled_number(text)) is type(number)


@pytest.mark.parametrize("text", ["nan", "inf", "1e400", "0x10", "1_000", "cosine", "", "1e"])
def test_other_strings_are_not_numbers(text):
    assert spelled_number(text) is None


def test_optimizer_strings_reach_the_typed_recipe_as_numbers(validate, recipe):
    recipe["optimizer"] = {"_target_": "torch.optim.Adam", "lr": "1e-3", "eps": "1e-8",
                           "betas": ["0.9", 0.95], "weight_decay": "0"}  # fmt: skip
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    kwargs = Recipe.from_json(result.recipe).optimizer.kwargs
    assert kwargs == {"lr": 1e-3, "eps": 1e-8, "betas": [0.9, 0.95], "weight_decay": 0}


def test_only_numeric_keywords_are_rewritten():
    data = {
        "lr_scheduler": {"_target_": "x", "lr_decay_style": "cosine", "lr_warmup_steps": "10"},
        "loss_fn": {"_target_": "y", "reduction": "mean", "ignore_index": "-100"},
        "dataset": {"_target_": "z", "split": "2024", "path_or_dataset": "7", "seq_len": "128"},
        "model": {"pretrained_model_name_or_path": "123"},
    }
    fold_numeric_strings(data)
    assert data["lr_scheduler"] == {"_target_": "x", "lr_decay_style": "cosine",
                                    "lr_warmup_steps": 10}  # fmt: skip
    assert data["loss_fn"]["ignore_index"] == -100 and data["loss_fn"]["reduction"] == "mean"
    assert data["dataset"] == {"_target_": "z", "split": "2024", "path_or_dataset": "7",
                               "seq_len": 128}  # fmt: skip
    assert data["model"] == {"pretrained_model_name_or_path": "123"}


def test_a_word_where_a_number_belongs_is_still_refused(validate, recipe):
    recipe["optimizer"]["lr"] = "fast"
    assert "must be a number" in error_at(validate(recipe), "optimizer.lr").msg
