"""AutoModel's recipe surface that tuneyard accepts without training on it, and what it refuses.

NeMo AutoModel recipes carry side sections (CI metadata, launcher blocks, profiler and
tracker settings) and loader or section keywords that do not change what tuneyard trains.
`fold_side_sections` takes them out of a raw recipe before the schema sees it and reports
each one as a warning naming why it is ignored, so nothing is dropped silently; a
section tuneyard does not know at all stays an error (`jobs.recipe.load.schema.unknown_top_level`).
`recipe_family_error` answers for recipe classes of families tuneyard does not train
(VLM, diffusion, retrieval, speculative decoding, audio, sequence classification) with
"not supported yet". Knowledge distillation (`llm_kd`) and benchmarking (`llm_benchmark`)
are recipes of their own: `jobs.recipe.sections.kd`, `jobs.recipe.sections.benchmark`. The model loader's
kernel keywords (`use_liger_kernel`, `use_sdpa_patching`, `sdpa_method`) are typed by
`KernelValues` and applied by the loader (`models.common.kernels`); `kernel_option_notes`
says at submit what of them will not apply.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from jobs.recipe.errors import QUOTE_MAX, FieldError, clip, shown

LAUNCHER = "a launcher block; tuneyard's worker launches the job on its own queue"
SIDE_SECTIONS: dict[str, str] = {
    "ci": "AutoModel CI metadata, not used by tuneyard",
    "nvtx": "NVTX profiling ranges; tuneyard's trainer adds none",
    "moe_metrics": "MoE load-balance logging, not logged by tuneyard",
    "skypilot": LAUNCHER,
    "slurm": LAUNCHER,
    "k8s": LAUNCHER,
    "nemo_run": LAUNCHER,
}

# Keys AutoModel's loaders and sections take that do not change what tuneyard trains, by
# section, with why each is ignored.
IGNORED_KEYS: dict[str, dict[str, str]] = {
    "model": {
        "backend": "AutoModel's kernel backend choice (TE, DeepEP, ...); tuneyard picks its own "
        "layers",
        "output_hidden_states": "the loss reads logits only",
        "load_base_model": "tuneyard always loads the base weights of a from_pretrained model",
        "router_aux_loss_coef": "tuneyard's trainer adds no router auxiliary loss",
    },
    "step_scheduler": {
        "gc_every_steps": "garbage-collection pacing only; it does not change training",
    },
    "checkpoint": {
        "dequantize_base_checkpoint": "tuneyard loads base weights in the model dtype as stored",
        "is_peft": "tuneyard knows from the peft section",
        "load_base_model": "tuneyard always loads the base weights of a from_pretrained model",
    },
    "loss_fn": {"fp32_upcast": "tuneyard's cross entropy always computes in fp32"},
    "dataloader": {"dataloader_type": "tuneyard builds one stateful loader for every recipe"},
    "validation_dataloader": {
        "dataloader_type": "tuneyard builds one stateful loader for every recipe"
    },
    "packed_sequence": {"packing_strategy": "tuneyard packs greedily in dataset order"},
    "benchmark": {
        "nsys_start": "Nsight Systems ranges are not wired; every measured step is timed",
        "nsys_end": "Nsight Systems ranges are not wired; every measured step is timed",
        "nsys_ranks": "Nsight Systems ranges are not wired; every measured step is timed",
        "num_nodes": "the job's resources decide the nodes",
        "json_output_path": "the summary is the benchmark_summary event, stored with the job",
    },
}
_TEACHER_KERNELS = "the teacher runs forward only, with its own layers"
IGNORED_KEYS["teacher_model"] = {  # a KD teacher loads like the student, without kernels
    **IGNORED_KEYS["model"],
    **{key: _TEACHER_KERNELS for key in ("use_liger_kernel", "use_sdpa_patching", "sdpa_method")},
}

# Recipe module paths of AutoModel's other families: (prefix, family).
FAMILY_MODULES = (
    ("nemo_automodel.recipes.vlm.", "VLM fine-tuning"),
    ("nemo_automodel.recipes.multimodal.", "multimodal fine-tuning"),
    ("nemo_automodel.recipes.diffusion.", "diffusion training"),
    ("nemo_automodel.recipes.retrieval.", "retrieval (bi-/cross-encoder) training"),
    ("nemo_automodel.recipes.biencoder.", "retrieval (bi-/cross-encoder) training"),
    ("nemo_automodel.recipes.encoder.", "retrieval (bi-/cross-encoder) training"),
    ("nemo_automodel.recipes.asr.", "audio (ASR) fine-tuning"),
    ("nemo_automodel.recipes.dllm.", "diffusion language model training"),
    ("nemo_automodel.recipes.llm.train_seq_cls.", "sequence classification"),
    ("nemo_automodel.recipes.llm.train_eagle", "speculative decoding (draft model) training"),
    ("nemo_automodel.recipes.llm.train_dflash", "speculative decoding (draft model) training"),
    ("nemo_automodel.recipes.llm.train_dspark", "speculative decoding (draft model) training"),
    ("nemo_automodel.recipes.llm.train_peagle", "speculative decoding (draft model) training"),
)
# The same families by bare class name, as a recipe may write it.
FAMILY_CLASSES = {
    "FinetuneRecipeForVLM": "VLM fine-tuning",
    "KnowledgeDistillationRecipeForVLM": "VLM knowledge distillation",
    "TrainDiffusionRecipe": "diffusion training",
    "TrainBiencoderRecipe": "retrieval (bi-/cross-encoder) training",
    "TrainFinetuneRecipeForSequenceClassification": "sequence classification",
}
# Sections only another family's recipe has: (family, its recipe class).
FAMILY_SECTIONS = {
    "flow_matching": ("diffusion training", "TrainDiffusionRecipe"),
}
NOT_SUPPORTED = "is not supported by tuneyard yet"
FAMILY_FIX = "tuneyard trains causal-LM fine-tuning and pretraining: use recipe: llm_finetune"


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


# Model loaders of other families (an image-text model is a VLM recipe's, whatever `recipe`).
FAMILY_MODEL_LOADERS = {
    "NeMoAutoModelForImageTextToText": ("VLM fine-tuning", "FinetuneRecipeForVLM"),
    "AutoModelForImageTextToText": ("VLM fine-tuning", "FinetuneRecipeForVLM"),
    "AutoModelForVision2Seq": ("VLM fine-tuning", "FinetuneRecipeForVLM"),
    "NeMoAutoModelForSequenceClassification": (
        "sequence classification",
        "TrainFinetuneRecipeForSequenceClassification",
    ),
}


def _model_family_errors(data: dict[str, Any]) -> list[FieldError]:
    model = data.get("model")
    target = model.get("_target_") if isinstance(model, dict) else None
    if not isinstance(target, str) or recipe_family_error(_recipe_name(data), "recipe"):
        return []
    loader = next((p for p in target.split(".") if p in FAMILY_MODEL_LOADERS), None)
    if loader is None:
        return []
    family, cls = FAMILY_MODEL_LOADERS[loader]
    msg = f"{family} ({cls}) {NOT_SUPPORTED}: model._target_ loads {loader}"
    return [FieldError("recipe", msg, FAMILY_FIX)]


def _recipe_name(data: dict[str, Any]) -> Any:
    value = data.get("recipe")
    return value.get("_target_") if isinstance(value, dict) else value


def is_family_refusal(error: FieldError) -> bool:
    """An answer that the recipe belongs to a family tuneyard does not train."""
    return error.loc == "recipe" and NOT_SUPPORTED in error.msg


def family_section_errors(data: dict[str, Any]) -> list[FieldError]:
    """A section only another family's recipe has names that family at `recipe`."""
    errors = _model_family_errors(data)
    for section, (family, cls) in FAMILY_SECTIONS.items():
        if section in data:
            data.pop(section)
            msg = f"{family} ({cls}) {NOT_SUPPORTED}: the recipe has its {section!r} section"
            errors.append(FieldError("recipe", msg, f"remove {section}; {FAMILY_FIX}"))
    return errors


SDPA_BACKEND_NAMES = ("cudnn_attention", "flash_attention", "efficient_attention", "math")


class KernelValues(BaseModel):
    """The model loader's kernel keywords, as AutoModel's loader takes them (strict bools;
    `sdpa_method`: `torch.nn.attention.SDPBackend` names, lower case)."""

    model_config = ConfigDict(strict=True)
    use_liger_kernel: bool = False
    use_sdpa_patching: bool = False
    sdpa_method: (
        list[Literal["cudnn_attention", "flash_attention", "efficient_attention", "math"]] | None
    ) = Field(default=None, min_length=1)

    @field_validator("sdpa_method")
    @classmethod
    def _distinct(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError("names a backend twice; list each SDPA backend once")
        return value


_NO_FLCE = (
    "applies Liger's RMSNorm, SwiGLU and RoPE kernels on CUDA (the native layers, or "
    "liger's patch of the Hugging Face class); not its fused linear cross-entropy: the "
    "loss is computed from the logits by loss_fn; without CUDA or liger_kernel the run "
    "falls back to the model's own layers (a kernel_fallback event)"
)


def _size(distributed: Any, key: str) -> int:
    value = distributed.get(key) if isinstance(distributed, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 1


def kernel_option_notes(data: dict[str, Any]) -> list[FieldError]:
    """Warnings for the model's kernel keywords: what Liger applies, Liger turned off under
    tensor or context parallelism (its kernels take no DTensors, as AutoModel turns it off),
    and `sdpa_method` settling `use_sdpa_patching` (AutoModel's default true when absent)."""
    model = data.get("model")
    if not isinstance(model, dict):
        return []
    notes = []
    if model.get("use_liger_kernel") is True:
        distributed = data.get("distributed")
        sizes = {k: _size(distributed, k) for k in ("tp_size", "cp_size")}
        split = [f"distributed.{k}: {v}" for k, v in sizes.items() if v > 1]
        if split:
            model["use_liger_kernel"] = False
            msg = (
                f"not applied with {', '.join(split)}: Liger's kernels cannot take sharded tensors"
            )
            notes.append(FieldError("model.use_liger_kernel", msg, "remove use_liger_kernel"))
        else:
            notes.append(FieldError("model.use_liger_kernel", _NO_FLCE))
    attn = model.get("attn_implementation")
    if model.get("use_sdpa_patching") is True and attn not in (None, "sdpa", "eager"):
        notes.append(
            FieldError(
                "model.use_sdpa_patching",
                f"changes nothing: the model attends with {shown(attn)}, not SDPA",
            )
        )
    if isinstance(model.get("sdpa_method"), list):
        if "use_sdpa_patching" not in model:
            model["use_sdpa_patching"] = True
            notes.append(
                FieldError(
                    "model.use_sdpa_patching",
                    "taken as true (AutoModel's default) because sdpa_method is set",
                )
            )
        elif model["use_sdpa_patching"] is False:
            model.pop("sdpa_method")
            notes.append(
                FieldError("model.sdpa_method", "accepted and ignored: use_sdpa_patching is false")
            )
    return notes


def fold_side_sections(data: dict[str, Any]) -> list[FieldError]:
    """Pop AutoModel's side sections and ignored keys from `data`, one warning for each."""
    warnings = kernel_option_notes(data)
    for name, why in SIDE_SECTIONS.items():
        if name in data:
            data.pop(name)
            warnings.append(FieldError(name, f"accepted and ignored: {why}"))
    for section, keys in IGNORED_KEYS.items():
        values = data.get(section)
        if not isinstance(values, dict):
            continue
        for key, why in keys.items():
            if key in values:
                values.pop(key)
                warnings.append(FieldError(f"{section}.{key}", f"accepted and ignored: {why}"))
    return warnings
