"""Knowledge-distillation recipes (`recipe: llm_kd`, jobs.recipe.sections.kd): accepted, typed, checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from recipe_asserts import TINY_LLAMA_CONFIG, error_at, locs, write_model_dir

from jobs.recipe.typed import Recipe

AM = "nemo_automodel"
KD_CLASS = f"{AM}.recipes.llm.kd.KnowledgeDistillationRecipeForNextTokenPrediction"


@pytest.fixture
def teacher_dir(data_root: Path) -> Path:
    return write_model_dir(data_root / "teacher", {**TINY_LLAMA_CONFIG, "num_hidden_layers": 4})


@pytest.fixture
def kd_recipe(recipe: dict[str, Any], teacher_dir: Path) -> dict[str, Any]:
    """The test recipe as AutoModel's llm_kd example writes its KD keys."""
    recipe["recipe"] = {"_target_": KD_CLASS}
    recipe["teacher_model"] = {
        "_target_": f"{AM}.NeMoAutoModelForCausalLM.from_pretrained",
        "pretrained_model_name_or_path": str(teacher_dir),
        "torch_dtype": "bf16",
    }
    recipe["kd_loss_fn"] = {
        "_target_": f"{AM}.components.loss.kd_loss.KDLoss",
        "ignore_index": -100,
        "temperature": 2.0,
        "fp32_upcast": True,
    }
    recipe["kd_ratio"] = 0.25
    return recipe


def test_automodel_kd_recipe_validates_and_types_its_keys(validate, kd_recipe):
    result = validate(kd_recipe)
    assert result.valid, [str(e) for e in result.errors]
    typed = result.typed
    assert typed.recipe == "llm_kd"
    assert typed.kd_ratio == 0.25
    assert typed.kd_loss_fn.kwargs["temperature"] == 2.0
    assert (
        typed.teacher_model.kwargs["pretrained_model_name_or_path"]
        == kd_recipe["teacher_model"]["pretrained_model_name_or_path"]
    )
    assert Recipe.from_json(typed.to_json()) == typed


@pytest.mark.parametrize("name", ["llm_kd", "KnowledgeDistillationRecipeForNextTokenPrediction"])
def test_short_and_class_names_get_kd_defaults(validate, kd_recipe, name):
    kd_recipe["recipe"] = name
    del kd_recipe["kd_loss_fn"], kd_recipe["kd_ratio"]
    typed = validate(kd_recipe).typed
    assert typed is not None and typed.recipe == "llm_kd"
    assert typed.kd_loss_fn.target == "tuneyard.loss.KDLoss"
    assert typed.kd_ratio == 0.5


def test_finetune_recipe_has_no_kd_fields(validate, recipe):
    typed = validate(recipe).typed
    assert (typed.teacher_model, typed.kd_loss_fn, typed.kd_ratio) == (None, None, None)
    assert Recipe.from_json(typed.to_json()) == typed


@pytest.mark.parametrize("key", ["teacher_model", "kd_loss_fn", "kd_ratio"])
def test_kd_keys_on_a_finetune_recipe_name_llm_kd(validate, kd_recipe, key):
    kd_recipe["recipe"] = "llm_finetune"
    error = error_at(validate(kd_recipe), key)
    assert "knowledge-distillation" in error.msg and "llm_kd" in error.fix


def test_kd_recipe_needs_a_teacher(validate, kd_recipe):
    del kd_recipe["teacher_model"]
    assert "required" in error_at(validate(kd_recipe), "teacher_model").msg


@pytest.mark.parametrize("value", [1.5, -0.1, "half", True, float("nan")])
def test_kd_ratio_is_a_number_in_unit_interval(validate, kd_recipe, value):
    kd_recipe["kd_ratio"] = value
    assert "kd_ratio" in locs(validate(kd_recipe))


@pytest.mark.parametrize("ratio", [0, 1])
def test_kd_ratio_bounds_are_allowed(validate, kd_recipe, ratio):
    kd_recipe["kd_ratio"] = ratio
    assert validate(kd_recipe).typed.kd_ratio == float(ratio)


def test_vocab_sizes_must_match(validate, kd_recipe, data_root):
    other = write_model_dir(data_root / "big_vocab", {**TINY_LLAMA_CONFIG, "vocab_size": 1024})
    kd_recipe["teacher_model"]["pretrained_model_name_or_path"] = str(other)
    error = error_at(validate(kd_recipe), "teacher_model")
    assert "1024" in error.msg and "512" in error.msg


def test_teacher_outside_data_roots_is_refused(validate, kd_recipe, tmp_path):
    outside = write_model_dir(tmp_path / "elsewhere" / "teacher")
    kd_recipe["teacher_model"]["pretrained_model_name_or_path"] = str(outside)
    assert "teacher_model.pretrained_model_name_or_path" in locs(validate(kd_recipe))


def test_teacher_remote_code_is_the_operators_decision(validate, kd_recipe):
    kd_recipe["teacher_model"]["trust_remote_code"] = True
    error = error_at(validate(kd_recipe), "teacher_model.trust_remote_code")
    assert "remote code" in error.msg


def test_teacher_target_goes_through_the_allowlist(validate, kd_recipe):
    kd_recipe["teacher_model"]["_target_"] = "os.system"
    assert "teacher_model._target_" in locs(validate(kd_recipe))


def test_teacher_must_be_a_model_and_kd_loss_a_loss(validate, kd_recipe):
    kd_recipe["teacher_model"] = {"_target_": "torch.optim.AdamW", "lr": 1e-3}
    kd_recipe["kd_loss_fn"] = {"_target_": "torch.optim.SGD", "lr": 1e-3}
    result = validate(kd_recipe)
    assert "not a model" in error_at(result, "teacher_model._target_").msg
    assert "not a loss" in error_at(result, "kd_loss_fn._target_").msg


def test_kd_loss_keys_are_checked(validate, kd_recipe):
    kd_recipe["kd_loss_fn"]["temprature"] = 2.0
    assert "kd_loss_fn.temprature" in locs(validate(kd_recipe))


@pytest.mark.parametrize("value", [0, -1.0, "hot"])
def test_kd_temperature_must_be_positive(validate, kd_recipe, value):
    kd_recipe["kd_loss_fn"]["temperature"] = value
    assert "kd_loss_fn.temperature" in locs(validate(kd_recipe))


def test_tensor_parallel_teacher_is_not_supported_yet(validate, kd_recipe):
    kd_recipe["distributed"] = {"strategy": "fsdp2", "tp_size": 2}
    error = error_at(validate(kd_recipe, nproc_per_node=2), "distributed.tp_size")
    assert "teacher" in error.msg and "not supported" in error.msg


def test_kd_recipe_on_two_ranks_shards_like_the_student(validate, kd_recipe):
    typed = validate(kd_recipe, nproc_per_node=2).typed
    assert typed is not None and typed.topology.dp_size == 2


def test_teacher_loader_kwargs_are_reported_ignored_like_the_students(validate, kd_recipe):
    kd_recipe["teacher_model"]["use_liger_kernel"] = False
    result = validate(kd_recipe)
    assert result.valid, [str(e) for e in result.errors]
    assert "teacher_model.use_liger_kernel" in [w.loc for w in result.warnings]


def test_a_stored_kd_recipe_resubmits_as_is(validate, kd_recipe):
    stored = validate(kd_recipe).recipe
    again = validate(stored)
    assert again.valid, [str(e) for e in again.errors]
    assert again.typed == Recipe.from_json(stored)


def test_a_granted_teacher_remote_code_shows_in_the_plan(validate, kd_recipe, settings):
    kd_recipe["teacher_model"]["trust_remote_code"] = True
    settings.allow_remote_code = True
    assert validate(kd_recipe).plan["trust_remote_code"] is True
