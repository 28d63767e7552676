"""Who owns the recipe dict `validate_job` normalizes: a copy of the caller's by default, the
dict itself when the caller hands it over (the API's request body, bounded already)."""

from __future__ import annotations

import copy

from jobs.recipe.validation import validate_job


def test_the_callers_dict_is_left_as_it_was(recipe, settings):
    before = copy.deepcopy(recipe)
    result = validate_job(recipe, ["optimizer.lr=0.5"], None, settings)
    assert result.valid, result.errors
    assert recipe == before
    assert result.recipe["optimizer"]["lr"] == 0.5


def test_a_handed_over_dict_validates_to_the_same_recipe_and_plan(recipe, settings):
    kept = validate_job(copy.deepcopy(recipe), (), None, settings)
    given = validate_job(copy.deepcopy(recipe), (), None, settings, handed_over=True)
    assert kept.valid and given.valid
    assert given.recipe == kept.recipe and given.plan == kept.plan


def test_a_handed_over_dict_takes_overrides_and_reports_bad_ones(recipe, settings):
    result = validate_job(copy.deepcopy(recipe), ["optimizer.lr=0.25"], None, settings,
                          handed_over=True)  # fmt: skip
    assert result.valid and result.recipe["optimizer"]["lr"] == 0.25
    bad = validate_job(copy.deepcopy(recipe), ["optimizer.lr.x=1"], None, settings,
                       handed_over=True)  # fmt: skip
    assert not bad.valid and any(e.loc == "optimizer.lr.x" for e in bad.errors)


def test_text_recipes_are_parsed_whatever_the_flag(recipe, settings):
    import yaml

    text = yaml.safe_dump(recipe)
    assert validate_job(text, (), None, settings, handed_over=True).valid
