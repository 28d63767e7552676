"""AutoModel side sections, ignored keys and other recipe families (jobs.recipe.automodel.sections)."""

from __future__ import annotations

from typing import Any

import pytest
from recipe_asserts import error_at

from jobs.recipe.typed import Recipe

AM = "nemo_automodel"


@pytest.fixture
def am_recipe(recipe: dict[str, Any]) -> dict[str, Any]:
    """The test recipe written the way AutoModel's llm_finetune examples write it."""
    recipe["recipe"] = {
        "_target_": f"{AM}.recipes.llm.train_ft.TrainFinetuneRecipeForNextTokenPrediction"
    }
    recipe["rng"] = {"_target_": f"{AM}.components.training.rng.StatefulRNG", "seed": 1111,
                     "ranked": True}  # fmt: skip
    recipe["model"]["_target_"] = f"{AM}.NeMoAutoModelForCausalLM.from_pretrained"
    recipe["dataset"]["_target_"] = f"{AM}.components.datasets.llm.squad.make_squad_dataset"
    recipe["loss_fn"] = {"_target_": f"{AM}.components.loss.masked_ce.MaskedCrossEntropy"}
    recipe["distributed"] = {"strategy": "fsdp2", "dp_size": "none", "tp_size": 1, "cp_size": 1}
    recipe["dataloader"] = {
        "_target_": "torchdata.stateful_dataloader.StatefulDataLoader",
        "collate_fn": {"_target_": f"{AM}.components.datasets.utils.default_collater"},
        "shuffle": False,
    }
    recipe["lr_scheduler"] = {"lr_decay_style": "cosine", "min_lr": 1.0e-6}
    recipe["ci"] = {"time": "00:30:00"}
    return recipe


def _warning(result, loc: str) -> str:
    found = [w.msg for w in result.warnings if w.loc == loc]
    assert found, f"no warning at {loc}: {[str(w) for w in result.warnings]}"
    return found[0]


def test_automodel_shaped_recipe_validates_and_round_trips(validate, am_recipe):
    result = validate(am_recipe)
    assert result.valid, [str(e) for e in result.errors]
    assert "CI metadata" in _warning(result, "ci")
    assert Recipe.from_json(result.typed.to_json()) == result.typed
    assert result.plan["warnings"] == [w.to_dict() for w in result.warnings]


def test_a_misspelt_section_is_still_refused_with_a_suggestion(validate, am_recipe):
    am_recipe["optimzer"] = am_recipe.pop("optimizer")
    result = validate(am_recipe)
    assert not result.valid
    assert "optimizer" in error_at(result, "optimzer").fix


@pytest.mark.parametrize("section", ["ci", "nvtx", "moe_metrics", "skypilot", "slurm", "k8s"])
def test_side_sections_are_warnings(validate, am_recipe, section):
    am_recipe[section] = {"enabled": True}
    result = validate(am_recipe)
    assert result.valid, [str(e) for e in result.errors]
    assert "accepted and ignored" in _warning(result, section)


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("model", "backend", {"_target_": f"{AM}.components.models.common.BackendConfig"}),
        ("model", "output_hidden_states", True),
        ("model", "load_base_model", True),
        ("model", "router_aux_loss_coef", 0.001),
        ("step_scheduler", "gc_every_steps", 100),
        ("checkpoint", "dequantize_base_checkpoint", True),
        ("loss_fn", "fp32_upcast", True),
        ("dataloader", "dataloader_type", "stateful"),
        ("packed_sequence", "packing_strategy", "thd"),
    ],
)
def test_loader_and_section_kwargs_are_reported_ignored(validate, am_recipe, section, key, value):
    am_recipe.setdefault(section, {})[key] = value
    result = validate(am_recipe)
    assert result.valid, [str(e) for e in result.errors]
    assert "accepted and ignored" in _warning(result, f"{section}.{key}")


@pytest.mark.parametrize(
    ("name", "family"),
    [
        (f"{AM}.recipes.vlm.finetune.FinetuneRecipeForVLM", "VLM fine-tuning"),
        ("FinetuneRecipeForVLM", "VLM fine-tuning"),
        (f"{AM}.recipes.diffusion.train.TrainDiffusionRecipe", "diffusion"),
        (f"{AM}.recipes.biencoder.train_biencoder.TrainBiencoderRecipe", "retrieval"),
        (f"{AM}.recipes.retrieval.train_bi_encoder.TrainBiEncoderRecipe", "retrieval"),
        (f"{AM}.recipes.llm.train_eagle3.TrainEagle3Recipe", "speculative decoding"),
        (f"{AM}.recipes.asr.finetune.FinetuneRecipeForASR", "audio"),
        (
            f"{AM}.recipes.llm.train_seq_cls.TrainFinetuneRecipeForSequenceClassification",
            "sequence classification",
        ),
    ],
)
def test_other_families_are_not_supported_at_recipe(validate, am_recipe, name, family):
    am_recipe["recipe"] = {"_target_": name}
    error = error_at(validate(am_recipe), "recipe")
    assert family in error.msg and "is not supported by tuneyard yet" in error.msg
    assert f"({name.rsplit('.', 1)[-1]})" in error.msg


def test_a_family_only_section_names_the_family(validate, am_recipe):
    am_recipe["flow_matching"] = {"timestep_sampling": "logit_normal"}
    error = error_at(validate(am_recipe), "recipe")
    assert "diffusion training (TrainDiffusionRecipe) is not supported" in error.msg


def test_an_image_text_model_is_a_vlm_recipe_whatever_recipe_says(validate, am_recipe):
    am_recipe.pop("recipe")
    am_recipe["model"] = {"_target_": f"{AM}.NeMoAutoModelForImageTextToText.from_pretrained",
                          "pretrained_model_name_or_path": "google/gemma-3-4b-it"}  # fmt: skip
    am_recipe["freeze_config"] = {"freeze_vision_tower": True}
    result = validate(am_recipe)
    [error] = result.errors  # the family answer alone, not its sections' details
    assert error.loc == "recipe"
    assert error.msg.startswith("VLM fine-tuning (FinetuneRecipeForVLM) is not supported")


@pytest.mark.parametrize(
    "target", ["AutoModelForVision2Seq", "transformers.AutoModelForVision2Seq"]
)
def test_a_loader_named_without_a_method_names_itself(validate, am_recipe, target):
    am_recipe["model"]["_target_"] = target
    error = error_at(validate(am_recipe), "recipe")
    assert error.msg.endswith("model._target_ loads AutoModelForVision2Seq")


def test_a_vlm_recipe_class_is_answered_alone(validate, am_recipe):
    am_recipe["recipe"] = {"_target_": f"{AM}.recipes.vlm.finetune.FinetuneRecipeForVLM"}
    am_recipe["freeze_config"] = {"freeze_vision_tower": True}
    [error] = validate(am_recipe).errors
    assert error.loc == "recipe" and "not supported" in error.msg
