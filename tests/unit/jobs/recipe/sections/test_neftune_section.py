"""The `neftune:` section (jobs.recipe.sections.neftune): AutoModel's two forms, bounds, the
typed recipe the trainer reads, and the layouts where ranks would need the same noise."""

from __future__ import annotations

import pytest
from recipe_asserts import error_at

from jobs.recipe.typed import Recipe


@pytest.mark.parametrize("value", [{"noise_alpha": 5.0}, {"noise_alpha": 5}, 5.0])
def test_the_section_reaches_the_typed_recipe(validate, recipe, value):
    recipe["neftune"] = value
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    assert Recipe.from_json(result.recipe).neftune.noise_alpha == 5.0


def test_absent_none_and_zero_mean_no_noise(validate, recipe):
    assert validate(recipe).typed.neftune is None
    recipe["neftune"] = "none"
    assert validate(recipe).typed.neftune is None
    recipe["neftune"] = {"noise_alpha": 0}
    result = validate(recipe)
    assert result.typed.neftune is None
    assert any(w.loc == "neftune.noise_alpha" for w in result.warnings)


@pytest.mark.parametrize(
    ("value", "loc"),
    [({"noise_alpha": -1}, "neftune.noise_alpha"), ({"alpha": 5}, "neftune.alpha"),
     ("loud", "neftune")],
)  # fmt: skip
def test_bad_values_are_errors_at_their_field(validate, recipe, value, loc):
    recipe["neftune"] = value
    error_at(validate(recipe), loc)


@pytest.mark.parametrize("size", ["tp_size", "cp_size"])
def test_layouts_that_split_the_embedding_output_are_refused(validate, recipe, size):
    recipe["neftune"] = {"noise_alpha": 5.0}
    recipe["distributed"] = {"strategy": "fsdp2", size: 2}
    error = error_at(validate(recipe, nproc_per_node=2), f"distributed.{size}")
    assert "cannot run with neftune" in error.msg and "remove neftune" in error.fix
