"""`checkpoint.keep_best` and the retention rule: the section's bounds and its submit-time
cadence rule (field + fix), the typed recipe it reaches, and `keep_reasons` as the one
statement of which checkpoints are kept and why."""

from __future__ import annotations

import math

import pytest
from recipe_asserts import error_at

from jobs.recipe.sections.retention import KeepBest, best_ranks, deletion_reason, keep_reasons
from jobs.recipe.typed import Recipe


@pytest.fixture
def keep_best_recipe(recipe, squad_dir):
    recipe["validation_dataset"] = dict(recipe["dataset"])
    recipe["step_scheduler"].update(val_check_interval=5, checkpoint_interval=10)
    recipe["checkpoint"] = {"keep_last": 1, "keep_best": {"metric": "val_loss", "k": 2}}
    return recipe


def test_keep_best_reaches_the_typed_recipe_and_its_stored_json(validate, keep_best_recipe):
    result = validate(keep_best_recipe)
    assert result.valid, result.errors
    wanted = KeepBest(metric="val_loss", mode="min", k=2)
    assert result.typed.checkpoint.keep_best == wanted
    assert Recipe.from_json(result.typed.to_json()).checkpoint.keep_best == wanted


def test_a_stored_recipe_without_keep_best_loads_with_none(validate, recipe):
    stored = validate(recipe).typed.to_json()
    del stored["checkpoint"]["keep_best"]
    assert Recipe.from_json(stored).checkpoint.keep_best is None


@pytest.mark.parametrize(
    ("keep_best", "loc", "fix"),
    [
        ({"metric": "val_loss", "k": 0}, "checkpoint.keep_best.k", ">= 1"),
        ({"metric": "accuracy", "k": 1}, "checkpoint.keep_best.metric", "val_loss"),
        ({"mode": "lowest", "k": 1}, "checkpoint.keep_best.mode", "'min' or 'max'"),
        ({"metric": "val_loss"}, "checkpoint.keep_best.k", "set checkpoint.keep_best.k"),
    ],
    ids=["k-zero", "metric", "mode", "no-k"],
)
def test_section_errors_name_the_field_and_a_fix(validate, keep_best_recipe, keep_best, loc, fix):
    keep_best_recipe["checkpoint"]["keep_best"] = keep_best
    err = error_at(validate(keep_best_recipe), loc)
    assert fix in err.fix or fix in err.msg, err


def test_val_loss_needs_a_validation_dataset(validate, keep_best_recipe):
    del keep_best_recipe["validation_dataset"]
    err = error_at(validate(keep_best_recipe), "checkpoint.keep_best.metric")
    assert "validation_dataset" in err.fix and "metric: loss" in err.fix


def test_val_loss_needs_a_validation_interval(validate, keep_best_recipe):
    keep_best_recipe["step_scheduler"]["val_check_interval"] = None
    err = error_at(validate(keep_best_recipe), "step_scheduler.val_check_interval")
    assert "set step_scheduler.val_check_interval" in err.fix


def test_checkpoint_saves_must_fall_on_validation_steps(validate, keep_best_recipe):
    keep_best_recipe["step_scheduler"].update(val_check_interval=4, checkpoint_interval=10)
    err = error_at(validate(keep_best_recipe), "step_scheduler.checkpoint_interval")
    assert "multiple of 4" in err.fix and "divisor of 10" in err.fix
    keep_best_recipe["step_scheduler"]["checkpoint_interval"] = None
    err = error_at(validate(keep_best_recipe), "step_scheduler.checkpoint_interval")
    assert "multiple of 4" in err.fix


def test_training_loss_needs_no_validation(validate, keep_best_recipe):
    del keep_best_recipe["validation_dataset"]
    keep_best_recipe["step_scheduler"].update(val_check_interval=None, checkpoint_interval=None)
    keep_best_recipe["checkpoint"]["keep_best"] = {"metric": "loss", "mode": "min", "k": 1}
    assert validate(keep_best_recipe).valid


def test_keep_best_with_checkpoints_disabled_is_refused(validate, keep_best_recipe):
    keep_best_recipe["checkpoint"]["enabled"] = False
    err = error_at(validate(keep_best_recipe), "checkpoint.keep_best")
    assert "checkpoint.enabled: true" in err.fix


VAL = {10: {"val_loss": 3.0}, 20: {"val_loss": 1.0}, 30: {"val_loss": 2.0}, 40: {"val_loss": 4.0}}


def test_best_ranks_order_by_mode_with_ties_to_the_earlier_step():
    assert best_ranks(VAL, KeepBest("val_loss", "min", 2)) == {20: 1, 30: 2}
    assert best_ranks(VAL, KeepBest("val_loss", "max", 1)) == {40: 1}
    tied = {5: {"val_loss": 1.0}, 3: {"val_loss": 1.0}}
    assert best_ranks(tied, KeepBest("val_loss", "min", 1)) == {3: 1}


def test_steps_without_a_finite_value_are_never_ranked():
    metrics = {1: None, 2: {"val_loss": math.nan}, 3: {"val_loss": True}, 4: {"loss": 0.1}}
    metrics[5] = {"val_loss": 9.0}
    assert best_ranks(metrics, KeepBest("val_loss", "min", 3)) == {5: 1}


def test_keep_reasons_latest_last_n_and_best():
    reasons = keep_reasons(VAL, 1, KeepBest("val_loss", "min", 2), latest=40)
    assert reasons == {
        10: [],
        20: ["best val_loss #1 of 2"],
        30: ["best val_loss #2 of 2"],
        40: ["latest", "last 1"],
    }


def test_keep_best_alone_keeps_latest_and_the_best():
    reasons = keep_reasons(VAL, None, KeepBest("val_loss", "min", 1), latest=40)
    assert [s for s, r in reasons.items() if r] == [20, 40]


def test_without_rules_every_checkpoint_is_kept():
    reasons = keep_reasons(VAL, None, None, latest=40)
    assert all(reasons.values()) and reasons[40][0] == "latest"


def test_the_deletion_reason_names_each_rule():
    why = deletion_reason(2, KeepBest("val_loss", "min", 3))
    assert why == "not among the last 2, not among the 3 best by val_loss (min), not LATEST"
