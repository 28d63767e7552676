"""The `recovery:` section: off by default, strict keys and bounds with field + fix errors,
carried whole in the typed recipe (and its stored JSON), and absent from older recipes."""

from __future__ import annotations

import pytest
from recipe_asserts import error_at

from jobs.recipe.typed import Recipe, Recovery, SpikeRule


def test_without_the_section_a_nan_fails_the_run(validate, recipe) -> None:
    result = validate(recipe)
    assert result.valid, result.errors
    assert result.typed.recovery == Recovery(on_nan="fail", on_spike=None)
    assert not result.typed.recovery.enabled


def test_rollback_and_spike_rule_reach_the_typed_recipe(validate, recipe) -> None:
    recipe["recovery"] = {"on_nan": "rollback", "on_spike": {"factor": 5, "window": 50},
                          "max_retries": 2, "lr_scale": 0.5}  # fmt: skip
    result = validate(recipe)
    assert result.valid, result.errors
    wanted = Recovery("rollback", SpikeRule(factor=5.0, window=50), max_retries=2, lr_scale=0.5)
    assert result.typed.recovery == wanted and wanted.enabled
    assert Recipe.from_json(result.typed.to_json()).recovery == wanted


@pytest.mark.parametrize(
    ("section", "loc", "fix"),
    [
        ({"on_nan": "skip"}, "recovery.on_nan", "'fail' or 'rollback'"),
        ({"on_spike": {"factor": 1.0}}, "recovery.on_spike.factor", "> 1.0"),
        ({"on_spike": {"factor": 3, "window": 2}}, "recovery.on_spike.window", ">= 3"),
        ({"on_spike": {"window": 10}}, "recovery.on_spike.factor", "set recovery.on_spike.factor"),
        ({"max_retries": 0}, "recovery.max_retries", ">= 1"),
        ({"lr_scale": 1.5}, "recovery.lr_scale", "<= 1.0"),
        ({"on_nan": "rollback", "retries": 3}, "recovery.retries", "max_retries"),
    ],
    ids=["on-nan", "factor", "window", "no-factor", "retries", "lr-scale", "unknown-key"],
)
def test_bad_values_are_field_errors_with_a_fix(validate, recipe, section, loc, fix) -> None:
    recipe["recovery"] = section
    result = validate(recipe)
    assert not result.valid
    error = error_at(result, loc)
    assert fix in error.fix, error


def test_a_recipe_stored_before_the_section_loads_as_off(validate, recipe) -> None:
    stored = validate(recipe).typed.to_json()
    del stored["recovery"]
    assert Recipe.from_json(stored).recovery == Recovery()
