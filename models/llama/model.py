"""Native `LlamaForCausalLM`: the shared decoder stack with Llama's options.

Grouped-query attention (optional `attention_bias` on all four projections), SwiGLU MLP
(optional `mlp_bias`), RMSNorm, and RoPE with default, linear, llama3 or YaRN scaling.
Parameter names and layouts equal the Hugging Face checkpoint's, so no state-dict adapter
is needed. Tied embeddings: both (Llama 3.2 1B/3B are tied, the rest untied).
"""

from __future__ import annotations

from typing import Any

from models.common.causal_lm import NativeCausalLM
from models.common.layers import DecoderModel
from models.common.tie import reject_unsupported_tie_word_embeddings


class LlamaForCausalLM(NativeCausalLM):
    architecture = "LlamaForCausalLM"

    def __init__(self, config: Any) -> None:
        reject_unsupported_tie_word_embeddings(type(self), config)
        super().__init__(config, DecoderModel(config))


ModelClass = LlamaForCausalLM
