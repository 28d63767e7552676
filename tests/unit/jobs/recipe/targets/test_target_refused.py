"""AutoModel's dataset builders that tuneyard refuses on purpose say why and what to use
instead (jobs.recipe.targets.refused), rather than a did-you-mean."""

from __future__ import annotations

import pytest
from recipe_asserts import error_at

from jobs.recipe.targets.refused import REFUSED_TARGETS


@pytest.mark.parametrize("target", sorted(REFUSED_TARGETS))
def test_each_refused_builder_names_its_reason_and_fix(validate, recipe, target):
    recipe["dataset"] = {"_target_": target, "dataset_name": "org/data", "split": "train"}
    error = error_at(validate(recipe), "dataset._target_")
    why, fix = REFUSED_TARGETS[target]
    assert error.msg == f"'{target}' is refused: {why}" and error.fix == fix
    assert "did you mean" not in error.fix
