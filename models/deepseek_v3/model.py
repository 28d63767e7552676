"""Native `DeepseekV3ForCausalLM` (DeepSeek-V3, Moonlight): MLA attention, dense then MoE layers.

The stack is the common decoder (`models.common.layers.DecoderModel`: embeddings, pre-norm
blocks, final norm, RoPE over `qk_rope_head_dim`) with two swaps: every layer's attention
is `MLAttention`, and layers from `first_k_dense_replace` on hold `DeepseekV3MoE`. The
router (`mlp.gate`, weight and `e_score_correction_bias`) stays fp32 in any model dtype
(`_keep_in_fp32_modules_strict`). The correction bias is a persistent buffer, so it is
loaded, saved and checkpointed like a weight but never trained (LoRA leaves it as loaded).
Checkpoints' multi-token-prediction layers (`model.layers.{num_hidden_layers + i}`, for
`num_mtp_layers`) are skipped on load, as transformers does, and not written back. What
the native class cannot run (FP8-quantised checkpoints, softmax-scored DeepSeek-V2-style
routers, key/value head counts other than the head count, ...) falls back to transformers
through `unsupported_reason`. Every released checkpoint is untied: UNTIED_ONLY.

Nothing couples layers but the hidden states, so pipeline stages split the stack anywhere
(`models.common.pipeline_split`): no router auxiliary loss is computed (a config's
`aux_loss_alpha` / `seq_aux` are not read, as in transformers), the correction bias is
never updated from routing counts, and the MTP layers are not built.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import torch

from models.common.causal_lm import NativeCausalLM
from models.common.layers import DecoderModel
from models.common.tie import reject_unsupported_tie_word_embeddings
from models.deepseek_v3.layers import MLAttention, deepseek_mlp

_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.")


class DeepseekV3Model(DecoderModel):
    """The common decoder stack with multi-head latent attention in every layer."""

    def __init__(self, config: Any) -> None:
        super().__init__(config, mlp_factory=deepseek_mlp)
        for layer in self.layers:
            # The common layer builds grouped-query attention; DeepSeek's is latent
            # attention. The loaders build on the meta device, where the discarded
            # module allocates nothing.
            layer.self_attn = MLAttention(config)


class DeepseekV3ForCausalLM(NativeCausalLM):
    architecture = "DeepseekV3ForCausalLM"
    _tied_weights_keys: dict[str, str] = {}
    _keep_in_fp32_modules_strict = ["mlp.gate"]

    def __init__(self, config: Any) -> None:
        reject_unsupported_tie_word_embeddings(type(self), config)
        super().__init__(config, DeepseekV3Model(config))

    @classmethod
    def unsupported_reason(cls, config: Any) -> str | None:
        """Why this class cannot run the config natively (None when it can)."""
        reason = super().unsupported_reason(config)
        if reason:
            return reason
        if getattr(config, "quantization_config", None):
            return "quantized checkpoints (quantization_config)"
        if getattr(config, "scoring_func", "sigmoid") != "sigmoid":
            return f"scoring_func {config.scoring_func!r} (native routes with sigmoid)"
        if getattr(config, "topk_method", "noaux_tc") not in ("noaux_tc", None):
            return f"topk_method {config.topk_method!r} (native uses noaux_tc)"
        if config.num_key_value_heads != config.num_attention_heads:
            return "num_key_value_heads != num_attention_heads (latent attention expands all heads)"
        if getattr(config, "head_dim", config.qk_rope_head_dim) != config.qk_rope_head_dim:
            return "head_dim != qk_rope_head_dim"
        return _router_unsupported_reason(config)

    # --- the correction bias is a buffer: load and save it with the parameters --------
    def _persistent_buffers(self) -> dict[str, torch.Tensor]:
        skipped = {
            f"{name}.{b}" if name else b
            for name, module in self.named_modules()
            for b in module._non_persistent_buffers_set
        }
        return {n: b for n, b in self.named_buffers() if n not in skipped}

    def hf_load_targets(self) -> dict[str, torch.Tensor]:
        return {**super().hf_load_targets(), **self._persistent_buffers()}

    def hf_state_items(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield from super().hf_state_items()
        yield from self._persistent_buffers().items()

    def _ignorable(self, key: str) -> bool:
        """Also skip the checkpoint's multi-token-prediction layers (not run natively)."""
        match = _LAYER_KEY.match(key)
        if match:
            first = self.config.num_hidden_layers
            mtp = int(getattr(self.config, "num_mtp_layers", 0) or 0)
            if first <= int(match[1]) < first + mtp:
                return True
        return super()._ignorable(key)


def _router_unsupported_reason(config: Any) -> str | None:
    """Router and expert shapes transformers' DeepSeek-V3 router also needs."""
    if not (config.n_shared_experts or 0) >= 1:
        return "n_shared_experts < 1 (native MoE layers always have shared experts)"
    experts, groups = config.n_routed_experts, config.n_group
    if not groups or experts % groups or experts // groups < 2:
        return f"n_routed_experts {experts} must split into n_group {groups} groups of >= 2"
    if not 1 <= (config.topk_group or 0) <= groups:
        return f"topk_group {config.topk_group} must be in 1..n_group {groups}"
    if config.num_experts_per_tok > config.topk_group * (experts // groups):
        return "num_experts_per_tok exceeds the experts of the topk_group chosen groups"
    return None


ModelClass = DeepseekV3ForCausalLM
