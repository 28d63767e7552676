"""The recipe schema: every fixed-shape section of a fine-tuning recipe, in pydantic v2.

A recipe (NeMo AutoModel style) has fixed sections (`step_scheduler`, `rng`,
`dataloader`, `checkpoint`, `peft`, ...), validated here with unknown keys refused and a
"did you mean", and `_target_` sections (`model`, `dataset`, `optimizer`, ...) whose
keyword names `jobs.recipe.targets.allowlist` checks. `distributed` belongs to `jobs.recipe.topology.setup`.
`fold_synonyms` maps the accepted synonyms onto canonical keys before validation:
`val_every_steps` -> `val_check_interval`, `ckpt_every_steps` -> `checkpoint_interval`,
top-level `seed` -> `rng.seed`, `checkpoint.restore_from` -> `restore_from`.
`normalize_restore_from` gives `restore_from` one of its accepted forms.
"""

from __future__ import annotations

from functools import cache
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from jobs.recipe.automodel.families import recipe_family_error
from jobs.recipe.errors import FieldError, did_you_mean, shown
from jobs.recipe.load import limits
from jobs.recipe.load.plain import fresh
from jobs.recipe.load.schema_errors import field_errors
from jobs.recipe.sections.recovery import RecoverySection
from jobs.recipe.sections.retention import KeepBestSection

PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
# Counts bounded by `jobs.recipe.load.limits`: a value past its maximum is refused at its
# field ("less than or equal to N"), before the plan multiplies it with anything.
Steps = Annotated[int, Field(gt=0, le=limits.MAX_STEPS)]
Epochs = Annotated[int, Field(gt=0, le=limits.MAX_EPOCHS)]
GlobalBatch = Annotated[int, Field(gt=0, le=limits.MAX_GLOBAL_BATCH)]
LocalBatch = Annotated[int, Field(gt=0, le=limits.MAX_LOCAL_BATCH)]
Accumulation = Annotated[int, Field(gt=0, le=limits.MAX_GRAD_ACCUMULATION)]

TARGET_SECTIONS = (
    "model",
    "loss_fn",
    "dataset",
    "validation_dataset",
    "optimizer",
    "lr_scheduler",
    "teacher_model",
    "kd_loss_fn",
    "tokenizer",
)
REQUIRED_TARGET_SECTIONS = ("model", "dataset", "optimizer")
RECIPE_NAMES = {
    "llm_finetune": "llm_finetune",
    "finetune": "llm_finetune",
    "llm.finetune": "llm_finetune",
    "TrainFinetuneRecipeForNextTokenPrediction": "llm_finetune",
    "nemo_automodel.recipes.llm.train_ft.TrainFinetuneRecipeForNextTokenPrediction": "llm_finetune",
    "llm_kd": "llm_kd",
    "kd": "llm_kd",
    "llm.kd": "llm_kd",
    "KnowledgeDistillationRecipeForNextTokenPrediction": "llm_kd",
    "nemo_automodel.recipes.llm.kd.KnowledgeDistillationRecipeForNextTokenPrediction": "llm_kd",
    "llm_benchmark": "llm_benchmark",
    "benchmark": "llm_benchmark",
    "BenchmarkingRecipeForNextTokenPrediction": "llm_benchmark",
    "nemo_automodel.recipes.llm.benchmark.BenchmarkingRecipeForNextTokenPrediction": "llm_benchmark",
}
# `_target_` values a fixed section may carry as a marker (AutoModel writes them).
SECTION_MARKERS = {
    "rng": {"nemo_automodel.components.training.rng.StatefulRNG", "tuneyard.rng.StatefulRNG"},
    "dataloader": {
        "torchdata.stateful_dataloader.StatefulDataLoader",
        "torch.utils.data.DataLoader",
    },
    "validation_dataloader": {
        "torchdata.stateful_dataloader.StatefulDataLoader",
        "torch.utils.data.DataLoader",
    },
    "peft": {"nemo_automodel.components._peft.lora.PeftConfig", "tuneyard.peft.LoraConfig"},
}
THD_COLLATE_FN = "nemo_automodel.components.datasets.utils.packed_sequence_thd_collater"
COLLATE_FNS = {
    "nemo_automodel.components.datasets.utils.default_collater",
    "tuneyard.datasets.default_collater",
    # torch's stacking collate: the same batch for fixed-length samples (pretraining data)
    "torch.utils.data.default_collate",
    "torch.utils.data.dataloader.default_collate",
    # packed rows with their THD fields (seq_lens, cu_seqlens); only with packing
    THD_COLLATE_FN,
}


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, defer_build=True)


class StepSchedulerSection(Section):
    max_steps: Steps | None = None
    num_epochs: Epochs | None = None  # None: unbounded when max_steps is given
    global_batch_size: GlobalBatch | None = None
    local_batch_size: LocalBatch | None = None
    grad_accumulation_steps: Accumulation | None = None
    val_check_interval: Steps | None = None
    checkpoint_interval: Steps | None = None
    log_interval: Steps = 1
    # Also a checkpoint at the step that ends each pass over the data. AutoModel's default
    # is true; tuneyard's stays false (a checkpoint every checkpoint_interval and at the end).
    save_checkpoint_every_epoch: bool = False
    # Train records go to wandb/mlflow at the first step and every N-th after it, as in
    # AutoModel; metrics.jsonl always has every step.
    log_remote_every_steps: Steps = 1


class RngSection(Section):
    seed: NonNegativeInt = 42
    ranked: bool = False


class DistEnvSection(Section):
    backend: Literal["nccl", "gloo"] | None = None
    timeout_minutes: Annotated[int, Field(gt=0, le=limits.MAX_TIMEOUT_MINUTES)] | None = None
    master_addr: str | None = None
    master_port: Annotated[int, Field(ge=1, le=65535)] | None = None


class CompileSection(Section):
    enabled: bool = False
    backend: Literal["inductor", "aot_eager", "eager", "cudagraphs"] | None = "inductor"
    mode: (
        Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] | None
    ) = "default"
    fullgraph: bool = False
    dynamic: bool | None = None


class ClipGradNormSection(Section):
    max_norm: PositiveFloat | None = None


class PackedSequenceSection(Section):
    enabled: bool | None = None
    packed_sequence_size: Annotated[int, Field(ge=0, le=limits.MAX_SEQ_LENGTH)] = 0
    split_across_pack: bool = False
    max_packs: Annotated[int, Field(gt=0, le=limits.MAX_DATASET_SAMPLES)] | None = None
    drop_long_samples: bool = False  # a sample longer than a pack: dropped, not truncated


class DataloaderSection(Section):
    batch_size: LocalBatch | None = None
    num_workers: Annotated[int, Field(ge=0, le=limits.MAX_DATALOADER_WORKERS)] = 0
    shuffle: bool = True
    drop_last: bool = False
    pin_memory: bool = False
    persistent_workers: bool = False
    collate_fn: str | None = None


class ValidationDataloaderSection(DataloaderSection):
    shuffle: bool = False


class CheckpointSection(Section):
    enabled: bool = True
    checkpoint_dir: str | None = None
    keep_last: PositiveInt | None = None
    keep_best: KeepBestSection | None = None  # `jobs.recipe.sections.retention`
    save_consolidated: bool = True
    model_save_format: Literal["safetensors", "torch_save"] = "safetensors"
    save_optimizer: bool = True
    is_async: bool = False


class PeftSection(Section):
    target_modules: list[str] | None = None
    exclude_modules: list[str] | None = None
    match_all_linear: bool | None = None
    dim: Annotated[int, Field(gt=0, le=limits.MAX_LORA_RANK)] = 8
    alpha: Annotated[float, Field(gt=0, le=limits.MAX_LORA_ALPHA)] = 32.0
    dropout: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.0
    dropout_position: Literal["pre", "post"] = "post"
    use_dora: bool = False
    use_triton: bool = False
    # AutoModel's expert LoRA rank dim // experts per token, checked against the model's
    # config (`jobs.recipe.sections.values.check_moe_rank_scaling`).
    moe_rank_scaling: bool = False


class Fp8Section(Section):
    enabled: bool = False
    recipe_name: Literal["tensorwise", "rowwise", "rowwise_with_gw_hp"] = "tensorwise"
    enable_fsdp_float8_all_gather: bool = False
    precompute_float8_dynamic_scale_for_fsdp: bool = False
    force_recompute_fp8_weight_in_bwd: bool = False
    filter_fqns: list[str] = Field(default_factory=list)
    emulate: bool = False


class QatSection(Section):
    enabled: bool = False
    quantizer: str | dict[str, Any] | None = None
    fake_quant_after_n_steps: Annotated[int, Field(ge=0, le=limits.MAX_STEPS)] | None = None
    groupsize: Annotated[int, Field(gt=0, le=limits.MAX_QUANT_GROUP_SIZE)] | None = None


class BenchmarkSection(Section):
    """`benchmark:` of `recipe: llm_benchmark`; `jobs.recipe.sections.benchmark` derives the counts."""

    warmup_steps: Steps = 2
    measured_steps: Steps | None = None  # None: step_scheduler.max_steps - warmup_steps
    # per device; None: the trainer's device table
    peak_tflops: Annotated[float, Field(gt=0, le=limits.MAX_PEAK_TFLOPS)] | None = None


class RestoreFromSection(Section):
    """`restore_from: {path: ...}` or `{job: <id>, step: N}` (no step: that job's LATEST)."""

    path: str | None = None
    job: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    step: Steps | None = None


RESTORE_FIX = "write restore_from: {path: LATEST}, {path: <checkpoint dir>} or {job: <id>, step: N}"


def _restore_form_errors(form: RestoreFromSection) -> list[FieldError]:
    if form.path is not None and form.job is not None:
        return [
            FieldError("restore_from.job", "cannot be given with restore_from.path", RESTORE_FIX)
        ]
    if form.step is not None and form.job is None:
        msg = "goes with restore_from.job (a path names its step directory itself)"
        return [FieldError("restore_from.step", msg, RESTORE_FIX)]
    if form.path is None and form.job is None:
        return [FieldError("restore_from.path", "must be LATEST or a checkpoint path", RESTORE_FIX)]
    return []


def normalize_restore_from(value: Any) -> tuple[dict[str, Any] | None, list[FieldError]]:
    """null | "LATEST" | a path | {path} | {job, step?} -> null, {"path"} or {"job", "step"}.

    `jobs.recipe.paths.data.check_checkpoint_paths` resolves the job form to a path.
    """
    if value is None:
        return None, []
    if isinstance(value, str):
        return {"path": value}, []
    if not isinstance(value, dict):
        return None, [
            FieldError("restore_from.path", "must be LATEST or a checkpoint path", RESTORE_FIX)
        ]
    try:
        form = RestoreFromSection.model_validate(value)
    except ValidationError as exc:
        return None, field_errors(exc, "restore_from", RestoreFromSection.model_fields)
    errors = _restore_form_errors(form)
    if errors:
        return None, errors
    if form.path is not None:
        return {"path": form.path}, []
    return {"job": form.job, "step": form.step}, []


FIXED_SECTIONS: dict[str, type[Section]] = {
    "step_scheduler": StepSchedulerSection,
    "rng": RngSection,
    "dist_env": DistEnvSection,
    "compile": CompileSection,
    "clip_grad_norm": ClipGradNormSection,
    "packed_sequence": PackedSequenceSection,
    "dataloader": DataloaderSection,
    "validation_dataloader": ValidationDataloaderSection,
    "checkpoint": CheckpointSection,
    "fp8": Fp8Section,
    "qat": QatSection,
    "recovery": RecoverySection,  # opt-in divergence recovery (`jobs.recipe.sections.recovery`)
}
TOP_LEVEL_KEYS = frozenset(
    {
        *FIXED_SECTIONS,
        *TARGET_SECTIONS,
        "recipe",
        "seed",
        "distributed",
        "peft",
        "restore_from",
        "kd_ratio",
        "benchmark",
        "wandb",
        "mlflow",
        "neftune",  # `jobs.recipe.sections.neftune`
        "embedding_row_repair",  # `jobs.recipe.sections.embedding_row_repair`
        "quantization",  # QLoRA: `jobs.recipe.sections.quantization`
    }
)


def _fold_into(
    target: dict[str, Any],
    key: str,
    value: Any,
    loc: str,
    canonical_loc: str,
) -> list[FieldError]:
    if target.get(key) is not None and target[key] != value:
        return [
            FieldError(
                loc,
                f"conflicts with {canonical_loc} ({value!r} vs {target[key]!r})",
                f"keep only {canonical_loc}",
            )
        ]
    target[key] = value
    return []


def _fold(section: dict[str, Any], synonym: str, canonical: str, loc: str) -> list[FieldError]:
    if synonym not in section:
        return []
    return _fold_into(
        section, canonical, section.pop(synonym), f"{loc}.{synonym}", f"{loc}.{canonical}"
    )


def fold_synonyms(recipe: dict[str, Any]) -> list[FieldError]:
    """Move synonyms onto canonical keys, in place; a conflicting pair is an error."""
    errors: list[FieldError] = []
    step = recipe.get("step_scheduler")
    if isinstance(step, dict):
        errors += _fold(step, "val_every_steps", "val_check_interval", "step_scheduler")
        errors += _fold(step, "ckpt_every_steps", "checkpoint_interval", "step_scheduler")
    if "seed" in recipe:
        if recipe.get("rng") is None:
            recipe["rng"] = {}
        if isinstance(recipe["rng"], dict):
            errors += _fold_into(recipe["rng"], "seed", recipe.pop("seed"), "seed", "rng.seed")
    ckpt = recipe.get("checkpoint")
    if isinstance(ckpt, dict) and "restore_from" in ckpt:
        errors += _fold_into(
            recipe,
            "restore_from",
            ckpt.pop("restore_from"),
            "checkpoint.restore_from",
            "restore_from",
        )
    return errors


def strip_marker(name: str, section: dict[str, Any]) -> list[FieldError]:
    """Drop an allowed `_target_` marker from a fixed section; refuse any other value."""
    if "_target_" not in section:
        return []
    value = section.pop("_target_")
    allowed = SECTION_MARKERS.get(name, set())
    if isinstance(value, str) and value in allowed:
        return []
    fix = f"use one of {', '.join(sorted(allowed))} or remove it" if allowed else "remove it"
    return [FieldError(f"{name}._target_", f"{value!r} is not accepted in {name}", fix)]


def check_fixed_section(name: str, value: Any) -> tuple[dict[str, Any] | None, list[FieldError]]:
    """Validate one fixed section; returns its canonical dict (defaults filled) or errors."""
    cls = FIXED_SECTIONS.get(name) or (PeftSection if name == "peft" else None)
    assert cls is not None, name
    if value is None or (isinstance(value, dict) and not value):
        return fresh(_default_section(cls)), []
    if not isinstance(value, dict):
        return None, [FieldError(name, "must be a mapping", f"write {name}: as a YAML mapping")]
    section = dict(value)
    errors = strip_marker(name, section)
    collate = section.get("collate_fn")
    if isinstance(collate, dict) and set(collate) == {"_target_"}:
        section["collate_fn"] = collate["_target_"]
    try:
        model = cls.model_validate(section)
    except ValidationError as exc:
        return None, errors + field_errors(exc, name, cls.model_fields)
    if getattr(model, "collate_fn", None) not in (None, *COLLATE_FNS):
        errors.append(
            FieldError(
                f"{name}.collate_fn",
                f"{model.collate_fn!r} is not allowed",
                f"remove it or use {sorted(COLLATE_FNS)[0]}",
            )
        )
    return model.model_dump(mode="json"), errors


@cache
def _default_section(cls: type[Section]) -> dict[str, Any]:
    """An absent section's canonical dict (its defaults), worked out once per class: most
    recipes leave most fixed sections out. Callers get a `fresh` copy to fill in."""
    return cls.model_validate({}).model_dump(mode="json")


def unknown_top_level(recipe: dict[str, Any]) -> list[FieldError]:
    return [
        FieldError(
            str(key),
            f"unknown section {key!r}",
            did_you_mean(str(key), TOP_LEVEL_KEYS) or f"remove {key}",
        )
        for key in recipe
        if key not in TOP_LEVEL_KEYS
    ]


def check_recipe_name(value: Any) -> tuple[str, list[FieldError]]:
    if value is None:
        return "llm_finetune", []
    name = value.get("_target_") if isinstance(value, dict) else value
    if isinstance(name, str) and name in RECIPE_NAMES:
        return RECIPE_NAMES[name], []
    loc = "recipe._target_" if isinstance(value, dict) else "recipe"
    family = recipe_family_error(name, "recipe")
    if family is not None:
        return "llm_finetune", [family]
    hint = did_you_mean(str(name), RECIPE_NAMES) if isinstance(name, str) else ""
    return "llm_finetune", [
        FieldError(loc, f"unknown recipe {shown(name)}", hint or "use recipe: llm_finetune")
    ]
