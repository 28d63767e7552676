"""Configs a family's native class hands to the Hugging Face class, known without torch.

Where a family's tensor-parallel plan shards only its native class (DeepSeek-V3's latent
attention), a config that falls back to the Hugging Face class cannot run the `tp_size` its
architecture's registry row allows. Validation refuses those at submit with the reason; the
rules here mirror the native class's `unsupported_reason` (a test compares the two on the
same configs, so they cannot drift apart).
"""

from __future__ import annotations

from typing import Any

from jobs.recipe.errors import shown


def _deepseek_v3_reason(config: dict[str, Any]) -> str | None:
    heads = config.get("num_attention_heads")
    if config.get("quantization_config"):
        return "quantized checkpoints (quantization_config)"
    if config.get("scoring_func", "sigmoid") != "sigmoid":
        return f"scoring_func {shown(config.get('scoring_func'))} (native routes with sigmoid)"
    if config.get("topk_method", "noaux_tc") not in ("noaux_tc", None):
        return f"topk_method {shown(config.get('topk_method'))} (native uses noaux_tc)"
    if config.get("num_key_value_heads", heads) != heads:
        return "num_key_value_heads != num_attention_heads (latent attention expands all heads)"
    experts, groups = config.get("n_routed_experts") or 0, config.get("n_group") or 0
    if not (config.get("n_shared_experts") or 0) >= 1:
        return "n_shared_experts < 1 (native MoE layers always have shared experts)"
    if not groups or experts % groups or experts // groups < 2:
        return f"n_routed_experts {experts} must split into n_group {groups} groups of >= 2"
    topk_group = config.get("topk_group") or 0
    if not 1 <= topk_group <= groups:
        return f"topk_group {topk_group} must be in 1..n_group {groups}"
    if (config.get("num_experts_per_tok") or 0) > topk_group * (experts // groups):
        return "num_experts_per_tok exceeds the experts of the topk_group chosen groups"
    return None


# Architecture -> why a config of it loads with the Hugging Face class (None: native).
NATIVE_ONLY_TP = {"DeepseekV3ForCausalLM": _deepseek_v3_reason}


def hf_fallback_reason(architecture: str, config: dict[str, Any]) -> str | None:
    rule = NATIVE_ONLY_TP.get(architecture)
    return rule(config) if rule else None
