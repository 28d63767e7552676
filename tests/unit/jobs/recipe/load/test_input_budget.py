"""One input budget per request: the recipe and every override value draw on the same
`NodeBudget`, counted in value visits (read from the budget, never timed); the number of
overrides and the depth of their keys are capped; errors quote at most ~100 characters."""

from __future__ import annotations

import json

import pytest
from recipe_asserts import error_at

from jobs.recipe.errors import LOC_MAX, MSG_MAX, QUOTE_MAX
from jobs.recipe.load.bounds import MAX_DEPTH, MAX_ERRORS, MAX_NODES, NodeBudget, Refused
from jobs.recipe.load.overrides import MAX_OVERRIDES, override_texts
from jobs.recipe.load.yaml_loader import load_yaml, parse_scalar
from jobs.recipe.validation import validate_job


def alias_bomb(levels: int = 5, width: int = 9) -> str:
    """A flow list whose anchors each repeat the previous one `width` times."""
    lists = [f"&a0 [{','.join(['1'] * width)}]"]
    lists += [f"&a{i} [{','.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return f"[{','.join(lists)}]"


BOMB = alias_bomb()
BOMB_SIZE = 74_733  # values once expanded: under MAX_NODES alone, not twice


def test_the_bomb_is_small_text_and_just_under_the_limit_alone() -> None:
    assert len(BOMB) < 200
    budget = NodeBudget()
    value = parse_scalar(BOMB, budget)
    assert not isinstance(value, Refused)
    from jobs.recipe.load.bounds import check_bounds

    assert check_bounds(value, "x", budget) == [] and budget.visits == BOMB_SIZE < MAX_NODES


def test_200_bomb_overrides_spend_one_budget(settings, recipe) -> None:
    budget = NodeBudget()
    overrides = [f"optimizer.extra_{i}={BOMB}" for i in range(MAX_OVERRIDES)]
    result = validate_job(recipe, overrides, None, settings, budget=budget)
    assert not result.valid
    # Each override used to get its own budget: 200 x 74733 visits. Now one request's worth.
    assert budget.visits <= MAX_NODES + MAX_ERRORS
    assert len(result.errors) <= MAX_ERRORS + 2
    assert len(json.dumps(result.to_dict())) < 20_000
    assert any(str(MAX_NODES) in e.msg for e in result.errors)


def test_the_recipe_and_an_override_are_counted_together(settings, recipe) -> None:
    half = [[1] * 9_000] * 6  # 54k values once expanded: each alone is within bounds
    recipe["optimizer"]["extra"] = half
    overrides = {"optimizer.more": half}
    budget = NodeBudget()
    result = validate_job(recipe, overrides, None, settings, budget=budget)
    assert any(str(MAX_NODES) in e.msg and "override" in e.msg for e in result.errors)
    assert budget.visits <= MAX_NODES + 1


def test_an_override_past_what_is_left_is_refused_before_it_is_built() -> None:
    budget = NodeBudget(visits=MAX_NODES - 1_000)
    refused = parse_scalar(BOMB, budget)
    assert isinstance(refused, Refused) and str(MAX_NODES) in refused.what
    assert budget.exhausted  # the request is over: nothing after it is parsed


def test_once_a_value_overdraws_the_budget_later_overrides_are_not_parsed(settings, recipe):
    flat = "[" + ",".join(["1"] * 2_000) + "]"  # 2001 values: 49 of them fit
    budget = NodeBudget()
    result = validate_job(recipe, [f"optimizer.betas={flat}"] * 200, None,
                          settings, budget=budget)  # fmt: skip
    assert MAX_NODES < budget.visits <= MAX_NODES + 2 and len(result.errors) <= 3
    assert any("not checked" in e.msg and e.loc == "overrides" for e in result.errors)


def test_a_yaml_recipe_draws_on_the_budget_it_is_given() -> None:
    from jobs.recipe.load.yaml_loader import LimitExceeded

    with pytest.raises(LimitExceeded):
        load_yaml(f"optimizer: {{betas: {BOMB}}}\n", NodeBudget(visits=MAX_NODES // 2))


def test_an_exhausted_budget_never_answers_clean() -> None:
    from jobs.recipe.load.bounds import check_bounds

    budget = NodeBudget(visits=MAX_NODES + 1)
    assert check_bounds({"a": 1}, "optimizer", budget)[0].loc == "optimizer"


@pytest.mark.parametrize("form", ["list", "mapping"])
def test_more_than_max_overrides_is_one_error_naming_overrides(validate, recipe, form) -> None:
    assert validate(recipe, ["optimizer.lr=1e-4"] * MAX_OVERRIDES).valid
    keys = [f"optimizer.k{i}" for i in range(MAX_OVERRIDES + 1)]
    overrides = [f"{k}=1" for k in keys] if form == "list" else dict.fromkeys(keys, 1)
    error = error_at(validate(recipe, overrides), "overrides")
    assert str(MAX_OVERRIDES) in error.msg and "recipe" in error.fix


def test_a_key_deeper_than_max_depth_is_an_error_not_a_crash(validate, recipe) -> None:
    deep = "optimizer." + "a." * 1_500 + "b=1"  # it used to overflow the recursion limit
    error = error_at(validate(recipe, [deep]), "overrides")
    assert str(MAX_DEPTH) in error.msg and len(error.msg) < 300


@pytest.mark.parametrize("token", ["optimizer.lr\n=1", "--optimizer.lr\n"])
def test_a_key_with_a_line_break_is_not_a_key(token) -> None:
    texts, errors = override_texts([token])
    assert texts == [] and errors and errors[0].loc == "overrides"


def test_a_long_bad_token_is_quoted_short(validate, recipe) -> None:
    token = "--" + "x" * 4_000 + "..y=1"
    error = error_at(validate(recipe, [token]), "overrides")
    assert len(error.msg) < QUOTE_MAX + 60


def test_a_long_value_is_quoted_short_wherever_it_is_refused(validate, recipe) -> None:
    flat = "[" + ",".join(["1"] * 2_000) + "]"
    result = validate(recipe, [f"optimizer.lr={flat}", f"optimizer.weight_decay={flat}"])
    assert not result.valid
    assert all(len(e.msg) <= MSG_MAX and len(e.loc) <= LOC_MAX for e in result.errors)
    assert len(json.dumps(result.to_dict())) < 10_000  # it echoed each list whole


def test_many_bad_tokens_are_one_short_report() -> None:
    texts, errors = override_texts([f"stray{i}" for i in range(MAX_OVERRIDES)])
    assert texts == [] and len(errors) == MAX_ERRORS
