"""Native `Qwen3MoeForCausalLM`: Qwen3 attention (q/k norm) with sparse MoE MLPs.

Layer i is sparse when it is not in `mlp_only_layers` and (i + 1) % `decoder_sparse_step`
== 0; other layers use the dense SwiGLU MLP. The router stays fp32
(`_keep_in_fp32_modules_strict`). Weights convert through `GroupedExpertsStateDictAdapter`.
With `output_router_logits: true` the loss adds `router_aux_loss_coef` x the Switch
load-balancing loss, as transformers does. `use_sliding_window` windows every layer, as
transformers does. Every released Qwen3-MoE checkpoint is untied,
so the class is UNTIED_ONLY.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from models.common.causal_lm import NativeCausalLM
from models.common.layers import DecoderModel, dense_mlp
from models.common.moe.layers import SparseMoeBlock
from models.common.moe.load_balancing import RouterAuxLossMixin
from models.common.tie import reject_unsupported_tie_word_embeddings


def is_sparse_layer(config: Any, layer_idx: int) -> bool:
    step = getattr(config, "decoder_sparse_step", 1) or 1
    return (
        layer_idx not in (getattr(config, "mlp_only_layers", None) or [])
        and config.num_experts > 0
        and (layer_idx + 1) % step == 0
    )


def moe_mlp(config: Any, layer_idx: int) -> nn.Module:
    return SparseMoeBlock(config) if is_sparse_layer(config, layer_idx) else dense_mlp(config, 0)


class Qwen3MoeForCausalLM(RouterAuxLossMixin, NativeCausalLM):
    architecture = "Qwen3MoeForCausalLM"
    _tied_weights_keys: dict[str, str] = {}
    _keep_in_fp32_modules_strict = ["mlp.gate"]

    def __init__(self, config: Any) -> None:
        reject_unsupported_tie_word_embeddings(type(self), config)
        super().__init__(config, DecoderModel(config, mlp_factory=moe_mlp, qk_norm=True))


ModelClass = Qwen3MoeForCausalLM
