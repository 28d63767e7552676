"""The `quantization:` section: AutoModel's QLoRA (bitsandbytes 4- or 8-bit base weights).

AutoModel builds a `transformers.BitsAndBytesConfig` from this section when
`load_in_4bit` or `load_in_8bit` is true, and loads the base weights quantized under the
LoRA adapters; with neither set it quantizes nothing. tuneyard's model loader and trainer
load base weights in the model's dtype only: bitsandbytes' quantized linear layers are not
wired (nor proven on a GPU), so a section that asks for quantization is refused at submit
with the reason, on a CPU job first of all because bitsandbytes' kernels need CUDA. A
section that asks for none is accepted with a warning, as AutoModel ignores it then.
"""

from __future__ import annotations

from typing import Any

from jobs.recipe.errors import FieldError, shown

BITS = ("load_in_4bit", "load_in_8bit")
REMOVE = (
    "remove the quantization section: LoRA then trains over base weights in the model's "
    "dtype (bf16 weights take about 4x the memory of 4-bit ones)"
)


def _asked_bits(section: dict[str, Any]) -> tuple[str | None, list[FieldError]]:
    """The bit-width key the section sets true, or errors for one that is not a bool."""
    errors = [
        FieldError(
            f"quantization.{key}",
            f"must be true or false, got {shown(section[key])}",
            f"set quantization.{key}: true or false",
        )
        for key in BITS
        if key in section and not isinstance(section[key], bool)
    ]
    asked = next((key for key in BITS if section.get(key) is True), None)
    return asked, errors


def check_quantization(
    data: dict[str, Any], accelerator: str
) -> tuple[list[FieldError], list[FieldError]]:
    """Pop `quantization` from the raw recipe: (errors, warnings)."""
    if "quantization" not in data:
        return [], []
    section = data.pop("quantization")
    if not isinstance(section, dict):
        msg = f"must be a mapping such as {{load_in_4bit: true}}, got {shown(section)}"
        return [FieldError("quantization", msg, REMOVE)], []
    asked, errors = _asked_bits(section)
    if errors:
        return errors, []
    if asked is None:
        msg = (
            "accepted and ignored: neither load_in_4bit nor load_in_8bit is true, so nothing "
            "is quantized (AutoModel quantizes nothing then either)"
        )
        return [], [FieldError("quantization", msg)]
    bits = "4-bit" if asked == "load_in_4bit" else "8-bit"
    if accelerator != "cuda":
        msg = (
            f"QLoRA ({bits} base weights through bitsandbytes) needs a CUDA accelerator: "
            f"bitsandbytes' quantized kernels run on CUDA only, and the job has {accelerator}"
        )
        return [FieldError(f"quantization.{asked}", msg, REMOVE)], []
    msg = (
        f"QLoRA ({bits} base weights) needs bitsandbytes' quantized linear layers in "
        "tuneyard's model loader and trainer, which are not available: tuneyard loads base "
        "weights in the model's dtype only (QLoRA is not supported by tuneyard's trainer yet)"
    )
    return [FieldError(f"quantization.{asked}", msg, REMOVE)], []
