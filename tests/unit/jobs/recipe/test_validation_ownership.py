"""Who owns the recipe dict `validate_job` normalizes: always its own copy, never the caller's."""

from __future__ import annotations

import copy

from jobs.recipe.validation import validate_job

AM = "nemo_automodel"


def test_the_callers_dict_is_left_as_it_was(recipe, settings):
    before = copy.deepcopy(recipe)
    result = validate_job(recipe, ["optimizer.lr=0.5"], None, settings)
    assert result.valid, result.errors
    assert recipe == before
    assert result.recipe["optimizer"]["lr"] == 0.5


def test_a_recipe_that_normalization_rewrites_is_left_as_it_was(recipe, settings):
    recipe["model"]["_target_"] = f"{AM}.NeMoAutoModelForCausalLM.from_pretrained"
    recipe["dataset"]["_target_"] = f"{AM}.components.datasets.llm.squad.make_squad_dataset"
    recipe["distributed"] = {"strategy": "fsdp2", "dp_size": "none", "tp_size": 1, "cp_size": 1}
    recipe["lr_scheduler"] = {"lr_decay_style": "cosine", "min_lr": 1.0e-6}
    before = copy.deepcopy(recipe)
    result = validate_job(recipe, (), None, settings)
    assert result.valid, result.errors
    assert recipe == before
    assert "distributed" not in result.recipe  # rewritten: AutoModel's section became ours
    assert "_target_" in result.recipe["lr_scheduler"] and "_target_" not in recipe["lr_scheduler"]
    again = validate_job(recipe, (), None, settings)  # the same dict validates the same way
    assert again.recipe == result.recipe and again.plan == result.plan


def test_a_refused_recipe_is_left_as_it_was(recipe, settings):
    recipe["model"]["_target_"] = f"{AM}.NeMoAutoModelForCausalLM.from_pretrained"
    recipe["optimizer"]["lr"] = "fast"
    before = copy.deepcopy(recipe)
    assert not validate_job(recipe, ["optimizer.betas.x=1"], None, settings).valid
    assert recipe == before
