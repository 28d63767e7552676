"""AutoModel's `step_scheduler.save_checkpoint_every_epoch` and `log_remote_every_steps`:
typed, carried to the trainer, defaulted for recipes stored before them
(jobs.recipe.load.schema, jobs.recipe.typed)."""

from __future__ import annotations

import pytest
from recipe_asserts import error_at

from jobs.recipe.typed import Recipe


def test_both_keys_reach_the_typed_step_scheduler(validate, recipe):
    recipe["step_scheduler"].update(save_checkpoint_every_epoch=True, log_remote_every_steps=5)
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    schedule = result.typed.step_scheduler
    assert schedule.save_checkpoint_every_epoch is True and schedule.log_remote_every_steps == 5
    assert Recipe.from_json(result.recipe) == result.typed
    assert not [w for w in result.warnings if w.loc.startswith("step_scheduler.")]


def test_a_recipe_stored_before_them_loads_with_what_it_meant(validate, recipe):
    stored = validate(recipe).recipe
    for key in ("save_checkpoint_every_epoch", "log_remote_every_steps"):
        stored["step_scheduler"].pop(key)
    schedule = Recipe.from_json(stored).step_scheduler
    assert schedule.save_checkpoint_every_epoch is False and schedule.log_remote_every_steps == 1


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("log_remote_every_steps", 0, "greater than 0"),
        ("save_checkpoint_every_epoch", "false", "boolean"),
    ],
)
def test_a_wrong_value_is_an_error_at_its_key(validate, recipe, key, value, words):
    recipe["step_scheduler"][key] = value
    assert words in error_at(validate(recipe), f"step_scheduler.{key}").msg


def test_a_benchmark_saves_no_checkpoint_per_epoch(validate, recipe):
    recipe["recipe"] = "llm_benchmark"
    recipe["benchmark"] = {"warmup_steps": 2}
    recipe["step_scheduler"].update(save_checkpoint_every_epoch=True)
    recipe["step_scheduler"].pop("val_check_interval")
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    assert result.typed.step_scheduler.save_checkpoint_every_epoch is False
    [warning] = [
        w for w in result.warnings if w.loc == "step_scheduler.save_checkpoint_every_epoch"
    ]
    assert "one checkpoint at most" in warning.msg
