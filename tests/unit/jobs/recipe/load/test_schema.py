"""Recipe schema (issue 2, section 2): sections, YAML and JSON, unknown keys, synonyms."""

from __future__ import annotations

import json

import pytest
import yaml
from recipe_asserts import error_at, locs


def test_valid_recipe_has_no_errors_and_a_normalized_recipe(validate, recipe):
    result = validate(recipe)
    assert result.valid, [str(e) for e in result.errors]
    assert result.recipe["step_scheduler"]["max_steps"] == 20
    assert result.recipe["recipe"] == "llm_finetune"


@pytest.mark.parametrize("dump", [yaml.safe_dump, json.dumps])
def test_yaml_and_json_text_and_files_load(validate, recipe, tmp_path, dump):
    text = dump(recipe)
    assert validate(text).valid
    path = tmp_path / ("r.json" if dump is json.dumps else "r.yaml")
    path.write_text(text)
    assert validate(path).valid
    assert validate(str(path)).valid


def test_exponent_without_dot_is_a_float(validate, recipe):
    text = yaml.safe_dump(recipe).replace("lr: 0.001", "lr: 1e-3")
    assert "1e-3" in text
    result = validate(text)
    assert result.valid and result.recipe["optimizer"]["lr"] == 1e-3


def test_bad_yaml_is_an_error_at_the_file(validate):
    result = validate("model: [unclosed\n")
    assert locs(result) == ["<recipe>"] and "line" in result.errors[0].msg


def test_a_recipe_that_is_not_a_mapping_is_an_error(validate):
    assert locs(validate("- a\n- b\n")) == ["<recipe>"]


def test_missing_recipe_file_is_an_error(validate, tmp_path):
    assert locs(validate(tmp_path / "absent.yaml")) == ["<recipe>"]


def test_unknown_key_in_fixed_section_suggests_the_right_one(validate, recipe):
    recipe["step_scheduler"]["max_step"] = 10
    err = error_at(validate(recipe), "step_scheduler.max_step")
    assert "max_steps" in err.fix


@pytest.mark.parametrize(
    ("section", "key", "suggestion"),
    [
        ("dataloader", "batchsize", "batch_size"),
        ("checkpoint", "checkpoint_dirr", "checkpoint_dir"),
        ("compile", "enable", "enabled"),
        ("clip_grad_norm", "maxnorm", "max_norm"),
        ("rng", "seeds", "seed"),
        ("packed_sequence", "packed_seq_size", "packed_sequence_size"),
    ],
)
def test_unknown_keys_everywhere_are_errors_with_did_you_mean(
    validate, recipe, section, key, suggestion
):
    recipe.setdefault(section, {})[key] = 1
    assert suggestion in error_at(validate(recipe), f"{section}.{key}").fix


def test_unknown_top_level_section_suggests_the_right_one(validate, recipe):
    recipe["optimiser"] = recipe.pop("optimizer")
    result = validate(recipe)
    assert "optimizer" in error_at(result, "optimiser").fix
    assert "optimizer" in locs(result)  # and the real one is now missing


@pytest.mark.parametrize("section", ["model", "dataset", "optimizer"])
def test_required_sections(validate, recipe, section):
    del recipe[section]
    assert section in locs(validate(recipe))


def test_max_steps_is_not_capped_by_epochs(validate, recipe):
    recipe["step_scheduler"].update(max_steps=5000, num_epochs=1)
    result = validate(recipe)
    assert result.recipe["step_scheduler"]["max_steps"] == 5000
    assert result.plan["max_steps"] == 5000


@pytest.mark.parametrize(
    ("synonym", "canonical"),
    [("val_every_steps", "val_check_interval"), ("ckpt_every_steps", "checkpoint_interval")],
)
def test_interval_synonyms_fold_into_canonical_keys(validate, recipe, synonym, canonical):
    recipe["step_scheduler"].pop(canonical, None)
    recipe["step_scheduler"][synonym] = 7
    step = validate(recipe).recipe["step_scheduler"]
    assert step[canonical] == 7 and synonym not in step


def test_conflicting_synonyms_are_an_error(validate, recipe):
    recipe["step_scheduler"].update(val_check_interval=5, val_every_steps=6)
    error_at(validate(recipe), "step_scheduler.val_every_steps")


def test_top_level_seed_folds_into_rng(validate, recipe):
    recipe["seed"] = 7
    assert validate(recipe).recipe["rng"]["seed"] == 7


def test_seed_beside_rng_yields_to_rng_with_a_warning(validate, recipe):
    recipe.update(seed=7, rng={"seed": 8})
    result = validate(recipe)
    assert result.valid and result.typed.rng.seed == 8
    assert [w.loc for w in result.warnings] == ["seed"]


def test_checkpoint_restore_from_folds_to_top_level(validate, recipe):
    recipe["checkpoint"] = {"restore_from": "LATEST"}
    assert validate(recipe).recipe["restore_from"] == {"path": "LATEST"}


@pytest.mark.parametrize(
    ("loc", "value"),
    [
        ("step_scheduler.max_steps", "ten"),
        ("step_scheduler.max_steps", 2.5),
        ("step_scheduler.max_steps", True),
        ("compile.mode", "fastest"),
        ("dataloader.shuffle", "yes"),
        ("dist_env.master_port", 70000),
    ],
)
def test_wrongly_typed_values_are_errors_at_their_field(validate, recipe, loc, value):
    section, key = loc.split(".")
    recipe.setdefault(section, {})[key] = value
    error_at(validate(recipe), loc)


def test_section_that_is_not_a_mapping_is_an_error(validate, recipe):
    recipe["step_scheduler"] = 5
    error_at(validate(recipe), "step_scheduler")


def test_automodel_markers_are_accepted_in_fixed_sections(validate, recipe):
    recipe["rng"] = {"_target_": "nemo_automodel.components.training.rng.StatefulRNG", "seed": 1}
    recipe["dataloader"].update(
        _target_="torchdata.stateful_dataloader.StatefulDataLoader",
        collate_fn={"_target_": "nemo_automodel.components.datasets.utils.default_collater"},
    )
    assert validate(recipe).valid


def test_other_targets_in_fixed_sections_are_refused(validate, recipe):
    recipe["dataloader"]["_target_"] = "os.system"
    recipe["validation_dataloader"] = {"collate_fn": "pickle.loads"}
    result = validate(recipe)
    error_at(result, "dataloader._target_")
    error_at(result, "validation_dataloader.collate_fn")


@pytest.mark.parametrize("name", ["llm_finetune", "TrainFinetuneRecipeForNextTokenPrediction"])
def test_known_recipe_names(validate, recipe, name):
    recipe["recipe"] = name
    assert validate(recipe).recipe["recipe"] == "llm_finetune"


def test_unknown_recipe_name_is_an_error(validate, recipe):
    recipe["recipe"] = "llm_finetun"
    assert "llm_finetune" in error_at(validate(recipe), "recipe").fix


def test_all_errors_are_reported_at_once(validate, recipe):
    recipe["step_scheduler"]["max_step"] = 1
    recipe["optimizer"]["lrr"] = 1
    recipe["distributed"]["tp_size"] = 0
    assert {"step_scheduler.max_step", "optimizer.lrr", "distributed.tp_size"} <= set(
        locs(validate(recipe))
    )


def test_normalized_recipe_validates_again_unchanged(validate, recipe):
    recipe["peft"] = {"dim": 4}
    recipe["distributed"]["strategy"] = "ddp"
    first = validate(recipe, nproc_per_node=2)
    second = validate(first.recipe, nproc_per_node=2)
    assert second.valid and second.recipe == first.recipe
    json.dumps(first.recipe)  # JSON-serialisable


def test_a_key_given_twice_is_an_error(validate):
    result = validate("optimizer:\n  lr: 1.0e-5\n  lr: 2.0e-5\n")
    assert locs(result) == ["<recipe>"] and "'lr' is given twice" in result.errors[0].msg


def test_an_absent_sections_defaults_are_a_fresh_copy_each_time():
    from jobs.recipe.load.schema import check_fixed_section

    first, errors = check_fixed_section("dataloader", None)
    assert errors == []
    first["batch_size"] = 999
    first.setdefault("extra", []).append(1)
    again, _ = check_fixed_section("dataloader", {})
    assert again != first and "extra" not in again
    assert again == check_fixed_section("dataloader", {"batch_size": again.get("batch_size")})[0]
