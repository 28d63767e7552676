"""The grants a recipe needs, read the same from a submitted and a stored recipe
(jobs.recipe.plan.grants)."""

from __future__ import annotations

from jobs.recipe.plan.grants import (
    REMOTE_CODE,
    operator_grants,
    project_grants,
    required_grants,
    revoked_grant_errors,
    unmet_grants,
)
from jobs.recipe.settings import RecipeSettings
from jobs.recipe.validation import validate_job


def test_a_plain_recipe_needs_no_grant(validate, recipe):
    result = validate(recipe)
    assert result.valid and required_grants(result.recipe) == {}
    assert result.plan["trust_remote_code"] is False


def test_the_stored_recipe_still_asks_for_the_grant_it_was_submitted_with(recipe, settings):
    recipe["model"]["trust_remote_code"] = True
    result = validate_job(recipe, [], None, settings, allow_remote_code=True)
    assert result.valid, [str(e) for e in result.errors]
    assert result.plan["trust_remote_code"] is True
    assert required_grants(result.recipe) == {REMOTE_CODE: "model.trust_remote_code"}


def test_a_teacher_or_a_tokenizer_asks_for_it_too():
    teacher = {"teacher_model": {"_target_": "t", "trust_remote_code": True}, "tokenizer": None}
    assert required_grants(teacher) == {REMOTE_CODE: "teacher_model.trust_remote_code"}
    tokenizer = {"model": {"_target_": "m"}, "tokenizer": {"trust_remote_code": True}}
    assert required_grants(tokenizer) == {REMOTE_CODE: "tokenizer.trust_remote_code"}


def test_anything_but_an_absent_or_false_flag_counts_as_asking():
    assert required_grants({"model": {"trust_remote_code": False}}) == {}
    assert required_grants({"model": {"trust_remote_code": "yes"}}) == {
        REMOTE_CODE: "model.trust_remote_code"
    }
    assert required_grants({"fake": {"steps": 3}, "model": "not a section"}) == {}


def test_either_the_operator_or_the_project_gives_the_grant():
    needed = {REMOTE_CODE: "model.trust_remote_code"}
    assert unmet_grants(needed, operator_grants(RecipeSettings(allow_remote_code=True))) == {}
    assert unmet_grants(needed, project_grants(True)) == {}
    nobody = {*operator_grants(RecipeSettings()), *project_grants(False)}
    assert unmet_grants(needed, nobody) == needed


def test_a_revoked_grant_names_the_field_and_the_fix():
    (error,) = revoked_grant_errors({REMOTE_CODE: "model.trust_remote_code"})
    assert error.loc == "model.trust_remote_code"
    assert "revoked after submission" in error.msg
    assert "grant it again" in error.fix and "resubmit" in error.fix
    assert '{"allow_remote_code": true}' in error.fix
