"""Batch arithmetic (issue 2, section 6): grad accumulation = global / (local x dp)."""

from __future__ import annotations

import pytest
from recipe_asserts import error_at


def test_grad_accumulation_is_derived(validate, recipe):
    recipe["step_scheduler"]["global_batch_size"] = 32
    result = validate(recipe, nproc_per_node=2)
    step = result.recipe["step_scheduler"]
    assert step["grad_accumulation_steps"] == 4 and step["local_batch_size"] == 4
    assert result.plan["grad_accumulation_steps"] == 4
    assert result.recipe["dataloader"]["batch_size"] == 4


def test_local_batch_from_step_scheduler(validate, recipe):
    del recipe["dataloader"]["batch_size"]
    recipe["step_scheduler"].update(local_batch_size=2, global_batch_size=8)
    result = validate(recipe, nproc_per_node=2)
    assert result.plan["local_batch_size"] == 2 and result.plan["grad_accumulation_steps"] == 2
    assert result.recipe["dataloader"]["batch_size"] == 2


def test_global_batch_defaults_to_local_times_dp_times_accumulation(validate, recipe):
    del recipe["step_scheduler"]["global_batch_size"]
    recipe["step_scheduler"]["grad_accumulation_steps"] = 3
    assert validate(recipe, nproc_per_node=2).plan["global_batch_size"] == 4 * 2 * 3


def test_global_batch_must_be_a_multiple_of_local_times_dp(validate, recipe):
    recipe["step_scheduler"]["global_batch_size"] = 12
    err = error_at(validate(recipe, nproc_per_node=2), "step_scheduler.global_batch_size")
    assert "8" in err.msg and "multiple of 8" in err.fix


def test_explicit_grad_accumulation_must_agree(validate, recipe):
    recipe["step_scheduler"].update(global_batch_size=16, grad_accumulation_steps=3)
    err = error_at(validate(recipe, nproc_per_node=2), "step_scheduler.grad_accumulation_steps")
    assert "2" in err.fix


def test_agreeing_grad_accumulation_is_fine(validate, recipe):
    recipe["step_scheduler"].update(global_batch_size=16, grad_accumulation_steps=2)
    assert validate(recipe, nproc_per_node=2).valid


def test_conflicting_local_batch_sizes(validate, recipe):
    recipe["step_scheduler"]["local_batch_size"] = 2
    error_at(validate(recipe), "dataloader.batch_size")


@pytest.mark.parametrize(
    "loc",
    [
        "dataloader.batch_size",
        "validation_dataloader.batch_size",
        "step_scheduler.global_batch_size",
        "step_scheduler.local_batch_size",
        "step_scheduler.grad_accumulation_steps",
        "step_scheduler.max_steps",
        "step_scheduler.num_epochs",
        "step_scheduler.val_check_interval",
        "step_scheduler.checkpoint_interval",
        "step_scheduler.log_interval",
    ],
)
@pytest.mark.parametrize("value", [0, -2])
def test_batch_sizes_and_intervals_are_positive(validate, recipe, loc, value):
    section, key = loc.split(".")
    recipe.setdefault(section, {})[key] = value
    error_at(validate(recipe), loc)


def test_validation_batch_defaults_to_local_batch(validate, recipe):
    assert validate(recipe).recipe["validation_dataloader"]["batch_size"] == 4
