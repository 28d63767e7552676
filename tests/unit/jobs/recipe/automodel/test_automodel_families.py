"""Other families' recipes get one answer at `recipe` and nothing else
(jobs.recipe.automodel.families)."""

from __future__ import annotations

from typing import Any

import pytest
from recipe_asserts import write_model_dir

from jobs.recipe.automodel.families import FAMILY_CLASSES, is_family_refusal

AM = "nemo_automodel"
NOT_SUPPORTED = "is not supported by tuneyard yet"


def _only_answer(result) -> str:
    """The single error at `recipe`, with no warnings beside it."""
    assert not result.valid
    assert [e.loc for e in result.errors] == ["recipe"], [str(e) for e in result.errors]
    assert result.warnings == [] and not result.plan.get("warnings")
    return result.errors[0].msg


def _speculative_recipe(name: str | None) -> dict[str, Any]:
    """How AutoModel's speculative examples are written: their own sections, no model."""
    recipe: dict[str, Any] = {
        "dist_env": {"backend": "nccl", "timeout_minutes": 30},
        "recipe_args": {"target_model_name_or_path": "Qwen/Qwen3-8B", "seq_length": 3072},
        "optimizer": {"lr": 6.0e-4, "warmup_ratio": 0.04},
        "checkpoint": {"enabled": True, "checkpoint_dir": "./outputs/dflash"},
        "ci": {"time": "00:30:00"},
    }
    return {"recipe": name, **recipe} if name else recipe


@pytest.mark.parametrize("name", sorted(FAMILY_CLASSES))
def test_every_recipe_class_of_another_family_is_one_answer(validate, name):
    msg = _only_answer(validate(_speculative_recipe(name)))
    assert msg.startswith(f"{FAMILY_CLASSES[name]} ({name}) {NOT_SUPPORTED}")


@pytest.mark.parametrize(
    ("target", "family"),
    [
        (f"{AM}.recipes.llm.train_domino.TrainDominoRecipe", "speculative decoding"),
        (f"{AM}.recipes.llm.train_jetspec.TrainJetSpecRecipe", "speculative decoding"),
        (f"{AM}.recipes.llm.train_vispec.TrainVispecStage1Recipe", "speculative decoding"),
    ],
)
def test_a_dotted_recipe_target_names_its_family(validate, recipe, target, family):
    recipe["recipe"] = {"_target_": target}
    msg = _only_answer(validate(recipe))
    assert family in msg and f"({target.rsplit('.', 1)[-1]})" in msg


@pytest.mark.parametrize(
    ("section", "value", "family"),
    [
        ("recipe_args", {"cache_output_dir": "/data/cache"}, "speculative decoding"),
        ("dllm", {"mode": "mdlm", "mask_token_id": 126336}, "diffusion language model"),
        ("mining", {"hard_negatives_to_mine": 20}, "hard-negative mining"),
        ("inference", {"num_inference_steps": 28, "guidance_scale": 3.5}, "diffusion generation"),
        ("datasets", [{"name": "gsm8k", "input_data": "openai/gsm8k"}], "benchmarking"),
    ],
)
def test_a_section_only_another_family_reads_is_one_answer(validate, section, value, family):
    """Configs without a `recipe:` (precompute, mining, generation, a bench sweep's list)."""
    msg = _only_answer(validate({"dist_env": {"backend": "nccl"}, section: value}))
    assert family in msg and f"the recipe has its {section!r} section" in msg


@pytest.mark.parametrize(
    ("section", "value"),
    [("datasets", {"path": "x"}), ("inference", {"batch_size": 4})],
)
def test_a_look_alike_section_of_ours_stays_an_unknown_section(validate, recipe, section, value):
    """A `datasets:` mapping (a typo of `dataset:`) or an `inference:` block that is not a
    diffusion sampler's is still an unknown section, with its did-you-mean."""
    recipe[section] = value
    result = validate(recipe)
    assert not any(is_family_refusal(e) for e in result.errors)
    assert section in [e.loc for e in result.errors]


@pytest.mark.parametrize(
    ("loader", "cls"),
    [
        ("NeMoAutoModelBiEncoder", "TrainBiEncoderRecipe"),
        ("NeMoAutoModelCrossEncoder", "TrainCrossEncoderRecipe"),
        ("NeMoAutoModelForMultimodalLM", "FinetuneRecipeForMultimodal"),
    ],
)
def test_another_familys_model_loader_is_one_answer(validate, recipe, loader, cls):
    recipe["model"]["_target_"] = f"{AM}.{loader}.from_pretrained"
    recipe["temperature"] = 0.02  # the bi-encoder's own top-level key
    msg = _only_answer(validate(recipe))
    assert f"({cls}) {NOT_SUPPORTED}: model._target_ loads {loader}" in msg


def test_validation_stops_at_the_family_answer(validate):
    """Neither the missing sections, the unknown ones, a bad override nor the side
    sections' warnings are reported beside it."""
    recipe = {"recipe": "TrainEagle3Recipe", "recipe_args": {"seq_length": "long"}, "ci": {}}
    result = validate(recipe, ["optimizer.lr=fast", "step_scheduler.max_steps=-1"])
    assert "speculative decoding" in _only_answer(result)


def test_an_llm_recipe_on_a_multimodal_checkpoint_is_not_another_familys(
    validate, recipe, data_root
):
    """AutoModel's vlm_benchmark recipes run the LLM benchmark recipe on a VLM checkpoint's
    text backbone; tuneyard loads such a checkpoint through the Hugging Face class."""
    config = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
              "vision_config": {"model_type": "siglip_vision_model"},
              "text_config": {"model_type": "gemma3_text", "hidden_size": 64}}  # fmt: skip
    model = write_model_dir(data_root / "gemma3-mm", config)
    recipe["recipe"] = "BenchmarkingRecipeForNextTokenPrediction"
    recipe["model"]["pretrained_model_name_or_path"] = str(model)
    result = validate(recipe)
    assert not any(is_family_refusal(e) for e in result.errors)
