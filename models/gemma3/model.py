"""Native `Gemma3ForCausalLM` (text only, `Gemma3TextConfig`): Gemma 2's stack, two changes.

Each attention normalises q and k per head (Gemma RMSNorm, 1 + weight) before RoPE, and
each layer type has its own RoPE: `rope_parameters["sliding_attention"]` (the local base,
10k in released checkpoints, which older configs spelled `rope_local_base_freq`) and
`rope_parameters["full_attention"]` (the global base, linear scaling on the larger
models). Attention runs SDPA; a set `attn_logit_softcapping` is refused (transformers'
Gemma 3 never applies it, so such configs load with Hugging Face), while the final logits
are soft-capped when `final_logit_softcapping` is set. Every released text checkpoint is
tied: TIED_ONLY. The multimodal `Gemma3ForConditionalGeneration` (model type "gemma3") has
no registry row and loads with Hugging Face.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from models.common.rope import RotaryEmbedding, rope_unsupported_reason
from models.gemma2.model import LAYER_TYPES, Gemma2ForCausalLM, GemmaBackbone


class _LayerTypeRope:
    """The config seen by one layer type's RoPE: its own `rope_parameters`, else the config's."""

    def __init__(self, config: Any, layer_type: str) -> None:
        self._config = config
        self.rope_parameters = dict(config.rope_parameters[layer_type])

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_config":  # copy/pickle probe before __init__
            raise AttributeError(name)
        return getattr(self._config, name)


def layer_type_rope_configs(config: Any) -> dict[str, Any]:
    return {layer_type: _LayerTypeRope(config, layer_type) for layer_type in LAYER_TYPES}


class Gemma3Backbone(GemmaBackbone):
    qk_norm = True

    def build_rotary(self, config: Any) -> nn.Module:
        """A RoPE per layer type (`rotary_emb.sliding_attention`, `rotary_emb.full_attention`)."""
        views = layer_type_rope_configs(config)
        return nn.ModuleDict({name: RotaryEmbedding(view) for name, view in views.items()})

    def position_embeddings(
        self, hidden: torch.Tensor, position_ids: torch.Tensor
    ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return {name: rope(hidden, position_ids) for name, rope in self.rotary_emb.items()}


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    architecture = "Gemma3ForCausalLM"
    backbone_class = Gemma3Backbone

    @classmethod
    def unsupported_reason(cls, config: Any) -> str | None:
        if getattr(config, "attn_logit_softcapping", None):
            # transformers' Gemma 3 attention never applies this field; native does not guess.
            return "attn_logit_softcapping (transformers' Gemma 3 ignores it)"
        return super().unsupported_reason(config)

    @classmethod
    def rope_unsupported_reason(cls, config: Any) -> str | None:
        params = getattr(config, "rope_parameters", None) or {}
        if set(LAYER_TYPES) - set(params):
            return f"rope_parameters without an entry per layer type {LAYER_TYPES}"
        for name, view in layer_type_rope_configs(config).items():
            reason = rope_unsupported_reason(view)
            if reason:
                return f"{name}: {reason}"
        return None


ModelClass = Gemma3ForCausalLM
