"""Native `Qwen2ForCausalLM`: the Llama stack with bias on q, k and v (not on o).

Qwen2 configs carry no `attention_bias` field: the q/k/v bias is part of the architecture,
so the attention is built with `qkv_bias=True`. Sliding-window layers
(`use_sliding_window`: layers from `max_window_layers` on) run natively with masked SDPA.
Tied embeddings: both (Qwen2 0.5B/1.5B are tied, larger ones untied).
"""

from __future__ import annotations

from typing import Any

from models.common.causal_lm import NativeCausalLM
from models.common.layers import DecoderModel
from models.common.tie import reject_unsupported_tie_word_embeddings


class Qwen2ForCausalLM(NativeCausalLM):
    architecture = "Qwen2ForCausalLM"

    def __init__(self, config: Any) -> None:
        reject_unsupported_tie_word_embeddings(type(self), config)
        super().__init__(config, DecoderModel(config, qkv_bias=True))


ModelClass = Qwen2ForCausalLM
