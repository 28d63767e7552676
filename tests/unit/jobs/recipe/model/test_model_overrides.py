"""Config attribute overrides as model keywords, and `model.config` as a nested AutoConfig
(jobs.recipe.model.overrides)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from recipe_asserts import TINY_LLAMA_PARAMS, error_at

from jobs.recipe.validation import validate_job

FROM_CONFIG = "tuneyard.models.AutoModelForCausalLM.from_config"
AUTO_CONFIG = "transformers.AutoConfig.from_pretrained"


def _warnings(result) -> dict[str, str]:
    return {w.loc: w.msg for w in result.warnings}


def test_a_config_attribute_that_keeps_shapes_is_accepted_on_from_pretrained(validate, recipe):
    recipe["model"]["max_position_embeddings"] = 128
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    assert result.recipe["model"]["max_position_embeddings"] == 128


def test_name_or_path_is_an_attribute_of_every_config(validate, recipe):
    """AutoModel's config blocks pass `name_or_path` (PretrainedConfig's own attribute, which
    config.json leaves out)."""
    recipe["model"]["name_or_path"] = "org/model"
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]


def test_an_unknown_attribute_is_refused_with_a_did_you_mean(validate, recipe):
    recipe["model"]["num_hiden_layers"] = 1
    err = error_at(validate(recipe), "model.num_hiden_layers")
    assert "has no attribute 'num_hiden_layers'" in err.msg
    assert "num_hidden_layers" in err.fix


def test_a_value_of_another_type_is_refused(validate, recipe):
    recipe["model"]["max_position_embeddings"] = "long"
    err = error_at(validate(recipe), "model.max_position_embeddings")
    assert "must be a number" in err.msg


def test_a_shape_change_on_a_checkpoint_load_is_refused(validate, recipe):
    recipe["model"]["num_hidden_layers"] = 1
    err = error_at(validate(recipe), "model.num_hidden_layers")
    assert "weight shape" in err.msg and "from_config" in err.fix


def test_overriding_with_the_stored_value_is_not_a_shape_change(validate, recipe):
    recipe["model"]["num_hidden_layers"] = 2
    assert validate(recipe).valid


def test_from_config_takes_shape_overrides_and_the_plan_counts_them(validate, recipe, model_dir):
    recipe["model"] = {"_target_": FROM_CONFIG, "config": str(model_dir), "num_hidden_layers": 1}
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    assert result.plan["param_count"] < TINY_LLAMA_PARAMS


def test_nested_auto_config_is_checked_and_its_overrides_too(validate, recipe, model_dir):
    recipe["model"] = {
        "_target_": FROM_CONFIG,
        "config": {"_target_": AUTO_CONFIG, "pretrained_model_name_or_path": str(model_dir),
                   "num_hidden_layers": 1},
    }  # fmt: skip
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    assert result.plan["architecture"] == "LlamaForCausalLM"
    assert result.plan["param_count"] < TINY_LLAMA_PARAMS
    recipe["model"]["config"]["hidden_sise"] = 32
    assert "hidden_size" in error_at(validate(recipe), "model.config.hidden_sise").fix


def test_nested_auto_config_path_stays_inside_the_data_roots(validate, recipe, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    recipe["model"] = {
        "_target_": FROM_CONFIG,
        "config": {"_target_": AUTO_CONFIG, "pretrained_model_name_or_path": str(outside)},
    }
    error_at(validate(recipe), "model.config.pretrained_model_name_or_path")


def test_nested_config_must_be_a_config_loader(validate, recipe):
    recipe["model"] = {"_target_": FROM_CONFIG, "config": {"_target_": "torch.optim.AdamW"}}
    assert "takes a config" in error_at(validate(recipe), "model.config._target_").msg


def test_unreadable_config_accepts_overrides_with_a_warning(validate, recipe: dict[str, Any]):
    recipe["model"]["pretrained_model_name_or_path"] = "some-org/not-cached"
    recipe["model"]["num_hidden_layers"] = 1
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    assert "accepted unchecked" in _warnings(result)["model.num_hidden_layers"]


@pytest.mark.parametrize("value", [None, [1], {"a": 1}])
def test_odd_override_values_never_raise(validate, recipe, value):
    recipe["model"]["max_position_embeddings"] = value
    validate(recipe)  # an error or a pass, never an exception


@pytest.mark.parametrize(
    ("key", "limit"), [("hidden_size", 2**17), ("num_hidden_layers", 2**12), ("vocab_size", 2**22)]
)
@pytest.mark.parametrize("readable", [True, False])
def test_a_size_override_past_its_maximum_is_refused_at_its_field(
    validate, recipe, model_dir, key, limit, readable
):
    """Whether or not the config is readable, a size the plan reads is a whole number up to
    its maximum (jobs.recipe.load.limits), refused at the field rather than dropping the
    estimate; at the maximum it passes this check."""
    source = str(model_dir) if readable else "some-org/not-cached"
    recipe["model"] = {"_target_": FROM_CONFIG, "config": source, key: limit + 1}
    err = error_at(validate(recipe), f"model.{key}")
    assert str(limit) in err.msg and str(limit) in err.fix
    for bad in (0, -1, 1.5, True, "8"):
        recipe["model"][key] = bad
        error_at(validate(recipe), f"model.{key}")
    recipe["model"][key] = limit
    assert not [e for e in validate(recipe).errors if "must be a whole number" in e.msg]
    nested = {"_target_": AUTO_CONFIG, "pretrained_model_name_or_path": source, key: limit + 1}
    recipe["model"] = {"_target_": FROM_CONFIG, "config": nested}
    error_at(validate(recipe), f"model.config.{key}")


@pytest.mark.parametrize(
    "loader", [FROM_CONFIG, "tuneyard.models.AutoModelForCausalLM.from_pretrained"]
)
@pytest.mark.parametrize(
    ("key", "value"),
    [("trust_remote_code", True), ("torch_dtype", "bfloat16"), ("attn_implementation", "sdpa")],
)
def test_loader_keywords_are_never_config_overrides(
    validate, settings, recipe, model_dir, loader, key, value
):
    """With the config readable, a loader's own keyword is not checked as a config
    attribute ("config has no attribute 'trust_remote_code'"); remote code is then only a
    question of the grant."""
    source = "config" if loader == FROM_CONFIG else "pretrained_model_name_or_path"
    recipe["model"] = {"_target_": loader, source: str(model_dir), key: value}
    granted = settings.model_copy(update={"allow_remote_code": True})
    result = validate_job(copy.deepcopy(recipe), settings=granted)
    assert not [e for e in result.errors if "has no attribute" in e.msg], result.errors
    assert f"model.{key}" not in _warnings(result)
