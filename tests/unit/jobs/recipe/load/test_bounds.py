"""check_bounds: every limit reported at its field; and validate_job applying it to dicts,
YAML text and override values alike, before anything copies or expands them."""

from __future__ import annotations

import datetime
import math
import time

import pytest
from recipe_asserts import error_at

from jobs.recipe.load.bounds import (
    MAX_DEPTH,
    MAX_ERRORS,
    MAX_ITEMS,
    MAX_NODES,
    MAX_STRING,
    Refused,
    bounded_int,
    check_bounds,
)
from jobs.recipe.validation import validate_job


def only_error(value, loc: str = ""):
    errors = check_bounds(value, loc)
    assert len(errors) == 1, errors
    return errors[0]


def nested(depth: int, leaf=1):
    """`depth` mappings, one inside the other, around `leaf`."""
    value = leaf
    for _ in range(depth):
        value = {"a": value}
    return value


def test_a_plain_recipe_is_within_bounds(recipe) -> None:
    assert check_bounds(recipe) == []


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_floats_are_refused_at_their_field(value) -> None:
    error = only_error({"optimizer": {"betas": [0.9, value]}})
    assert error.loc == "optimizer.betas.1"
    assert "finite" in error.msg and error.fix == "give a finite number"


@pytest.mark.parametrize("value", [2**63 - 1, -(2**63), 0, True])
def test_int64_values_pass(value) -> None:
    assert check_bounds({"n": value}) == []


@pytest.mark.parametrize(
    "value", [2**63, -(2**63) - 1, 10**5000], ids=["2**63", "-2**63-1", "10**5000"]
)
def test_integers_outside_int64_are_refused(value) -> None:
    error = only_error({"step_scheduler": {"max_steps": value}})
    assert error.loc == "step_scheduler.max_steps"
    assert "int64" in error.msg and "9223372036854775807" in error.fix


def test_bounded_int() -> None:
    assert bounded_int("-42") == -42
    assert isinstance(bounded_int("9" * 5000), Refused)


def test_long_strings_and_keys_are_refused() -> None:
    assert only_error({"name": "x" * (MAX_STRING + 1)}).loc == "name"
    assert only_error({"a": {"k" * (MAX_STRING + 1): 1}}).loc == "a"
    assert check_bounds({"name": "x" * MAX_STRING}) == []


def test_long_lists_and_mappings_are_refused() -> None:
    error = only_error({"data": {"files": ["f"] * (MAX_ITEMS + 1)}})
    assert (error.loc, str(MAX_ITEMS) in error.msg) == ("data.files", True)
    assert only_error({"m": {str(i): i for i in range(MAX_ITEMS + 1)}}).loc == "m"
    assert check_bounds({"data": ["f"] * MAX_ITEMS}) == []


def test_nesting_is_capped_at_max_depth() -> None:
    assert check_bounds(nested(MAX_DEPTH)) == []
    error = only_error(nested(MAX_DEPTH + 1))
    assert error.loc == ".".join(["a"] * MAX_DEPTH)
    assert str(MAX_DEPTH) in error.msg


def test_a_300_deep_value_is_one_error_not_a_recursion_error() -> None:
    assert "deeper" in only_error({"optimizer": {"foo": nested(300)}}).msg


def test_a_cycle_is_refused() -> None:
    cycle: dict = {}
    cycle["self"] = cycle
    assert "deeper" in only_error(cycle).msg


def test_shared_objects_count_once_per_use_so_a_python_bomb_stops_fast() -> None:
    bomb: list = ["lol"] * 9
    for _ in range(8):
        bomb = [bomb] * 9  # 9**9 values once expanded, a few hundred objects in memory
    start = time.perf_counter()
    error = only_error({"optimizer": {"betas": bomb}})
    assert time.perf_counter() - start < 5  # expanded, it takes minutes
    assert error.loc.startswith("optimizer.betas.") and str(MAX_NODES) in error.msg


@pytest.mark.parametrize("key", [1, None, True, 1.5, ("a", "b")])
def test_keys_must_be_strings(key) -> None:
    error = only_error({"labels": {key: "x"}})
    assert error.loc == "labels" and "not a string" in error.msg and "quote" in error.fix


def test_a_refused_key_says_what_it_was() -> None:
    error = only_error({"labels": {Refused("a date", "quote it"): "x"}})
    assert (error.msg, error.fix) == ("has a key that is a date", "quote it")


@pytest.mark.parametrize("value", [datetime.date(2024, 1, 1), b"bytes", {1, 2}, object()])
def test_values_that_are_not_json_are_refused(value) -> None:
    error = only_error({"optimizer": {"weight_decay": value}})
    assert error.loc == "optimizer.weight_decay" and "cannot hold" in error.msg


def test_a_refused_marker_reports_its_own_message() -> None:
    error = only_error({"a": [Refused("a !!set", "write it as a list")]})
    assert (error.loc, error.msg, error.fix) == ("a.0", "is a !!set", "write it as a list")


def test_errors_are_capped() -> None:
    assert len(check_bounds({"a": [math.nan] * 100})) == MAX_ERRORS


def test_a_prefix_locates_an_override_value() -> None:
    assert only_error(math.nan, "optimizer.lr").loc == "optimizer.lr"
    assert only_error([1, math.inf], "optimizer.betas").loc == "optimizer.betas.1"


def test_the_root_is_named() -> None:
    assert only_error(math.nan).loc == "<recipe>"


# validate_job: the same bounds for a dict, YAML text and override values


def test_a_deep_dict_recipe_is_refused_before_it_is_copied(settings, recipe) -> None:
    recipe["optimizer"]["foo"] = nested(5000)  # deepcopy would hit the recursion limit
    result = validate_job(recipe, (), None, settings)  # the `validate` fixture copies it
    assert [e.loc for e in result.errors] == ["optimizer.foo." + ".".join(["a"] * 30)]


def test_nan_in_a_dict_recipe(validate, recipe) -> None:
    recipe["optimizer"]["weight_decay"] = math.nan
    assert "finite" in error_at(validate(recipe), "optimizer.weight_decay").msg


@pytest.mark.parametrize(("text", "words"), [(".nan", "finite"), ("-.inf", "finite"),
                                             ("2024-01-01", "date"), ("!!set {a}", "!!set"),
                                             ("1" * 5000, "integer")])  # fmt: skip
def test_refused_yaml_values_are_errors_at_their_field(validate, recipe, text, words) -> None:
    lines = [f"{k}: {v!r}" for k, v in recipe.items() if k != "optimizer"]
    yaml_text = "\n".join([*lines, f"optimizer: {{_target_: torch.optim.AdamW, weight_decay: "
                           f"{text}}}", ""])  # fmt: skip
    assert words in error_at(validate(yaml_text), "optimizer.weight_decay").msg


def test_an_alias_bomb_in_yaml_is_one_small_error(validate) -> None:
    from test_yaml_loader import alias_bomb

    start = time.perf_counter()
    result = validate(alias_bomb(8))
    assert time.perf_counter() - start < 5  # expanded, it takes minutes
    assert not result.valid and len(result.errors) == 1
    assert result.errors[0].loc.startswith("optimizer.betas.")


@pytest.mark.parametrize(("override", "words"), [("optimizer.weight_decay=.nan", "finite"),
                                                 ("optimizer.weight_decay=2024-01-01", "date"),
                                                 ("optimizer.lr=" + "9" * 5000, "integer")],
                         ids=["nan", "date", "long-int"])  # fmt: skip
def test_refused_override_values_name_the_override(validate, recipe, override, words) -> None:
    key = override.split("=")[0]
    error = error_at(validate(recipe, [override]), key)
    assert words in error.msg and f"(set by override --{key})" in error.msg


def test_typed_overrides_are_bounded_too(validate, recipe) -> None:
    error = error_at(validate(recipe, {"optimizer.betas": [0.9, math.inf]}), "optimizer.betas.1")
    assert "set by override --optimizer.betas" in error.msg


def test_a_recipe_using_anchors_and_merge_keys_validates(validate, recipe) -> None:
    dataset = recipe["dataset"]
    text = (
        f"step_scheduler: {recipe['step_scheduler']}\nmodel: {recipe['model']}\n"
        f"distributed: {recipe['distributed']}\ndataloader: {recipe['dataloader']}\n"
        f"lr_scheduler: {recipe['lr_scheduler']}\n"
        f"dataset: &ds\n  _target_: {dataset['_target_']}\n"
        f"  path_or_dataset: {dataset['path_or_dataset']}\n  max_seq_length: 64\n"
        "validation_dataset:\n  <<: *ds\n  max_seq_length: 32\n"
        "optimizer: {_target_: torch.optim.AdamW, lr: &lr 1.0e-3, betas: [0.9, 0.95]}\n"
    )
    result = validate(text)
    assert result.valid, [str(e) for e in result.errors]
    assert result.recipe["validation_dataset"]["max_seq_length"] == 32
