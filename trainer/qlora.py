"""QLoRA: the loaded model's linear layers quantized by bitsandbytes before PEFT wraps them.

Each `nn.Linear` except the output head (and anything sharing the input embedding's
weight) becomes bitsandbytes' `Linear4bit` (nf4 or fp4, optionally double-quantized, the
recipe's compute and storage dtypes) or `Linear8bitLt`, holding the weight it had, frozen.
The weight is quantized when the layer moves to the run's device, as bitsandbytes does it.
The model is then marked `is_loaded_in_4bit` / `is_loaded_in_8bit`, as transformers marks
a model it loads quantized, so that PEFT wraps these layers with its bitsandbytes LoRA
layers. The quantized weights stay whole on every rank: `quantized_params` lists them for
FSDP2's `ignored_params` (frozen, nothing to gather or reduce).

The recipe's `quantization:` section is checked at submit (`jobs.recipe.sections.quantization`).
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from jobs.recipe.sections.quantization import Quantization
from trainer.errors import data_error

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_STORAGE = {**_DTYPES, "uint8": torch.uint8}


def _kept_whole(model: nn.Module) -> set[int]:
    """The output head and any linear layer tied to the input embedding (by weight)."""
    kept: set[int] = set()
    for get in ("get_output_embeddings", "get_input_embeddings"):
        module = getattr(model, get, lambda: None)()
        if module is not None:
            kept.add(id(module.weight))
    return kept


def _quantized_layer(linear: nn.Linear, config: Quantization) -> nn.Module:
    import bitsandbytes as bnb

    bias = linear.bias is not None
    if config.bits == 4:
        layer = bnb.nn.Linear4bit(
            linear.in_features,
            linear.out_features,
            bias=bias,
            compute_dtype=_DTYPES[config.compute_dtype],
            compress_statistics=config.double_quant,
            quant_type=config.quant_type,
            quant_storage=_STORAGE[config.quant_storage],
            device="meta",
        )
        # On a CPU with AVX512-BF16, bitsandbytes repacks the weight for its inference kernel
        # at the first no-grad eval forward, for good: the training steps after the first
        # validation (or after a resume's probe) would then run another kernel than before.
        layer.support_avx512bf16_for_cpu = False
        layer.weight = bnb.nn.Params4bit(
            linear.weight.data,
            requires_grad=False,
            compress_statistics=config.double_quant,
            quant_type=config.quant_type,
            quant_storage=_STORAGE[config.quant_storage],
            module=layer,
        )
    else:
        layer = bnb.nn.Linear8bitLt(
            linear.in_features,
            linear.out_features,
            bias=bias,
            has_fp16_weights=False,
            threshold=config.int8_threshold,
            device="meta",
        )
        layer.weight = bnb.nn.Int8Params(
            linear.weight.data, requires_grad=False, has_fp16_weights=False
        )
    if bias:
        layer.bias = nn.Parameter(linear.bias.data, requires_grad=False)
    return layer


def quantize_model(model: nn.Module, config: Quantization, device: torch.device) -> nn.Module:
    """Replace the linear layers in place (module docstring); each quantizes on `device`."""
    kept = _kept_whole(model)
    targets = [
        (name, module)
        for name, module in model.named_modules()
        if type(module) is nn.Linear and id(module.weight) not in kept
    ]
    if not targets:
        raise data_error(
            "quantization: the model has no linear layers to quantize",
            "remove the quantization section (LoRA then trains over the unquantized base)",
        )
    for name, linear in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, _quantized_layer(linear, config).to(device))
    setattr(model, f"is_loaded_in_{config.bits}bit", True)
    print(
        f"quantization: {len(targets)} linear layers hold {config.bits}-bit weights "
        f"({config.quant_type if config.bits == 4 else 'int8'}, bitsandbytes)",
        file=sys.stderr,
    )
    return model


def quantized_params(model: nn.Module) -> set[nn.Parameter]:
    """The bitsandbytes weights of a quantized model (empty for any other model)."""
    bnb = sys.modules.get("bitsandbytes")  # quantize_model imported it, if it ran
    if bnb is None:
        return set()
    kinds = (bnb.nn.Params4bit, bnb.nn.Int8Params)
    return {p for p in model.parameters() if isinstance(p, kinds)}
