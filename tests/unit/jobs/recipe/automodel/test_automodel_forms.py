"""AutoModel's value forms folded into tuneyard's (jobs.recipe.automodel.forms)."""

from __future__ import annotations

from typing import Any

import pytest
from recipe_asserts import error_at, locs

from jobs.recipe.automodel.forms import WARMUP_DECAY, schedule_name
from jobs.recipe.typed import Recipe


def _valid(validate, recipe, **resources):
    result = validate(recipe, **resources)
    assert result.valid, [str(e) for e in result.errors]
    assert Recipe.from_json(result.typed.to_json()) == result.typed
    return result


def _warning_locs(result) -> list[str]:
    return [w.loc for w in result.warnings]


@pytest.mark.parametrize(("alias", "dtype"), [("bf16", "bfloat16"), ("fp16", "float16"),
                                               ("fp32", "float32"), ("BF16", "bfloat16")])  # fmt: skip
def test_torch_dtype_aliases(validate, recipe, alias, dtype):
    recipe["model"].pop("dtype")
    recipe["model"]["torch_dtype"] = alias
    assert _valid(validate, recipe).typed.model.kwargs["torch_dtype"] == dtype


def test_target_modules_as_one_glob_string(validate, recipe):
    recipe["peft"] = {"target_modules": "*_proj", "dim": 8}
    peft = _valid(validate, recipe).typed.peft
    assert peft.target_modules == ["*_proj"] and peft.match_all_linear is False


@pytest.mark.parametrize(("value", "warns"), [("every", False), ("final", True), (True, False)])
def test_save_consolidated_final_and_every(validate, recipe, value, warns):
    recipe["checkpoint"] = {"save_consolidated": value}
    result = _valid(validate, recipe)
    assert result.typed.checkpoint.save_consolidated is True
    assert ("checkpoint.save_consolidated" in _warning_locs(result)) is warns


def test_collate_fn_mapping_with_kwargs(validate, recipe):
    recipe["dataloader"]["collate_fn"] = {
        "_target_": "nemo_automodel.components.datasets.utils.default_collater",
        "pad_seq_len_divisible": 16,
    }
    result = _valid(validate, recipe)
    assert result.typed.dataloader.collate_fn.endswith("default_collater")
    assert "dataloader.collate_fn.pad_seq_len_divisible" in _warning_locs(result)


@pytest.mark.parametrize("none", ["none", "None", None])
def test_none_sizes_are_one(validate, recipe, none):
    recipe["distributed"].update(tp_size=none, cp_size=none, pp_size=none, ep_size=none,
                                 dp_size=none)  # fmt: skip
    topology = _valid(validate, recipe).typed.topology
    assert (topology.tp_size, topology.cp_size, topology.pp_size, topology.ep_size) == (1,) * 4


@pytest.mark.parametrize("section", ["peft", "validation_dataset", "lr_scheduler", "restore_from"])
@pytest.mark.parametrize("none", ["none", None])
def test_none_optional_sections_are_absent(validate, recipe, section, none):
    recipe[section] = none
    assert getattr(_valid(validate, recipe).typed, section) is None


def test_none_words_in_fixed_sections_are_null(validate, recipe):
    recipe["clip_grad_norm"] = {"max_norm": "none"}
    recipe["step_scheduler"]["checkpoint_interval"] = "None"
    typed = _valid(validate, recipe).typed
    assert typed.clip_grad_norm.max_norm is None
    assert typed.step_scheduler.checkpoint_interval is None


def test_top_level_seed_alone_and_beside_rng(validate, recipe):
    assert _valid(validate, {**recipe, "seed": 5}).typed.rng.seed == 5
    result = _valid(validate, {**recipe, "seed": 5, "rng": {"seed": 9, "ranked": True}})
    assert result.typed.rng.seed == 9 and _warning_locs(result) == ["seed"]
    assert _valid(validate, {**recipe, "seed": 9, "rng": {"seed": 9}}).warnings == []


@pytest.mark.parametrize(
    ("given", "canonical"),
    [("1F1B", "1f1b"), ("Interleaved1F1B", "interleaved1f1b"), ("interleaved_1f1b",
     "interleaved1f1b"), ("GPipe", "gpipe"), ("looped_bfs", "loopedbfs"),
     ("LoopedBFS", "loopedbfs"), ("ZBVZeroBubble", "zbvzerobubble"), ("DualPipeV", "dualpipev")],
)  # fmt: skip
def test_pipeline_schedule_names_as_torch_spells_them(validate, recipe, given, canonical):
    assert schedule_name(given) == canonical
    recipe["distributed"].update(pp_size=2, pipeline={"pp_schedule": given})
    result = validate(recipe, nproc_per_node=2)
    refused = [e.msg for e in result.errors if e.loc == "distributed.pipeline.pp_schedule"]
    assert all("V-shaped" in msg for msg in refused)  # a known name; V placement is not wired
    assert "distributed.pp_size" not in locs(result)  # Llama runs pipeline stages


def test_unknown_pipeline_schedule_is_refused(validate, recipe):
    recipe["distributed"].update(pp_size=2, pipeline={"pp_schedule": "zigzag"})
    error_at(validate(recipe, nproc_per_node=2), "distributed.pipeline.pp_schedule")


@pytest.mark.parametrize("key", ["pipeline", "pipeline_config"])
def test_pipeline_block_with_pp_size_1_is_a_warning(validate, recipe, key):
    recipe["distributed"].update(pp_size=1, **{key: {"pp_schedule": "interleaved1f1b",
                                                      "pp_microbatch_size": 2}})  # fmt: skip
    result = _valid(validate, recipe)
    assert f"distributed.{key}" in _warning_locs(result)


def _scheduler(result) -> dict[str, Any]:
    return result.typed.lr_scheduler.to_json()


def test_lr_scheduler_config_keys_run_as_warmup_decay(validate, recipe):
    recipe["lr_scheduler"] = {"lr_decay_style": "cosine", "lr_warmup_steps": 2, "min_lr": 1e-5}
    assert _scheduler(_valid(validate, recipe)) == {
        "_target_": WARMUP_DECAY, "lr_decay_style": "cosine", "lr_warmup_steps": 2, "min_lr": 1e-5,
    }  # fmt: skip


@pytest.mark.parametrize("style", ["cosine", "linear", "constant", "inverse-square-root"])
def test_lr_decay_styles_the_trainer_runs(validate, recipe, style):
    recipe["lr_scheduler"] = {"lr_decay_style": style}
    assert _scheduler(_valid(validate, recipe))["lr_decay_style"] == style


def test_empty_lr_scheduler_is_automodels_default_cosine(validate, recipe):
    recipe["lr_scheduler"] = {}
    assert _scheduler(_valid(validate, recipe)) == {"_target_": WARMUP_DECAY}


def test_scheduler_resume_flags_are_warnings(validate, recipe):
    recipe["lr_scheduler"] = {"use_checkpoint_opt_param_scheduler": True}
    assert "lr_scheduler.use_checkpoint_opt_param_scheduler" in _warning_locs(
        _valid(validate, recipe)
    )


def test_constant_weight_decay_keys_are_accepted(validate, recipe):
    recipe["lr_scheduler"] = {"start_wd": 0.01, "end_wd": 0.01, "wd_incr_style": "constant"}
    _valid(validate, recipe)


@pytest.mark.parametrize(
    ("section", "loc"),
    [
        ({"lr_decay_style": "WSD", "wsd_decay_steps": 5}, "lr_scheduler.lr_decay_style"),
        ({"lr_decay_style": "zigzag"}, "lr_scheduler.lr_decay_style"),
        ({"start_wd": 0.0, "end_wd": 0.1, "wd_incr_style": "linear"}, "lr_scheduler.wd_incr_style"),
        ({"lr_warmup_steps": 20}, "lr_scheduler.lr_warmup_steps"),  # max_steps is 20
        ({"lr_warmup_steps": -1}, "lr_scheduler.lr_warmup_steps"),
        ({"min_lr": 1.0}, "lr_scheduler.min_lr"),  # above optimizer.lr
        ({"init_lr": "high"}, "lr_scheduler.init_lr"),
        ({"warmup_ratio": 0.1}, "lr_scheduler.warmup_ratio"),
    ],
)
def test_scheduler_forms_the_trainer_cannot_run_are_refused(validate, recipe, section, loc):
    recipe["lr_scheduler"] = section
    error_at(validate(recipe), loc)
