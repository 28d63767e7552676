"""The `embedding_row_repair:` section (jobs.recipe.sections.embedding_row_repair): AutoModel's
options and defaults, the typed recipe the trainer reads, off forms dropped with a warning,
and bad values refused at their field."""

from __future__ import annotations

import pytest
from recipe_asserts import error_at

from jobs.recipe.typed import Recipe


def test_the_section_reaches_the_typed_recipe(validate, recipe):
    recipe["embedding_row_repair"] = {"min_norm": 1.0e-4, "max_rows": 256}
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    section = Recipe.from_json(result.recipe).embedding_row_repair
    assert (section.min_norm, section.max_rows) == (1.0e-4, 256)


@pytest.mark.parametrize("value", [{}, {"enabled": True}])
def test_a_present_section_is_enabled_with_automodels_defaults(validate, recipe, value):
    recipe["embedding_row_repair"] = value
    section = validate(recipe).typed.embedding_row_repair
    assert (section.min_norm, section.max_rows) == (1.0e-6, 256)


def test_an_integer_threshold_is_a_float(validate, recipe):
    recipe["embedding_row_repair"] = {"min_norm": 0}
    assert validate(recipe).typed.embedding_row_repair.min_norm == 0.0


@pytest.mark.parametrize("value", [None, False, "none", {"enabled": False, "min_norm": 1.0e-4}])
def test_off_forms_are_dropped_with_a_warning(validate, recipe, value):
    recipe["embedding_row_repair"] = value
    result = validate(recipe)
    assert result.valid and result.typed.embedding_row_repair is None
    assert any(w.loc == "embedding_row_repair" for w in result.warnings)


def test_absent_means_no_repair_and_no_warning(validate, recipe):
    result = validate(recipe)
    assert result.typed.embedding_row_repair is None
    assert not any(w.loc == "embedding_row_repair" for w in result.warnings)


@pytest.mark.parametrize(
    ("value", "loc", "fix"),
    [({"min_norm": -1.0}, "embedding_row_repair.min_norm", ">= 0"),
     ({"min_norm": float("inf")}, "embedding_row_repair.min_norm", "finite"),
     ({"min_norm": "small"}, "embedding_row_repair.min_norm", "float"),
     ({"max_rows": 0}, "embedding_row_repair.max_rows", "> 0"),
     ({"max_rows": 2.5}, "embedding_row_repair.max_rows", "int"),
     ({"enabled": "yes"}, "embedding_row_repair.enabled", "bool"),
     ({"min_norm": -1.0, "enabled": False}, "embedding_row_repair.min_norm", ">= 0"),
     ({"threshold": 1.0e-4}, "embedding_row_repair.threshold", ""),
     (True, "embedding_row_repair", "min_norm: 1.0e-4"),
     ([1.0e-4], "embedding_row_repair", "max_rows: 256")],
)  # fmt: skip
def test_bad_values_are_errors_at_their_field(validate, recipe, value, loc, fix):
    recipe["embedding_row_repair"] = value
    error = error_at(validate(recipe), loc)
    assert fix in error.fix
