"""Recipes of AutoModel's other families, recognised so that one answer says so.

tuneyard trains causal-LM fine-tuning and pretraining, distillation and benchmarks. A
recipe of another AutoModel family (VLM, multimodal, audio, diffusion, diffusion language
models, speculative decoding, retrieval, sequence classification) gets one error at
`recipe`, `<family> (<Class>) is not supported by tuneyard yet`, from `recipe_family`, and
`validate_job` stops there: the family's own sections are not errors to fix one by one.
A recipe is recognised, in this order, by the recipe class it names (`recipe:` as a bare
class name, a dotted path or `{_target_: ...}`), by its model loader (an image-text or
embedding `_target_`), or by a section that only that family's runner reads
(`flow_matching`, `dllm`, `recipe_args`, `mining`, a diffusion `inference` block, a
speculative-decoding benchmark's `datasets` list). A multimodal checkpoint loaded by an
LLM recipe (`NeMoAutoModelForCausalLM` on a Qwen3-VL config) is not another family's
recipe: its text backbone is a causal LM, which the model rules answer for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jobs.recipe.errors import QUOTE_MAX, FieldError, clip

NOT_SUPPORTED = "is not supported by tuneyard yet"
FAMILY_FIX = "tuneyard trains causal-LM fine-tuning and pretraining: use recipe: llm_finetune"

VLM = "VLM fine-tuning"
MULTIMODAL = "multimodal fine-tuning"
DIFFUSION = "diffusion training"
DLLM = "diffusion language model training"
RETRIEVAL = "retrieval (bi-/cross-encoder) training"
SPECULATIVE = "speculative decoding (draft model) training"
SEQ_CLS = "sequence classification"

# Recipe module paths of AutoModel's other families: (prefix, family).
FAMILY_MODULES = (
    ("nemo_automodel.recipes.vlm.", VLM),
    ("nemo_automodel.recipes.multimodal.", MULTIMODAL),
    ("nemo_automodel.recipes.diffusion.", DIFFUSION),
    ("nemo_automodel.recipes.dllm.", DLLM),
    ("nemo_automodel.recipes.retrieval.", RETRIEVAL),
    ("nemo_automodel.recipes.biencoder.", RETRIEVAL),
    ("nemo_automodel.recipes.encoder.", RETRIEVAL),
    ("nemo_automodel.recipes.asr.", "audio (ASR) fine-tuning"),
    ("nemo_automodel.recipes.llm.train_seq_cls.", SEQ_CLS),
    *(
        (f"nemo_automodel.recipes.llm.{module}", SPECULATIVE)
        for module in (
            "train_eagle",
            "train_peagle",
            "peagle_recipe",
            "train_dflash",
            "train_domino",
            "train_dspark",
            "precompute_dspark",
            "train_jetspec",
            "train_vispec",
        )
    ),
)
# The same families by bare class name, as AutoModel's examples write `recipe:` (every
# recipe class of AutoModel's other families).
FAMILY_CLASSES = {
    "FinetuneRecipeForVLM": VLM,
    "KnowledgeDistillationRecipeForVLM": "VLM knowledge distillation",
    "FinetuneRecipeForMultimodal": MULTIMODAL,
    "PretrainRecipeForMultimodal": "multimodal pretraining",
    "TrainDiffusionRecipe": DIFFUSION,
    "DiffusionLMSFTRecipe": DLLM,
    "DiffusionGemmaSFTRecipe": DLLM,
    "TrainBiencoderRecipe": RETRIEVAL,
    "TrainBiEncoderRecipe": RETRIEVAL,
    "TrainCrossEncoderRecipe": RETRIEVAL,
    "EmbeddingDistillRecipe": "retrieval embedding distillation",
    "MineHardNegativesRecipe": "retrieval hard-negative mining",
    "TrainFinetuneRecipeForSequenceClassification": SEQ_CLS,
    **{
        name: SPECULATIVE
        for name in (
            "TrainEagle1Recipe",
            "TrainEagle2Recipe",
            "TrainEagle3Recipe",
            "TrainDFlashRecipe",
            "TrainDFlash2Recipe",
            "TrainDominoRecipe",
            "TrainDSparkRecipe",
            "TrainJetSpecRecipe",
            "TrainVispecRecipe",
            "TrainVispecStage1Recipe",
        )
    },
}
# Model loaders of other families (an image-text model is a VLM recipe's, whatever
# `recipe` says): loader name -> (family, the recipe class that loads it).
FAMILY_MODEL_LOADERS = {
    "NeMoAutoModelForImageTextToText": (VLM, "FinetuneRecipeForVLM"),
    "AutoModelForImageTextToText": (VLM, "FinetuneRecipeForVLM"),
    "AutoModelForVision2Seq": (VLM, "FinetuneRecipeForVLM"),
    "NeMoAutoModelForMultimodalLM": (MULTIMODAL, "FinetuneRecipeForMultimodal"),
    "NeMoAutoModelBiEncoder": (RETRIEVAL, "TrainBiEncoderRecipe"),
    "NeMoAutoModelCrossEncoder": (RETRIEVAL, "TrainCrossEncoderRecipe"),
    "NeMoAutoModelForSequenceClassification": (
        SEQ_CLS,
        "TrainFinetuneRecipeForSequenceClassification",
    ),
}


def _any(value: Any) -> bool:
    return True


def _diffusion_sampler(value: Any) -> bool:
    """A diffusion pipeline's sampling block (steps and guidance), not a word of ours."""
    return isinstance(value, dict) and bool({"num_inference_steps", "guidance_scale"} & set(value))


def _benchmark_datasets(value: Any) -> bool:
    """The speculative-decoding benchmark sweep's dataset list (`input_data` per entry)."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(item, dict) and "input_data" in item for item in value)
    )


# Sections only another family's runner reads: section -> (does this value belong to it,
# family, what reads it).
FAMILY_SECTIONS: dict[str, tuple[Callable[[Any], bool], str, str]] = {
    "flow_matching": (_any, DIFFUSION, "TrainDiffusionRecipe"),
    "dllm": (_any, DLLM, "DiffusionLMSFTRecipe"),
    "recipe_args": (_any, SPECULATIVE, "a TrainEagle*/TrainDFlash*/TrainDSpark* recipe"),
    "mining": (_any, "retrieval hard-negative mining", "MineHardNegativesRecipe"),
    "inference": (_diffusion_sampler, "diffusion generation", "AutoModel's diffusion generate.py"),
    "datasets": (
        _benchmark_datasets,
        "speculative decoding benchmarking",
        "AutoModel's speculative bench_sweep",
    ),
}


def family_of(name: str) -> str | None:
    """The family of an AutoModel recipe class name (dotted or bare), if tuneyard lacks it."""
    for prefix, family in FAMILY_MODULES:
        if name.startswith(prefix):
            return family
    return FAMILY_CLASSES.get(name.rsplit(".", 1)[-1])


def recipe_family_error(name: Any, loc: str) -> FieldError | None:
    """`<family> (<Class>) is not supported by tuneyard yet` for another family's recipe."""
    family = family_of(name) if isinstance(name, str) else None
    if family is None:
        return None
    cls = clip(name.rsplit(".", 1)[-1], QUOTE_MAX)
    return FieldError(loc, f"{family} ({cls}) {NOT_SUPPORTED}", FAMILY_FIX)


def is_family_refusal(error: FieldError) -> bool:
    """An answer that the recipe belongs to a family tuneyard does not train."""
    return error.loc == "recipe" and NOT_SUPPORTED in error.msg


def _recipe_name(data: dict[str, Any]) -> Any:
    value = data.get("recipe")
    return value.get("_target_") if isinstance(value, dict) else value


def _loader_family(data: dict[str, Any]) -> FieldError | None:
    model = data.get("model")
    target = model.get("_target_") if isinstance(model, dict) else None
    if not isinstance(target, str):
        return None
    loader = next((p for p in target.split(".") if p in FAMILY_MODEL_LOADERS), None)
    if loader is None:
        return None
    family, cls = FAMILY_MODEL_LOADERS[loader]
    msg = f"{family} ({cls}) {NOT_SUPPORTED}: model._target_ loads {loader}"
    return FieldError("recipe", msg, FAMILY_FIX)


def _section_family(data: dict[str, Any]) -> FieldError | None:
    for section, (belongs, family, reader) in FAMILY_SECTIONS.items():
        if section in data and belongs(data[section]):
            msg = f"{family} ({reader}) {NOT_SUPPORTED}: the recipe has its {section!r} section"
            return FieldError("recipe", msg, f"remove {section}; {FAMILY_FIX}")
    return None


def recipe_family(data: dict[str, Any]) -> FieldError | None:
    """The one answer for a recipe of a family tuneyard does not train, else None: by the
    recipe class it names, its model loader, or a section only that family reads."""
    return (
        recipe_family_error(_recipe_name(data), "recipe")
        or _loader_family(data)
        or _section_family(data)
    )
