"""Phi-3 LoRA adapters in transformers' layout: split-projection adapters fused exactly.

Native Phi-3 trains LoRA on `q_proj`/`k_proj`/`v_proj` and `gate_proj`/`up_proj`;
transformers' Phi-3 has only `qkv_proj` and `gate_up_proj`. A fused projection's update is
the parts' updates stacked by rows: [B_q A_q; B_k A_k; B_v A_v] = blockdiag(B_q, B_k, B_v)
@ cat(A_q, A_k, A_v). So the fused adapter has rank n*r (n = the parts) with A the parts'
A matrices stacked, B block-diagonal (zero rows for a part that was not adapted, which
then stays untouched), and `lora_alpha` n*alpha so that alpha / rank, the scale applied
to B A, is unchanged. The adapter config names every adapted module by its full path, so
PEFT adapts exactly those. DoRA's per-output-row magnitudes stack the same way, but a part
left unadapted would need its weight's row norms, so DoRA must adapt every part or none.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import torch

from models.phi3.state_dict_adapter import FusedMappingError, hf_key_of, part_rows

_LORA_KEY = re.compile(
    r"^(?P<module>.*\.(?P<part>q_proj|k_proj|v_proj|gate_proj|up_proj))"
    r"\.(?P<kind>lora_A\.weight|lora_B\.weight|lora_magnitude_vector)$"
)
_ANY_LORA_KEY = re.compile(
    r"^(?P<module>.*)\.(lora_A\.weight|lora_B\.weight|lora_magnitude_vector)$"
)


def _fused_name(module: str) -> str:
    return hf_key_of(f"{module}.weight").removesuffix(".weight")


def _grouped(state: dict[str, torch.Tensor]) -> dict[str, dict[str, dict[str, torch.Tensor]]]:
    """Fused module -> part -> {lora_A.weight, lora_B.weight[, lora_magnitude_vector]}."""
    groups: dict[str, dict[str, dict[str, torch.Tensor]]] = {}
    for key, tensor in state.items():
        match = _LORA_KEY.match(key)
        if match:
            parts = groups.setdefault(_fused_name(match["module"]), {})
            parts.setdefault(match["part"], {})[match["kind"]] = tensor
    return groups


def _fuse_group(
    fused: str, parts: dict[str, dict[str, torch.Tensor]], rows: dict[str, int], rank: int
) -> dict[str, torch.Tensor]:
    """The fused module's adapter tensors from its adapted parts (rows: every part's)."""
    adapted = [p for p in rows if p in parts]
    dora = any("lora_magnitude_vector" in parts[p] for p in adapted)
    if dora and len(adapted) != len(rows):
        raise FusedMappingError(
            f"{fused}: DoRA adapted {adapted} only; fusing needs every part of {list(rows)} "
            "(an unadapted part's magnitude is its weight's row norms)"
        )
    a = torch.cat([parts[p]["lora_A.weight"] for p in adapted])
    b = a.new_zeros(sum(rows.values()), rank * len(adapted))
    row = 0
    for part, count in rows.items():
        if part in parts:
            col = adapted.index(part) * rank
            b[row : row + count, col : col + rank] = parts[part]["lora_B.weight"]
        row += count
    out = {f"{fused}.lora_A.weight": a, f"{fused}.lora_B.weight": b}
    if dora:
        magnitudes = [parts[p]["lora_magnitude_vector"] for p in adapted]
        out[f"{fused}.lora_magnitude_vector"] = torch.cat(magnitudes)
    return out


def _target_modules(state: dict[str, torch.Tensor], prefix: str) -> list[str]:
    """Every adapted module's path below the PEFT wrapper ("model.layers.0.self_attn...")."""
    modules = {m["module"] for key in state if (m := _ANY_LORA_KEY.match(key))}
    return sorted(m.removeprefix(prefix) for m in modules)


def lora_to_hf(
    state: dict[str, torch.Tensor], peft_config: Any, config: Any
) -> tuple[dict[str, torch.Tensor], Any]:
    """(adapter tensors, adapter config) for transformers' fused Phi-3, as a copy."""
    if getattr(peft_config, "use_rslora", False):
        raise FusedMappingError("rsLoRA adapters cannot be fused (its scale is alpha/sqrt(r))")
    rank, alpha = int(peft_config.r), float(peft_config.lora_alpha)
    if peft_config.rank_pattern or peft_config.alpha_pattern:
        raise FusedMappingError("adapters with rank_pattern/alpha_pattern cannot be fused")
    out = {k: v for k, v in state.items() if not _LORA_KEY.match(k)}
    ranks, alphas = {}, {}
    for fused, parts in _grouped(state).items():
        rows = part_rows(config)[".".join(fused.split(".")[-2:])]
        out.update(_fuse_group(fused, parts, rows, rank))
        adapted = sum(1 for p in rows if p in parts)
        name = fused.removeprefix("base_model.model.")
        ranks[name], alphas[name] = rank * adapted, alpha * adapted
    fused_config = copy.copy(peft_config)
    fused_config.target_modules = _target_modules(out, "base_model.model.")
    fused_config.exclude_modules = None
    fused_config.rank_pattern, fused_config.alpha_pattern = ranks, alphas
    return out, fused_config
