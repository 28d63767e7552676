"""AutoModel's recipe surface that tuneyard accepts without training on it, and what it refuses.

NeMo AutoModel recipes carry side sections (CI metadata, launcher blocks, profiler and
tracker settings) and loader or section keywords that do not change what tuneyard trains.
`fold_side_sections` takes them out of a raw recipe before the schema sees it and reports
each one as a warning naming why it is ignored, so nothing is dropped silently; a
section tuneyard does not know at all stays an error (`jobs.recipe.load.schema.unknown_top_level`).
A top-level key starting with `_` (`_validation_dataset:`, `_chat_template: &tpl ...`) is
one no AutoModel recipe reads: its recipes read their sections by name, so such a key only
holds YAML anchors or a section switched off; it is dropped with a warning, before any
`_target_` inside it is looked at. Recipes of families tuneyard does not train are
answered in `jobs.recipe.automodel.families`. Knowledge distillation (`llm_kd`) and
benchmarking (`llm_benchmark`) are recipes of their own: `jobs.recipe.sections.kd`,
`jobs.recipe.sections.benchmark`. The model loader's kernel keywords (`use_liger_kernel`,
`use_sdpa_patching`, `sdpa_method`) are typed by `KernelValues` and applied by the loader
(`models.common.kernels`); `kernel_option_notes` says at submit what of them will not apply.
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

BASE_WEIGHTS = "tuneyard always loads the base weights of a from_pretrained model"
# Keys AutoModel's loaders and sections take that do not change what tuneyard trains, by
# section, with why each is ignored.
IGNORED_KEYS: dict[str, dict[str, str]] = {
    "model": {
        "backend": "AutoModel's kernel backend choice (TE, DeepEP, ...); tuneyard picks its own "
        "layers",
        "output_hidden_states": "the loss reads logits only",
        # `load_base_model` is the loader's choice of weights (`automodel.blocks`)
        "router_aux_loss_coef": "tuneyard's trainer adds no router auxiliary loss",
    },
    "step_scheduler": {
        "gc_every_steps": "garbage-collection pacing only; it does not change training",
    },
    "checkpoint": {
        "dequantize_base_checkpoint": "tuneyard loads base weights in the model dtype as stored",
        "is_peft": "tuneyard knows from the peft section",
        "load_base_model": BASE_WEIGHTS,
    },
    "loss_fn": {"fp32_upcast": "tuneyard's cross entropy always computes in fp32"},
    "dataloader": {"dataloader_type": "tuneyard builds one stateful loader for every recipe"},
    "validation_dataloader": {
        "dataloader_type": "tuneyard builds one stateful loader for every recipe"
    },
    "packed_sequence": {"packing_strategy": "tuneyard packs greedily in dataset order"},
    "qat": {
        "qat_config": "torchao's quantizer settings; quantization-aware training is not run "
        "by tuneyard (qat.enabled: true is refused), so nothing reads them"
    },
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
    "load_base_model": BASE_WEIGHTS,
    **{key: _TEACHER_KERNELS for key in ("use_liger_kernel", "use_sdpa_patching", "sdpa_method")},
}

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


UNREAD = (
    "accepted and ignored: AutoModel's recipes read their sections by name and none starts "
    "with '_', so this key only holds YAML anchors (or a section switched off); tuneyard "
    "reads nothing in it either"
)


def is_unread_key(key: Any) -> bool:
    """A top-level `_name` (not a `_target_`-style `_name_`): a key no recipe reads."""
    return isinstance(key, str) and key.startswith("_") and not key.endswith("_")


def fold_side_sections(data: dict[str, Any]) -> list[FieldError]:
    """Pop AutoModel's side sections and ignored keys from `data`, one warning for each."""
    unread = [key for key in data if is_unread_key(key)]
    for key in unread:
        data.pop(key)
    warnings = [FieldError(clip(key, QUOTE_MAX), UNREAD) for key in unread]
    warnings += kernel_option_notes(data)
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
