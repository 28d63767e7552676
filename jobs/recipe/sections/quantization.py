"""The `quantization:` section: AutoModel's QLoRA (bitsandbytes 4- or 8-bit base weights).

AutoModel builds a `transformers.BitsAndBytesConfig` from this section when `load_in_4bit`
or `load_in_8bit` is true and loads the base weights quantized under the LoRA adapters;
with neither set it quantizes nothing. tuneyard does the same on its own loader: each
linear layer of the loaded model except the output head becomes bitsandbytes'
`Linear4bit` (or `Linear8bitLt`) holding the quantized weight, frozen, and PEFT puts its
adapters over it (`trainer.qlora`). The keys and defaults are AutoModel's
(`create_bnb_config`): nf4, double quantization, bfloat16 compute and storage.

It runs on CUDA workers and, through bitsandbytes' CPU backend (0.46 on), on CPU workers,
where a warning says that it saves memory at a cost in speed (each weight is dequantized on
every forward). It trains LoRA adapters over a frozen base, so it needs a `peft` section, a
pretrained model (`from_pretrained`: a `from_config` model has no weights to quantize) and
one whole copy of each linear layer per rank (no tp, pp or ep). The quantized weights stay
out of FSDP2's sharding (frozen, whole on each data-parallel rank, never gathered).
A section that asks for no quantization is accepted with a warning, as AutoModel ignores it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from jobs.recipe.errors import FieldError, shown
from jobs.recipe.load.schema_errors import field_errors
from jobs.recipe.topology.pipeline import parallel_size

BITS = ("load_in_4bit", "load_in_8bit")
REMOVE = (
    "remove the quantization section: LoRA then trains over base weights in the model's "
    "dtype (bf16 weights take about 4x the memory of 4-bit ones)"
)
Dtype = Literal["bfloat16", "float16", "float32"]
# BitsAndBytesConfig's other keys: AutoModel's `create_bnb_config` does not pass them on.
IGNORED = (
    "llm_int8_skip_modules",
    "llm_int8_enable_fp32_cpu_offload",
    "llm_int8_has_fp16_weight",
    "quant_method",
)
# Parallel layouts that split or move a linear layer's weight: a quantized weight is whole.
WHOLE_WEIGHTS = {
    "tp_size": "tensor parallelism shards each linear layer's weight",
    "pp_size": "pipeline parallelism splits the model after it is loaded",
    "ep_size": "expert parallelism spreads the experts' weights",
}


class QuantizationSection(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    load_in_4bit: bool = False
    load_in_8bit: bool = False
    bnb_4bit_compute_dtype: Dtype = "bfloat16"
    bnb_4bit_use_double_quant: bool = True
    bnb_4bit_quant_type: Literal["nf4", "fp4"] = "nf4"
    bnb_4bit_quant_storage: Dtype | Literal["uint8"] = "bfloat16"
    llm_int8_threshold: float = 6.0

    @field_validator("bnb_4bit_compute_dtype", "bnb_4bit_quant_storage", mode="before")
    @classmethod
    def _torch_prefix(cls, value: Any) -> Any:
        """`torch.bfloat16` is written as often as `bfloat16`."""
        return value.removeprefix("torch.") if isinstance(value, str) else value


@dataclass(frozen=True)
class Quantization:
    """`quantization:` as the trainer reads it: 4 or 8 bits and bitsandbytes' settings."""

    bits: int
    quant_type: str = "nf4"
    compute_dtype: str = "bfloat16"
    double_quant: bool = True
    quant_storage: str = "bfloat16"
    int8_threshold: float = 6.0


def _layout_errors(out: dict[str, Any]) -> list[FieldError]:
    """What the rest of the recipe must be for a quantized base (module docstring)."""
    errors = []
    if out.get("peft") is None:
        msg = "QLoRA trains LoRA adapters over the frozen quantized base; the recipe has no peft"
        fix = "add a peft section (e.g. peft: {target_modules: '*_proj', dim: 16, alpha: 32})"
        errors.append(FieldError("quantization", msg, fix))
    model = out.get("model")
    target = model.get("_target_") if isinstance(model, dict) else None
    if isinstance(target, str) and target.endswith("from_config"):
        msg = "a from_config model has no pretrained weights to quantize"
        errors.append(FieldError("quantization", msg, f"load with from_pretrained, or {REMOVE}"))
    for key, why in WHOLE_WEIGHTS.items():
        if (size := parallel_size(out.get("distributed") or {}, key)) > 1:
            msg = f"{size} cannot run with quantization: {why}, and a quantized weight is whole"
            errors.append(FieldError(f"distributed.{key}", msg, f"set {key}: 1, or {REMOVE}"))
    return errors


def check_quantization(
    value: Any, out: dict[str, Any], accelerator: str
) -> tuple[dict[str, Any] | None, list[FieldError], list[FieldError]]:
    """The normalized section, `Quantization`'s fields (None when absent or quantizing
    nothing), errors and warnings.
    `out`: the normalized recipe so far (its peft, model and distributed sections)."""
    if value is None:
        return None, [], []
    if not isinstance(value, dict):
        msg = f"must be a mapping such as {{load_in_4bit: true}}, got {shown(value)}"
        return None, [FieldError("quantization", msg, REMOVE)], []
    warnings = [
        FieldError(f"quantization.{key}", "accepted and ignored: AutoModel does not use it")
        for key in IGNORED
        if key in value
    ]
    try:
        section = QuantizationSection.model_validate(
            {k: v for k, v in value.items() if k not in IGNORED}
        )
    except ValidationError as exc:
        return None, field_errors(exc, "quantization", QuantizationSection.model_fields), []
    if section.load_in_4bit and section.load_in_8bit:
        msg = "load_in_4bit and load_in_8bit are both true; bitsandbytes quantizes to one width"
        fix = "set one of them to false"
        return None, [FieldError("quantization.load_in_8bit", msg, fix)], warnings
    if not (section.load_in_4bit or section.load_in_8bit):
        msg = (
            "accepted and ignored: neither load_in_4bit nor load_in_8bit is true, so nothing "
            "is quantized (AutoModel quantizes nothing then either)"
        )
        return None, [], [*warnings, FieldError("quantization", msg)]
    bits = 4 if section.load_in_4bit else 8
    errors = _layout_errors(out)
    if errors:
        return None, errors, warnings
    if accelerator != "cuda":
        msg = (
            f"QLoRA on {accelerator}: the base's linear weights take {bits} bits each, but "
            "bitsandbytes' CPU backend dequantizes each one on every forward, so a step takes "
            "longer than LoRA over the unquantized base"
        )
        warnings.append(FieldError("quantization", msg))
    typed = Quantization(
        bits=bits,
        quant_type=section.bnb_4bit_quant_type,
        compute_dtype=section.bnb_4bit_compute_dtype,
        double_quant=section.bnb_4bit_use_double_quant,
        quant_storage=section.bnb_4bit_quant_storage,
        int8_threshold=section.llm_int8_threshold,
    )
    return asdict(typed), [], warnings
