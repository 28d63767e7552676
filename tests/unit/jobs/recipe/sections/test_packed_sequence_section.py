"""`packed_sequence` with AutoModel's keys, and the THD collater that needs it.

`packed_sequence_thd_collater` (bare or as `{_target_: ...}`) validates only when packing
is on; `drop_long_samples` is typed, survives the stored round trip, and a recipe stored
before it existed still loads (as the truncation it meant).
"""

from __future__ import annotations

import pytest
from recipe_asserts import error_at, locs

from jobs.recipe.typed import PackedSequence, Recipe

THD = "nemo_automodel.components.datasets.utils.packed_sequence_thd_collater"
PACKED = {
    "packed_sequence_size": 64,
    "split_across_pack": True,
    "max_packs": 10,
    "drop_long_samples": True,
}


@pytest.mark.parametrize("form", [THD, {"_target_": THD}], ids=["name", "target"])
def test_the_thd_collater_is_accepted_with_packing(validate, recipe, form) -> None:
    recipe["packed_sequence"] = dict(PACKED)
    recipe["dataloader"]["collate_fn"] = form
    recipe["validation_dataloader"] = {"collate_fn": form}
    result = validate(recipe)
    assert result.valid, result.errors
    assert result.typed.dataloader.collate_fn == THD
    assert result.typed.validation_dataloader.collate_fn == THD
    assert result.typed.packed_sequence == PackedSequence(
        enabled=True,
        packed_sequence_size=64,
        split_across_pack=True,
        max_packs=10,
        drop_long_samples=True,
    )


def test_the_thd_collater_takes_the_pack_size_from_the_dataset(validate, recipe) -> None:
    recipe["packed_sequence"] = {"enabled": True}
    recipe["dataloader"]["collate_fn"] = THD
    result = validate(recipe)
    assert result.valid, result.errors
    assert result.typed.packed_sequence.packed_sequence_size == 64  # dataset.max_seq_length


@pytest.mark.parametrize(
    "packed",
    [None, {"packed_sequence_size": 0}, {"packed_sequence_size": 64, "enabled": False}],
    ids=["absent", "size-0", "disabled"],
)
def test_the_thd_collater_without_packing_is_an_error_with_the_fix(
    validate, recipe, packed
) -> None:
    if packed is not None:
        recipe["packed_sequence"] = packed
    recipe["dataloader"]["collate_fn"] = {"_target_": THD}
    recipe["validation_dataloader"] = {"collate_fn": THD}
    result = validate(recipe)
    assert not result.valid
    error = error_at(result, "dataloader.collate_fn")
    assert "packing is off" in error.msg
    assert "packed_sequence.packed_sequence_size" in error.fix
    assert "validation_dataloader.collate_fn" in locs(result)


def test_the_default_collater_with_packing_still_validates(validate, recipe) -> None:
    recipe["packed_sequence"] = {"packed_sequence_size": 64}
    recipe["dataloader"]["collate_fn"] = "nemo_automodel.components.datasets.utils.default_collater"
    assert validate(recipe).valid


@pytest.mark.parametrize("value", ["yes", 1])
def test_drop_long_samples_must_be_a_bool(validate, recipe, value) -> None:
    recipe["packed_sequence"] = {"packed_sequence_size": 64, "drop_long_samples": value}
    result = validate(recipe)
    assert "packed_sequence.drop_long_samples" in locs(result)


def test_drop_long_samples_defaults_to_false(validate, recipe) -> None:
    recipe["packed_sequence"] = {"packed_sequence_size": 64}
    result = validate(recipe)
    assert result.typed.packed_sequence.drop_long_samples is False
    assert result.recipe["packed_sequence"]["drop_long_samples"] is False


def test_packing_options_round_trip_through_the_stored_recipe(validate, recipe) -> None:
    recipe["packed_sequence"] = dict(PACKED)
    recipe["dataloader"]["collate_fn"] = THD
    typed = validate(recipe).typed
    stored = typed.to_json()
    assert stored["packed_sequence"] == {"enabled": True, **PACKED}
    assert Recipe.from_json(stored) == typed


def test_a_recipe_stored_before_drop_long_samples_still_loads(validate, recipe) -> None:
    recipe["packed_sequence"] = {"packed_sequence_size": 64, "split_across_pack": True}
    stored = validate(recipe).typed.to_json()
    del stored["packed_sequence"]["drop_long_samples"]
    loaded = Recipe.from_json(stored)
    assert loaded.packed_sequence.drop_long_samples is False
    assert loaded.packed_sequence.split_across_pack is True
