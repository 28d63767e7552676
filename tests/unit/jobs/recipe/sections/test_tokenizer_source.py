"""A model built from a config has no tokenizer files: a dataset that needs a tokenizer is
refused at `tokenizer` unless the recipe gives one (jobs.recipe.sections.tokenizer_source)."""

from __future__ import annotations

import pytest
from recipe_asserts import TINY_LLAMA_CONFIG, error_at

from jobs.recipe.typed import Recipe


@pytest.fixture
def from_config(recipe):
    """A model built from a config written in the recipe: no files behind it."""
    config = {k: v for k, v in TINY_LLAMA_CONFIG.items() if k != "model_type"}
    recipe["model"] = {
        "_target_": "tuneyard.models.AutoModelForCausalLM.from_config",
        "config": {"_target_": "transformers.LlamaConfig", **config},
        "dtype": "float32",
    }
    return recipe


def test_a_from_config_model_without_a_tokenizer_is_refused(validate, from_config):
    error = error_at(validate(from_config), "tokenizer")
    assert "from a config written in the recipe" in error.msg and "SquadDataset" in error.msg
    assert "tokenizer_name_or_path" in error.fix and "pretrained_model_name_or_path" in error.fix


def test_a_tokenizer_section_gives_it(validate, from_config, model_dir):
    from_config["tokenizer"] = {
        "_target_": "tuneyard.tokenizers.AutoTokenizer.from_pretrained",
        "pretrained_model_name_or_path": str(model_dir),
    }
    result = validate(from_config)
    assert result.valid, [str(e) for e in result.errors]


def test_the_datasets_tokenizer_name_gives_it(validate, from_config, model_dir):
    from_config["dataset"]["tokenizer_name_or_path"] = str(model_dir)
    result = validate(from_config)
    assert result.valid, [str(e) for e in result.errors]


def test_a_pretrained_model_brings_its_own(validate, recipe):
    result = validate(recipe)
    assert result.valid and not any(e.loc == "tokenizer" for e in result.errors)


@pytest.mark.parametrize("nested", [False, True])
def test_the_configs_directory_gives_it_as_in_automodel(validate, recipe, model_dir, nested):
    auto_config = "transformers.AutoConfig.from_pretrained"
    nested_config = {"_target_": auto_config, "pretrained_model_name_or_path": str(model_dir)}
    config = nested_config if nested else str(model_dir)
    recipe["model"] = {
        "_target_": "tuneyard.models.AutoModelForCausalLM.from_config",
        "config": config,
        "dtype": "float32",
    }
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    assert Recipe.from_json(result.recipe).tokenizer_source == str(model_dir)
