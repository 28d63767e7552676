"""Native `Gemma2ForCausalLM`: sandwich-norm GeGLU blocks, local/global attention, soft-caps.

`layer_types` alternates "sliding_attention" (a `sliding_window`-token window) and
"full_attention" layers; attention scores and the final logits are tanh soft-capped when
`attn_logit_softcapping` / `final_logit_softcapping` are set (capped attention runs the
eager path, see `layers.py`). One RoPE serves every layer. `GemmaBackbone` is shared with
Gemma 3, which only changes its RoPE (one per layer type) and adds q/k norms. Parameter
names equal the Hugging Face checkpoint's, so no state-dict adapter. Every released Gemma 2
checkpoint ties lm_head to the embeddings: the class is TIED_ONLY. No parameter needs fp32
storage: the norms compute in fp32 from their stored dtype, as transformers does.
Bidirectional attention (embedding variants) is not native and loads with Hugging Face.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from models.common.causal_lm import NativeCausalLM
from models.common.layers import layer_attention_masks
from models.common.rope import RotaryEmbedding
from models.common.tie import reject_unsupported_tie_word_embeddings
from models.gemma2.layers import (
    GEMMA_ACTIVATIONS,
    GemmaDecoderLayer,
    GemmaRMSNorm,
    ScaledEmbedding,
)

LAYER_TYPES = ("sliding_attention", "full_attention")


class GemmaBackbone(nn.Module):
    """Scaled embeddings, sandwich-norm layers and the final norm (the `model.` part)."""

    qk_norm = False

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.embed_tokens = ScaledEmbedding(
            config.vocab_size, config.hidden_size, config.pad_token_id
        )
        self.layers = nn.ModuleList(
            GemmaDecoderLayer(config, i, qk_norm=self.qk_norm)
            for i in range(config.num_hidden_layers)
        )
        self.norm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = self.build_rotary(config)

    def build_rotary(self, config: Any) -> nn.Module:
        """One RoPE for all layers (Gemma 3 builds one per layer type)."""
        return RotaryEmbedding(config)

    def position_embeddings(
        self, hidden: torch.Tensor, position_ids: torch.Tensor
    ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """(cos, sin) per layer type."""
        cos_sin = self.rotary_emb(hidden, position_ids)
        return dict.fromkeys(LAYER_TYPES, cos_sin)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids or inputs_embeds")
        hidden = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        batch, seq = hidden.shape[:2]
        masks = layer_attention_masks(self.layers, attention_mask, position_ids, hidden)
        if position_ids is None:
            position_ids = torch.arange(seq, device=hidden.device).unsqueeze(0).expand(batch, -1)
        rope = self.position_embeddings(hidden, position_ids)
        for layer, mask in zip(self.layers, masks, strict=True):
            hidden = layer(hidden, position_embeddings=rope[layer.layer_type], attention_mask=mask)
        return self.norm(hidden)


class Gemma2ForCausalLM(NativeCausalLM):
    architecture = "Gemma2ForCausalLM"
    _keep_in_fp32_modules_strict: list[str] = []
    backbone_class: type[GemmaBackbone] = GemmaBackbone

    def __init__(self, config: Any) -> None:
        reject_unsupported_tie_word_embeddings(type(self), config)
        super().__init__(config, self.backbone_class(config))

    @classmethod
    def unsupported_reason(cls, config: Any) -> str | None:
        """Why the config cannot run natively: unknown layer types, activations, RoPE."""
        layer_types = list(getattr(config, "layer_types", None) or [])
        if len(layer_types) != config.num_hidden_layers or set(layer_types) - set(LAYER_TYPES):
            return f"layer_types {layer_types} (native runs {', '.join(LAYER_TYPES)})"
        if "sliding_attention" in layer_types and not getattr(config, "sliding_window", None):
            return "sliding_attention layers without a sliding_window"
        if getattr(config, "use_bidirectional_attention", False):
            return "bidirectional attention (use_bidirectional_attention)"
        activation = getattr(config, "hidden_activation", None) or "gelu_pytorch_tanh"
        if activation not in GEMMA_ACTIVATIONS:
            return f"hidden_activation {activation!r}"
        if config.num_attention_heads % (config.num_key_value_heads or 1):
            return "num_attention_heads is not a multiple of num_key_value_heads"
        return cls.rope_unsupported_reason(config)

    def final_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits tanh soft-capped (`final_logit_softcapping`), before the loss."""
        cap = getattr(self.config, "final_logit_softcapping", None)
        return torch.tanh(logits / cap) * cap if cap else logits


ModelClass = Gemma2ForCausalLM
