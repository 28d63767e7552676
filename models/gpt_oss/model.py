"""Native `GptOssForCausalLM`: sink attention, alternating sliding/full layers, biased MoE.

The backbone is the common `DecoderModel` (embeddings, pre-norm blocks, YaRN rotary
embedding, per-layer sliding-window masks from `layer_types` and `sliding_window`) with
gpt-oss's pieces swapped in: `GptOssAttention` (per-head sinks, eager softmax),
`GptOssMoeBlock` in every layer, and `GptOssRMSNorm`. The attention sinks and the router
stay fp32 (`_keep_in_fp32_modules_strict`). Weights convert through
`GptOssStateDictAdapter` (the grouped expert projections are transposed). With
`output_router_logits: true` the loss adds `router_aux_loss_coef` x the Switch
load-balancing loss, as transformers does. The released checkpoints are untied, so the
class is UNTIED_ONLY; MXFP4-quantized checkpoints (a `quantization_config`) load with the
Hugging Face class.
"""

from __future__ import annotations

from typing import Any

from models.common.causal_lm import NativeCausalLM
from models.common.layers import DecoderModel
from models.common.moe.load_balancing import RouterAuxLossMixin
from models.common.tie import reject_unsupported_tie_word_embeddings
from models.gpt_oss.layers import GptOssAttention, GptOssMoeBlock, GptOssRMSNorm

_LAYER_TYPES = ("sliding_attention", "full_attention")


class GptOssModel(DecoderModel):
    """The common decoder stack with gpt-oss attention, MoE blocks and norms."""

    def __init__(self, config: Any) -> None:
        super().__init__(config, mlp_factory=lambda cfg, _i: GptOssMoeBlock(cfg))
        eps = config.rms_norm_eps
        for layer in self.layers:
            layer.self_attn = GptOssAttention(config)
            layer.input_layernorm = GptOssRMSNorm(config.hidden_size, eps=eps)
            layer.post_attention_layernorm = GptOssRMSNorm(config.hidden_size, eps=eps)
        self.norm = GptOssRMSNorm(config.hidden_size, eps=eps)


class GptOssForCausalLM(RouterAuxLossMixin, NativeCausalLM):
    architecture = "GptOssForCausalLM"
    _tied_weights_keys: dict[str, str] = {}
    _keep_in_fp32_modules_strict = ["self_attn.sinks", "mlp.router"]

    def __init__(self, config: Any) -> None:
        reject_unsupported_tie_word_embeddings(type(self), config)
        super().__init__(config, GptOssModel(config))

    @classmethod
    def unsupported_reason(cls, config: Any) -> str | None:
        reason = super().unsupported_reason(config)
        if reason:
            return reason
        if getattr(config, "quantization_config", None):
            return "quantized (MXFP4) checkpoint; dequantize it to bf16 first"
        unknown = set(getattr(config, "layer_types", None) or []) - set(_LAYER_TYPES)
        if unknown:
            return f"layer_types {sorted(unknown)} (native runs {', '.join(_LAYER_TYPES)})"
        return None


ModelClass = GptOssForCausalLM
