"""Command-line overrides (issue 2, section 4)."""

from __future__ import annotations

import pytest
from recipe_asserts import error_at, locs

from jobs.recipe.errors import RecipeInvalid
from jobs.recipe.load.overrides import apply_overrides, parse_overrides


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        (["--optimizer.lr", "1e-4"], [("optimizer.lr", 1e-4)]),
        (["--step_scheduler.max_steps=500"], [("step_scheduler.max_steps", 500)]),
        (["optimizer.lr=2.0e-5"], [("optimizer.lr", 2e-5)]),
        (["--distributed.tp_size", "2"], [("distributed.tp_size", 2)]),
        (["--compile.enabled"], [("compile.enabled", True)]),
        (["--compile.enabled", "--x.y", "1"], [("compile.enabled", True), ("x.y", 1)]),
        (["--a.b", "false"], [("a.b", False)]),
        (["--a.b", "null"], [("a.b", None)]),
        (["--a.b", "none"], [("a.b", None)]),
        (["--a.b", "[0.9, 0.95]"], [("a.b", [0.9, 0.95])]),
        (["--a.b", "-1"], [("a.b", -1)]),
        (["--a.b", "text"], [("a.b", "text")]),
        ("a.b=3", [("a.b", 3)]),
    ],
)
def test_parse_forms_and_typed_values(tokens, expected):
    assert parse_overrides(tokens) == expected


@pytest.mark.parametrize("tokens", [["stray"], ["--=3"], ["--a..b", "1"], ["--.a", "1"]])
def test_malformed_tokens_are_errors(tokens):
    with pytest.raises(RecipeInvalid) as info:
        parse_overrides(tokens)
    assert [e.loc for e in info.value.errors] == ["overrides"]


def test_apply_sets_nested_values_on_a_copy():
    recipe = {"optimizer": {"lr": 1.0}}
    result, errors = apply_overrides(recipe, [("optimizer.lr", 2.0), ("new.key", 1)])
    assert errors == [] and result == {"optimizer": {"lr": 2.0}, "new": {"key": 1}}
    assert recipe == {"optimizer": {"lr": 1.0}}


def test_override_into_a_value_is_an_error():
    _, errors = apply_overrides({"optimizer": {"lr": 1.0}}, [("optimizer.lr.x", 1)])
    assert [e.loc for e in errors] == ["optimizer.lr.x"]


def test_overrides_are_applied_before_validation(validate, recipe):
    result = validate(recipe, ["--optimizer.lr", "1e-4", "--step_scheduler.max_steps=50"])
    assert result.valid
    assert result.recipe["optimizer"]["lr"] == 1e-4
    assert result.plan["max_steps"] == 50


def test_override_of_unknown_key_is_an_error_with_a_suggestion(validate, recipe):
    result = validate(recipe, ["--step_scheduler.max_step", "5"])
    err = error_at(result, "step_scheduler.max_step")
    assert "max_steps" in err.fix and "override" in err.msg


def test_override_of_unknown_target_kwarg_is_an_error(validate, recipe):
    assert "'lr'" in error_at(validate(recipe, ["--optimizer.lrr=1e-4"]), "optimizer.lrr").fix


def test_override_of_unknown_section_is_an_error(validate, recipe):
    assert "optimizer" in error_at(validate(recipe, ["--optimzer.lr", "1"]), "optimzer").fix


def test_malformed_override_is_reported_with_the_recipe_errors(validate, recipe):
    recipe["optimizer"]["lrr"] = 1
    assert set(locs(validate(recipe, ["stray"]))) == {"overrides", "optimizer.lrr"}


def test_overrides_as_a_mapping_of_typed_values(validate, recipe):
    result = validate(recipe, {"optimizer.lr": 5e-4, "step_scheduler.max_steps": 7})
    assert result.recipe["optimizer"]["lr"] == 5e-4 and result.plan["max_steps"] == 7
